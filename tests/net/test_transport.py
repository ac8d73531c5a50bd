"""Transport helpers: reconnect back-off, liveness, and bind errors that name the setting to change."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import msgpack
import pytest
import zmq

from netrl.config.sections import NetworkConfig
from netrl.errors import TransportError
from netrl.launch import free_port
from netrl.net.liveness import Backoff, Liveness
from netrl.net.sockets import bind, new_socket
from netrl.net.transport import ClientLink, new_session
from netrl.protocol.messages import Message, MsgType
from netrl.protocol.wire import PROTOCOL_VERSION, decode, encode
from tests.fakes import MakeServer


def drive(link: ClientLink, done: Callable[[], object], timeout: float) -> None:
    """What a role's network thread does with its link (receive, heartbeat, reconnect) until ``done()``, or for at
    most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        link.receive()
        link.maintain()
        time.sleep(0.01)


def test_backoff_doubles_with_jitter_up_to_the_maximum_and_resets() -> None:
    b = Backoff(0.25, 2.0)
    delays = [b.next() for _ in range(6)]
    for got, nominal in zip(delays, [0.25, 0.5, 1.0, 2.0, 2.0, 2.0], strict=True):
        assert 0.8 * nominal <= got <= 1.2 * nominal
    b.reset()
    assert b.next() <= 0.3


def test_liveness_expires_after_the_window_and_any_message_renews_it() -> None:
    live = Liveness(interval=0.05, liveness=3)
    assert not live.expired(time.monotonic())
    assert live.expired(time.monotonic() + 0.2)
    time.sleep(0.1)  # time passes on purpose: two thirds of the window age before a message renews it
    live.heard()
    assert not live.expired(time.monotonic()) and live.heartbeat_due(time.monotonic())
    live.sent()
    assert not live.heartbeat_due(time.monotonic())


def test_bind_failure_names_the_config_key() -> None:
    ctx = zmq.Context()
    try:
        first = new_socket(ctx, zmq.ROUTER, 1 << 20)
        port = first.bind_to_random_port("tcp://127.0.0.1")
        second = new_socket(ctx, zmq.ROUTER, 1 << 20)
        with pytest.raises(TransportError, match=r"could not bind .* is another netrl server running\? change "
                                                 r"`network.worker_port` \(or --worker-port\)"):
            bind(second, "127.0.0.1", port, "network.worker_port")
        with pytest.raises(TransportError, match=r"is 192.0.2.1 an address of this machine\? change `server.bind_ip` "
                                                 r"\(or --bind-ip\)"):
            bind(second, "192.0.2.1", free_port(), "network.worker_port")  # TEST-NET-1: never this machine's
        with pytest.raises(TransportError, match=r"change `server.status_port` \(or --status-port\)$"):
            bind(second, "127.0.0.1", port, "server.status_port", "server.status_port")
    finally:
        ctx.destroy(0)


def test_a_server_that_never_answers_is_reported_once_not_on_every_retry(caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()  # nothing listens there
    net = NetworkConfig(worker_port=port, heartbeat_interval_s=0.05, heartbeat_liveness=2, reconnect_initial_s=0.01,
                        reconnect_max_s=0.02)
    ctx = zmq.Context()
    link = ClientLink(ctx, net, "worker", "robot-1", new_session(), port)
    try:
        link.open()
        drive(link, lambda: link._unanswered >= 5, 1.5)
    finally:
        link.close()
        ctx.destroy(0)
    assert link._unanswered >= 5  # it kept trying
    said = [r.getMessage() for r in caplog.records if r.name == "netrl.net.transport"]
    assert len(said) == 1 and said[0].startswith(f"no answer from the server at tcp://127.0.0.1:{port}")
    assert "attempt 1)" in said[0] and not any("lost the server" in s for s in said)
    assert "is a netrl server running at 127.0.0.1 and reachable from here? check --server-ip, network.worker_port " \
           "(--worker-port)" in said[0]


def test_a_server_address_that_does_not_resolve_is_named(caplog: pytest.LogCaptureFixture) -> None:
    net = NetworkConfig(server_ip="no-such-host.invalid", heartbeat_interval_s=0.05, heartbeat_liveness=2)
    ctx = zmq.Context()
    link = ClientLink(ctx, net, "trainer", "trainer", new_session(), free_port())
    try:
        link.open()
        drive(link, lambda: link._unanswered, 3)
    finally:
        link.close()
        ctx.destroy(0)
    assert "'no-such-host.invalid' is not an address or a name this machine can resolve" in caplog.text
    assert "check --server-ip" in caplog.text


def test_a_command_after_the_network_thread_failed_raises_instead_of_blocking() -> None:
    from netrl.errors import NetrlError
    from netrl.net.thread import NetThread

    class Idle(NetThread):
        def on_message(self, msg: Message) -> None:
            pass

        def on_command(self, frames: list[object]) -> None:
            pass

    # config.json refuses such an address; a NetworkConfig built in code is not checked, and connect() fails
    thread = Idle(NetworkConfig(server_ip="not an ip"), "trainer", "t", new_session(), free_port())
    thread.start()
    thread.join(5)
    try:
        assert thread.error is not None and not thread.is_alive()
        with pytest.raises(NetrlError, match="trainer cannot continue: its network thread has stopped"):
            thread.command([b"weights"])  # the pipe has no reader left: a send would block forever
        thread.link.fatal = "replaced by another trainer"  # a REJECT from the server: the reason, not the symptom
        with pytest.raises(NetrlError, match=r"network thread has stopped \(replaced by another trainer\)"):
            thread.command([b"weights"])
    finally:
        thread.halt()


def test_a_link_that_never_falls_idle_still_reports_its_counters(make_server: MakeServer) -> None:
    net = NetworkConfig(heartbeat_interval_s=0.1, heartbeat_liveness=20)
    srv, ctx = make_server(network=net)
    link = ClientLink(ctx, net, "worker", "busy", new_session(), srv.worker_port)
    dropped = [0]
    link.heartbeat_body = lambda: {"stats": {"dropped_samples": dropped[0]}}
    try:
        link.open()
        drive(link, lambda: link.ready, 5)
        assert link.ready
        reports = []
        for step in range(60):  # 1.2 s of traffic every 20 ms: no heartbeat is ever due for idleness
            dropped[0] = step
            link._liveness.sent()
            link.receive()
            link.maintain()
            time.sleep(0.02)
            workers = srv.peers.workers()
            reports.append(workers[0].reported.get("dropped_samples") if workers else None)
    finally:
        link.close()
    seen = {r for r in reports if r is not None}
    assert len(seen) >= 5 and max(seen) >= 45, reports  # reported every interval, and current


def test_a_reject_reason_from_the_server_is_logged_on_one_line_and_shortened(caplog: pytest.LogCaptureFixture) -> None:
    ctx = zmq.Context()
    fake = ctx.socket(zmq.ROUTER)  # a server (compromised, or buggy) whose REJECT could forge log lines
    port = fake.bind_to_random_port("tcp://127.0.0.1")
    link = ClientLink(ctx, NetworkConfig(worker_port=port, heartbeat_interval_s=0.2), "worker", "robot-1",
                      new_session(), port)
    try:
        link.open()
        assert fake.poll(5000)
        identity, *_ = fake.recv_multipart()  # the HELLO
        reason = "no\n12:00:00.000 I [worker 1] netrl: forged line \x1b[31m" + "x" * 100_000
        fake.send_multipart([identity, *encode(Message(MsgType.REJECT, "server", body={"reason": reason}))])
        drive(link, lambda: link.fatal, 5)
    finally:
        link.close()
        fake.close(0)
        ctx.destroy(0)
    said = next(r.getMessage() for r in caplog.records if "refused this worker" in r.getMessage())
    assert "\n" not in said and "\x1b" not in said and len(said) < 700
    assert "no\\n12:00:00.000" in said and "\\x1b[31m" in said and f"({len(reason) - 500} more characters)" in said
    assert link.fatal and "\n" not in link.fatal


@pytest.mark.parametrize("theirs", [1, 2, PROTOCOL_VERSION + 1])  # 1, 2: a netrl from before versions 2 and 3
def test_a_server_of_another_protocol_version_stops_the_client_at_hello_with_what_to_install(
        caplog: pytest.LogCaptureFixture, theirs: int) -> None:
    ctx = zmq.Context()
    fake = ctx.socket(zmq.ROUTER)  # that netrl's server: it refuses our HELLO in its own version
    port = fake.bind_to_random_port("tcp://127.0.0.1")
    link = ClientLink(ctx, NetworkConfig(worker_port=port, heartbeat_interval_s=0.2), "worker", "robot-1",
                      new_session(), port)
    try:
        link.open()
        assert fake.poll(5000)
        identity, hello = fake.recv_multipart()
        assert msgpack.unpackb(hello)["v"] == PROTOCOL_VERSION
        body = {"reason": f"peer speaks netrl protocol {PROTOCOL_VERSION}, this process speaks protocol {theirs}"}
        if theirs > 1:  # a version-1 server's REJECT does not name its netrl version
            body["netrl_version"] = "9.9"
        reject = msgpack.unpackb(encode(Message(MsgType.REJECT, "server", body=body))[0])
        reject["v"] = theirs
        fake.send_multipart([identity, msgpack.packb(reject)])
        drive(link, lambda: link.fatal, 5)
    finally:
        link.close()
        fake.close(0)
        ctx.destroy(0)
    runs = "" if theirs == 1 else "peer runs netrl 9.9; "
    assert link.fatal == (f"peer speaks netrl protocol {theirs}, this process speaks protocol {PROTOCOL_VERSION}; "
                          f"{runs}install the same netrl version on the server and this worker")
    assert f"refused this worker: {link.fatal}" in caplog.text


def test_a_waiting_worker_hears_from_the_server_whether_a_trainer_is_connected(make_server: MakeServer) -> None:
    from types import SimpleNamespace

    from netrl.worker.link import WorkerLink
    from tests.fakes import Peer

    net = NetworkConfig(heartbeat_interval_s=0.05, heartbeat_liveness=40)
    srv, ctx = make_server(network=net)
    link = ClientLink(ctx, net, "worker", "robot-1", new_session(), srv.worker_port)

    def until(connected: int) -> None:
        drive(link, lambda: link.server_stats.get("trainer_connected") == connected, 5)
        assert link.server_stats.get("trainer_connected") == connected

    try:
        link.open()
        until(0)  # the trainer finished, or has not started: the worker's status line says so
        assert "no trainer is connected to the server" in WorkerLink._waiting(SimpleNamespace(link=link))  # type: ignore[arg-type]
        trainer = Peer(ctx, srv.trainer_port, "trainer", "trainer")
        assert trainer.hello().type is MsgType.WELCOME
        until(1)
        assert "no trainer" not in WorkerLink._waiting(SimpleNamespace(link=link))  # type: ignore[arg-type]
    finally:
        link.close()


def test_a_client_keeps_the_servers_heartbeat_pace_when_its_own_config_differs(
        caplog: pytest.LogCaptureFixture, make_server: MakeServer) -> None:
    client_net = NetworkConfig(heartbeat_interval_s=0.1, heartbeat_liveness=3, reconnect_initial_s=0.05,
                               reconnect_max_s=0.1)  # expects a message every 0.3 s; the server heartbeats every 1 s
    srv, ctx = make_server(network=NetworkConfig(heartbeat_interval_s=1.0))
    link = ClientLink(ctx, client_net, "worker", "robot-1", new_session(), srv.worker_port)
    link.open()
    try:
        drive(link, lambda: False, 2.5)
        assert link.ready and link._connections == 1  # never declared the server lost
    finally:
        link.close()
    assert "the server's network.heartbeat_interval_s is 1 s and this worker's is 0.1 s: using the server's" in (
        caplog.text)


def test_a_worker_a_full_server_refuses_tries_again_and_gets_in_once_a_place_frees(make_server: MakeServer) -> None:
    net = NetworkConfig(heartbeat_interval_s=0.1, heartbeat_liveness=3)
    srv, ctx = make_server(network=net, max_workers=1)
    dead = ClientLink(ctx, net, "worker", "robot-1", new_session(), srv.worker_port)
    dead.open()
    drive(dead, lambda: dead.ready, 3)
    dead._close_socket()  # its process died without BYE: the server holds its place for 0.3 s
    restarted = ClientLink(ctx, net, "worker", "robot-1", new_session(), srv.worker_port)
    restarted.open()
    try:
        drive(restarted, lambda: restarted.ready, 5)
        assert restarted.ready and restarted.fatal is None and srv.stats["refused_full"] >= 1
    finally:
        restarted.close()
        dead.close()


def test_a_restarted_server_that_rejects_every_message_in_flight_gets_one_hello(
        caplog: pytest.LogCaptureFixture) -> None:
    # After a server restart, each message the client sent before the new server heard its HELLO comes back as
    # "unknown peer"; answering each with a HELLO would make the server drop and re-admit the peer as often (and
    # the client log "reconnected" as often). A HELLO the server never answered is sent again, though.
    caplog.set_level(logging.INFO, logger="netrl.net.transport")
    ctx = zmq.Context()
    fake = ctx.socket(zmq.ROUTER)
    port = fake.bind_to_random_port("tcp://127.0.0.1")
    link = ClientLink(ctx, NetworkConfig(worker_port=port, heartbeat_interval_s=2.0), "worker", "robot-1",
                      new_session(), port)

    def welcome(identity: bytes) -> None:
        fake.send_multipart([identity, *encode(Message(MsgType.WELCOME, "server", body={
            "server_session": new_session(), "heartbeat_interval_s": 2.0}))])

    def reject(identity: bytes) -> None:
        fake.send_multipart([identity, *encode(Message(MsgType.REJECT, "server",
                                                       body={"reason": "unknown peer: say HELLO"}))])

    def received(heartbeats: bool = False) -> list[MsgType]:
        got = []
        while fake.poll(300):
            got.append(decode(fake.recv_multipart()[1:]).type)
        return [t for t in got if heartbeats or t is not MsgType.HEARTBEAT]

    try:
        link.open()
        assert fake.poll(5000)
        identity = fake.recv_multipart()[0]
        welcome(identity)
        drive(link, lambda: link.ready, 5)
        for _ in range(4):  # what a worker sent while the server was down and coming back
            assert link.send(encode(Message(MsgType.HEARTBEAT, "robot-1")))
        assert received(heartbeats=True) == [MsgType.HEARTBEAT] * 4
        for _ in range(4):  # the new server knows none of them
            reject(identity)
        drive(link, lambda: False, 0.5)
        assert received() == [MsgType.HELLO] and not link.ready
        welcome(identity)
        drive(link, lambda: link.ready, 5)
        assert link.ready
        reject(identity)
        drive(link, lambda: False, 0.3)  # forgotten again later (another restart): HELLO again
        assert received() == [MsgType.HELLO]
        drive(link, lambda: False, 2.2)  # that HELLO is never answered: lost in yet another restart
        reject(identity)  # the reply to a heartbeat
        drive(link, lambda: False, 0.3)
        assert received() == [MsgType.HELLO] and not link.ready
    finally:
        link.close()
        fake.close(0)
        ctx.destroy(0)
    assert sum("does not know this worker any more" in r.getMessage() for r in caplog.records) == 3
