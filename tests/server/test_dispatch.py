"""The server's wiring: built with no I/O and opened before it serves, and its dispatch table, a handler for exactly
the messages a worker or a trainer may send it after HELLO, and a rejection, counted, for any other."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import zmq

from netrl.config.load import config_from_dict
from netrl.errors import NetrlError
from netrl.launch import free_port
from netrl.protocol.messages import ALLOWED_FROM, Message, MsgType
from netrl.protocol.wire import decode, encode
from netrl.server.server import Server
from netrl.server.spool import Spool
from tests.conftest import running_server


def test_a_server_and_its_spool_are_built_without_touching_the_disk_and_open_creates_the_spool(
        tmp_path: Path) -> None:
    spool_dir = tmp_path / "spool"
    srv = Server(trainer_port=free_port(), worker_port=free_port(), spool_dir=spool_dir)
    configured = Server.from_config(config_from_dict({"security": "none", "weights_folder": str(tmp_path / "run")}))
    Spool(tmp_path / "bare", max_bytes=1 << 20)
    assert not list(tmp_path.iterdir())  # no folder, no lock file, no segment, no schema read or written
    try:
        srv.open()
        assert (spool_dir / "LOCK").is_file() and srv.spool.packets == 0
    finally:
        srv.close()
        configured.close()  # never opened: nothing to release
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spool"]

    (tmp_path / "a-file").write_text("not a folder")  # what construction would trip on if it read the folder
    broken = Server(trainer_port=free_port(), worker_port=free_port(), spool_dir=tmp_path / "a-file")
    with pytest.raises(NetrlError, match="a-file"):
        broken.open()
    broken.close()


def test_the_server_handles_exactly_the_messages_its_peers_may_send_after_hello(tmp_path: Path) -> None:
    srv = Server(spool_dir=tmp_path / "spool")
    sendable = (ALLOWED_FROM["worker"] | ALLOWED_FROM["trainer"]) - {MsgType.HELLO}  # HELLO comes before dispatch
    assert set(srv.handlers) == sendable
    srv.close()


def _peer(ctx: zmq.Context, port: int, role: str) -> zmq.Socket:
    """A DEALER that said HELLO as ``role`` and was welcomed."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"tcp://127.0.0.1:{port}")
    sock.send_multipart(encode(Message(MsgType.HELLO, role, body={"role": role, "netrl_version": "0.1.0",
                                                                 "worker_id": role, "session": os.urandom(4).hex()})))
    assert sock.poll(5000), f"no answer to the {role}'s HELLO"
    assert decode(sock.recv_multipart()).type is MsgType.WELCOME
    return sock


def _wait_for(what: str, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 5
    while not done() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert done(), f"no {what} within 5 s"


def test_a_message_without_a_handler_is_rejected_and_counted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "netrl.server")
    with running_server(spool_dir=tmp_path / "spool") as (srv, ctx):
        del srv.handlers[MsgType.CREDIT]  # a type a trainer may send that the server would not know what to do with
        trainer = _peer(ctx, srv.trainer_port, "trainer")
        trainer.send_multipart(encode(Message(MsgType.CREDIT, "trainer", body={"bundles": 5})))
        _wait_for("rejection", lambda: srv.stats["rejected"] == 1)
        # the count comes before the log line, from the server's thread
        _wait_for("its warning", lambda: "credit is not handled by the server" in caplog.text)
        assert srv.relay.credit == 0

        worker = _peer(ctx, srv.worker_port, "worker")  # and a type no peer may send: refused before dispatch
        worker.send_multipart(encode(Message(MsgType.STATUS, "worker")))
        _wait_for("second rejection", lambda: srv.stats["rejected"] == 2)
        assert "a worker may not send status messages" in caplog.text
