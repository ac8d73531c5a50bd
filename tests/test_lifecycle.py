"""Ctrl+C on a role's thread in a script: the first stops the role cleanly, a second interrupts."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator

import pytest

from netrl.lifecycle.runs import RunStop, ctrl_c_stops


@pytest.fixture(autouse=True)
def _pythons_own_sigint_handler() -> Iterator[None]:
    """A script's SIGINT handler, as Python sets it (a test before may have run the CLI in this process, which
    leaves its own)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def ctrl_c() -> None:
    os.kill(os.getpid(), signal.SIGINT)  # (Python runs the handler before os.kill returns)


def test_the_first_ctrl_c_stops_the_run_and_a_second_interrupts_it(caplog: pytest.LogCaptureFixture) -> None:
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # a script's: Python's own
    outer = threading.Event()
    stop = RunStop(outer)
    with ctrl_c_stops(stop, "trainer"):
        ctrl_c()  # no KeyboardInterrupt here: the run stops as its stop event says
        assert stop.is_set() and not outer.is_set()  # other roles watching the script's event go on
        with pytest.raises(KeyboardInterrupt):
            ctrl_c()
    assert "Ctrl+C: stopping the trainer cleanly (Ctrl+C again to interrupt it at once)" in caplog.text
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # given back once the run is over
    with pytest.raises(KeyboardInterrupt):
        ctrl_c()


def test_a_handler_of_the_scripts_own_and_other_threads_are_left_alone() -> None:
    calls: list[int] = []
    mine = signal.signal(signal.SIGINT, lambda signum, frame: calls.append(signum))
    try:
        stop = RunStop(None)
        with ctrl_c_stops(stop, "worker"):
            ctrl_c()
        assert calls == [signal.SIGINT] and not stop.is_set()
    finally:
        signal.signal(signal.SIGINT, mine)
    seen: list[object] = []

    def on_a_thread() -> None:
        with ctrl_c_stops(RunStop(None), "server"):  # only the main thread may set a handler
            seen.append(signal.getsignal(signal.SIGINT))

    thread = threading.Thread(target=on_a_thread)
    thread.start()
    thread.join()
    assert seen == [signal.default_int_handler]
