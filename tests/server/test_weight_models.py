"""The server with several named models and weight formats (issue 34): each model cached and streamed on its own, the
encoding each worker gets (full or a delta chain, and which format), and bad weights input from either side."""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import pytest
import zmq

from netrl.monitor.status import format_status
from netrl.protocol.messages import Message, MsgType
from netrl.protocol.wire import MAX_MODELS, weight_parts
from netrl.server.server import Server
from netrl.server.weight_cache import FAST_SAMPLES, MAX_DELTAS
from netrl.server.weight_choice import MIN_RATE_BYTES, Candidate, LinkRate, choose
from tests.fakes import Peer, wait_until

Got = tuple[str, int, str, int | None]  # (model, version, format, base) of a message's part 0


def publish(trainer: Peer, version: int, model: str = "policy", fmt: str = "float32", base: int | None = None,
            nbytes: int = 64, rank: int = 0, budget_s: float | None = None, part_bytes: int = 1 << 20,
            parts: int | None = None) -> None:
    """One encoding of one version, as netrl's trainer sends it (fields only where they differ from the defaults)."""
    fields: dict[str, Any] = {}
    if model != "policy":
        fields["model"] = model
    if fmt != "float32":
        fields["format"] = fmt
    if base is not None:
        fields["base"] = base
    if rank:
        fields["rank"] = rank
    if budget_s is not None:
        fields["budget_s"] = budget_s
    flat = np.full(nbytes, version % 251, np.uint8)
    # the decoded buffer's layout: a float32 full version is that buffer; other encodings are smaller
    layout = [["w", "<f4", [nbytes // 4 if fmt == "float32" and base is None else 16], 0]]
    for msg in weight_parts("trainer", trainer.session, version, version, flat, layout, part_bytes, fields)[:parts]:
        trainer.send(msg)  # (``parts``: only the first ones, as from a trainer that dies)


def auto(trainer: Peer, version: int, delta_bytes: int = 8, budget_s: float = 1.0) -> None:
    """``auto`` of a 64-byte float32 model: float32 and int8 full, int8 as a delta from the version before."""
    publish(trainer, version, nbytes=64, budget_s=budget_s)
    publish(trainer, version, fmt="int8", nbytes=32, rank=2, budget_s=budget_s)
    if version > 1:
        publish(trainer, version, fmt="int8", base=version - 1, nbytes=delta_bytes, rank=2, budget_s=budget_s)


def worker_hello(peer: Peer, models: list[str] | None = None, formats: list[str] | None = None) -> Message:
    body: dict[str, Any] = {"role": "worker", "netrl_version": "0.1.0", "worker_id": peer.name, "session": peer.session}
    if models is not None:
        body["models"] = models
    if formats is not None:
        body["formats"] = formats
    peer.send(Message(MsgType.HELLO, peer.name, body=body))
    return peer.expect(MsgType.WELCOME, MsgType.REJECT)


def received(peer: Peer, timeout: float = 0.4) -> list[Got]:
    """Every weights message (its part 0) that reaches ``peer`` within ``timeout``."""
    peer.send(Message(MsgType.HEARTBEAT, peer.name, body={}))  # (a silent peer is lost after 1 s)
    out: list[Got] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = peer.recv(0.05)
        if msg is not None and msg.type is MsgType.WEIGHTS and msg.body["part"] == 0:
            b = msg.body
            out.append((b.get("model", "policy"), msg.policy_version, b.get("format", "float32"), b.get("base")))
    return out


def ack(peer: Peer, got: Got, need_full: bool = False) -> None:
    model, version, fmt, _ = got
    body: dict[str, Any] = {"seqs": [version], "model": model, "format": fmt}
    if need_full:
        body["need_full"] = True
    peer.send(Message(MsgType.ACK, peer.name, body=body))


def cached(srv: Server, version: int, fmt: str, model: str = "policy") -> None:
    def done() -> bool:
        full = srv.weights.models[model].fulls.get(fmt) if model in srv.weights.models else None
        return full is not None and full.complete_version == version

    wait_until(done, 5, f"{model} v{version} cached in {fmt}", poll=0.02)


def deltas(srv: Server, fmt: str = "int8") -> list[int]:
    """The versions of the policy's deltas the server holds in ``fmt``."""
    model = srv.weights.models.get("policy")
    return sorted(model.deltas[fmt].links) if model and fmt in model.deltas else []


def connect(srv: Server, ctx: zmq.Context) -> Peer:
    trainer = Peer(ctx, srv.trainer_port, "trainer", "trainer")
    assert trainer.hello().type is MsgType.WELCOME
    return trainer


# -- several models --------------------------------------------------------------------------------------------------

def int8_worker_holding_v2(srv: Server, ctx: zmq.Context) -> tuple[Peer, Peer]:
    """A trainer that sent v1 and v2 (auto), and a worker decoding int8 only that acknowledged the version it got."""
    trainer = connect(srv, ctx)
    auto(trainer, 1)
    auto(trainer, 2)
    cached(srv, 2, "int8")
    worker = Peer(ctx, srv.worker_port, "worker", "w")
    worker_hello(worker, ["policy"], ["int8"])
    ack(worker, received(worker)[0])
    return trainer, worker

def test_two_models_on_their_own_rhythms_reach_a_late_joiner_and_never_wait_for_each_other(
        server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    trainer = connect(srv, ctx)
    for v in range(1, 6):  # the policy every step, obs_norm every other one
        publish(trainer, v)
        if v % 2 == 0:
            publish(trainer, v // 2, model="obs_norm", nbytes=24)
    wait_until(lambda: srv.weights.newest == {"policy": 5, "obs_norm": 2}, 5, "both models cached", poll=0.02)
    worker = Peer(ctx, srv.worker_port, "worker", "late")
    assert worker_hello(worker, ["policy", "obs_norm"]).body["models"] == {"policy": 5, "obs_norm": 2}
    got = received(worker)
    assert sorted(got) == [("obs_norm", 2, "float32", None), ("policy", 5, "float32", None)]  # each model's newest
    ack(worker, ("obs_norm", 2, "float32", None))  # the policy stays unacknowledged: a slow link
    publish(trainer, 6, nbytes=64 * 1024, part_bytes=4096)
    publish(trainer, 3, model="obs_norm", nbytes=24)
    assert received(worker) == [("obs_norm", 3, "float32", None)]  # the policy holds nothing back
    ack(worker, ("policy", 5, "float32", None))
    assert received(worker) == [("policy", 6, "float32", None)]
    wait_until(lambda: srv.peers.workers()[0].version == 5, 5, "policy v5 acknowledged", poll=0.02)
    described = srv.snapshot()["workers"][0]["models"]
    assert described["obs_norm"] == {"version": 2, "format": "float32", "in_flight": ["v3 (float32)"]}
    assert described["policy"]["version"] == 5
    again = Peer(ctx, srv.trainer_port, "trainer", "trainer-2")  # a restarted trainer continues each counter
    assert again.hello().body["models"] == {"policy": 6, "obs_norm": 3}


def test_a_worker_that_declares_only_the_policy_never_gets_another_model(
        server: tuple[Server, zmq.Context], caplog: pytest.LogCaptureFixture) -> None:
    srv, ctx = server
    trainer = connect(srv, ctx)
    plain, declared = Peer(ctx, srv.worker_port, "worker", "plain"), Peer(ctx, srv.worker_port, "worker", "declared")
    with caplog.at_level(logging.INFO, logger="netrl.server.weight_cache"):
        worker_hello(plain)  # today's worker: no models, no formats
        worker_hello(declared, ["policy"], ["float32", "int8"])
        for v in (1, 2):
            publish(trainer, v, model="obs_norm", nbytes=24)
            publish(trainer, v)
            for w in (plain, declared):
                got = received(w)
                assert got == [("policy", v, "float32", None)], (w.name, got)
                ack(w, got[0])
    refusals = [r.getMessage() for r in caplog.records if "is not sent model 'obs_norm'" in r.getMessage()]
    assert len(refusals) == 2 and all("no target for it (its models: policy)" in r for r in refusals)  # once each
    assert srv.stats["rejected"] == 0


def test_a_model_in_no_format_the_worker_decodes_is_not_streamed_to_it_and_the_log_names_both_lists(
        server: tuple[Server, zmq.Context], caplog: pytest.LogCaptureFixture) -> None:
    srv, ctx = server
    trainer = connect(srv, ctx)
    worker = Peer(ctx, srv.worker_port, "worker", "w")
    worker_hello(worker, ["policy"], ["float32"])
    with caplog.at_level(logging.WARNING, logger="netrl.server.weight_cache"):
        publish(trainer, 1, fmt="custom8", nbytes=16)
        publish(trainer, 2, fmt="custom8", nbytes=16)
        assert received(worker) == []
    lines = [r.getMessage() for r in caplog.records if "decodes none of its formats" in r.getMessage()]
    assert len(lines) == 1 and "the trainer sends custom8; the worker decodes float32" in lines[0]


def test_a_new_trainer_session_forgets_every_model_and_what_each_worker_holds(
        server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    first = connect(srv, ctx)
    auto(first, 1)
    auto(first, 2)
    publish(first, 4, model="obs_norm", nbytes=24)
    cached(srv, 2, "int8")
    worker = Peer(ctx, srv.worker_port, "worker", "w")
    worker_hello(worker, ["policy", "obs_norm"], ["float32", "int8"])
    for got in received(worker):
        ack(worker, got)
    wait_until(lambda: srv.peers.workers()[0].version == 2, 5, "v2 acknowledged", poll=0.02)
    second = Peer(ctx, srv.trainer_port, "trainer", "trainer-2")
    assert second.hello().body["models"] == {"policy": 2, "obs_norm": 4}
    auto(second, 3)  # numbered after the old session's, as netrl's trainer does; int8 v2 is no base any more
    assert received(worker) == [("policy", 3, "int8", None)]
    assert srv.snapshot()["models"].keys() == {"policy"} and srv.peers.workers()[0].version == -1


def test_a_delta_its_trainer_left_unfinished_gives_way_to_the_full_version(
        server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    trainer, worker = int8_worker_holding_v2(srv, ctx)
    publish(trainer, 3, nbytes=64)
    publish(trainer, 3, fmt="int8", nbytes=32, rank=2)
    publish(trainer, 3, fmt="int8", base=2, nbytes=16, rank=2, part_bytes=8, parts=1)  # half of it, then gone
    assert received(worker) == [("policy", 3, "int8", 2)]  # cut-through: the part that arrived
    trainer.send(Message(MsgType.BYE, "trainer"))
    assert received(worker) == [("policy", 3, "int8", None)]  # not left waiting for the rest


# -- formats and delta chains ----------------------------------------------------------------------------------------
def test_a_worker_gets_the_delta_chain_from_the_version_it_holds_pipelined_behind_it(
        server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    trainer = connect(srv, ctx)
    auto(trainer, 3)
    worker = Peer(ctx, srv.worker_port, "worker", "w")
    worker_hello(worker, ["policy"], ["float32", "int8"])
    assert received(worker) == [("policy", 3, "int8", None)]  # rate unknown: the fewest bytes
    auto(trainer, 4)
    auto(trainer, 5)
    assert received(worker) == [("policy", 4, "int8", 3), ("policy", 5, "int8", 4)]  # v3 not acknowledged yet
    assert "policy none - (in flight: v3 (int8), v4 (int8, delta from v3), v5 (int8, delta from v4))" in \
        format_status(srv.snapshot())
    for v in (3, 4, 5):
        ack(worker, ("policy", v, "int8", None))
    wait_until(lambda: srv.peers.workers()[0].version == 5, 5, "v5 acknowledged", poll=0.02)
    assert received(worker, 0.2) == []
    plain = Peer(ctx, srv.worker_port, "worker", "plain")  # today's worker: float32 only, in full
    worker_hello(plain)
    assert received(plain) == [("policy", 5, "float32", None)]
    snapshot = srv.snapshot()
    cached = snapshot["models"]["policy"]
    assert cached["version"] == 5 and cached["formats"]["float32"]["bytes"] == 64
    assert cached["formats"]["int8"]["deltas"] == {"3->4": 8, "4->5": 8} and cached["formats"]["int8"]["rank"] == 2
    assert {"version": 5, "format": "int8"}.items() <= snapshot["workers"][0]["models"]["policy"].items()
    shown = format_status(snapshot)  # what python -m netrl --status prints
    assert "weights cached: policy v5 (float32 64 B; int8 32 B, 2 deltas 16 B)" in shown
    assert "policy v5 int8; link rate not measured yet" in shown


def test_a_worker_that_missed_more_versions_than_the_deltas_cached_gets_a_full_version(
        server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    trainer = connect(srv, ctx)
    auto(trainer, 1)
    worker = Peer(ctx, srv.worker_port, "worker", "w")
    worker_hello(worker, ["policy"], ["int8"])
    got = received(worker)
    assert got == [("policy", 1, "int8", None)]
    for v in range(2, 5):  # pipelined behind v1: the most a worker is sent without acknowledging
        auto(trainer, v, delta_bytes=12)
        got += received(worker)
    assert got[1:] == [("policy", v, "int8", v - 1) for v in range(2, 5)]
    for v in range(5, 9):  # deltas of 12 bytes: 2 fit in the full encoding's 32, so v5 and v6 are gone
        auto(trainer, v, delta_bytes=12)
    wait_until(lambda: deltas(srv) == [7, 8], 5, "v8's delta cached", poll=0.02)
    for g in got:
        ack(worker, g)
    assert received(worker) == [("policy", 8, "int8", None)]


def test_deltas_kept_per_format_are_at_most_max_deltas(server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    trainer = connect(srv, ctx)
    for v in range(1, MAX_DELTAS + 5):
        auto(trainer, v, delta_bytes=1)
    wait_until(lambda: deltas(srv) == list(range(5, MAX_DELTAS + 5)), 5, "the newest deltas cached", poll=0.02)


def test_need_full_makes_what_the_worker_holds_unknown_and_gets_it_a_full_version(
        server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    trainer, worker = int8_worker_holding_v2(srv, ctx)
    auto(trainer, 3)
    got = received(worker)
    assert got == [("policy", 3, "int8", 2)]
    ack(worker, got[0], need_full=True)  # it could not apply the delta (a crc mismatch, say)
    assert received(worker) == [("policy", 3, "int8", None)]
    assert srv.stats["rejected"] == 0


def test_auto_sends_a_slow_worker_the_smallest_format_and_a_fast_one_the_exact_one(
        server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    trainer = connect(srv, ctx)
    auto(trainer, 1)
    auto(trainer, 2)  # (a session's first delta may come after its full version has gone out: not awaited)
    cached(srv, 2, "int8")
    slow, fast = Peer(ctx, srv.worker_port, "worker", "slow"), Peer(ctx, srv.worker_port, "worker", "fast")
    for w in (slow, fast):
        worker_hello(w, ["policy"], ["float32", "int8"])
        assert received(w) == [("policy", 2, "int8", None)]  # its rate unknown: the fewest bytes
        ack(w, ("policy", 2, "int8", None))
    rates = {"slow": 40.0, "fast": 1e6}  # bytes/s: float32's 64 bytes take 1.6 s (over budget_s), or 0.06 ms
    wait_until(lambda: all(p.version == 2 for p in srv.peers.workers()), 5, "v2 acknowledged", poll=0.02)
    for p in srv.peers.workers():
        p.link.rate = rates[p.name]
    auto(trainer, 3)  # each version's formats are awaited before choosing (int8 comes after float32)
    assert received(slow) == [("policy", 3, "int8", 2)]  # the delta: 8 bytes, in time
    assert received(fast) == [("policy", 3, "float32", None)]  # 64 bytes, in time: the exact format


def test_the_link_rate_is_measured_from_versions_of_at_least_64_kib_as_they_are_acknowledged(
        server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    trainer = connect(srv, ctx)
    worker = Peer(ctx, srv.worker_port, "worker", "w")
    worker_hello(worker)
    publish(trainer, 1, nbytes=1024)
    ack(worker, received(worker)[0])  # too small to say anything of the link
    publish(trainer, 2, nbytes=MIN_RATE_BYTES, part_bytes=16 << 10)
    got = received(worker)
    time.sleep(0.2)  # the worker takes its time: the rate counts from the first part sent to the ACK
    ack(worker, got[0])
    rate = wait_until(lambda: srv.snapshot()["workers"][0]["link_rate"], 5, "the rate measured", poll=0.02)
    assert MIN_RATE_BYTES / 5 < rate < MIN_RATE_BYTES / 0.2


def test_choose_by_rank_rate_and_budget() -> None:
    exact, half, small = (Candidate(0, "float32", 4000, None), Candidate(1, "float16", 2000, None),
                          Candidate(2, "int8", 1000, None))
    every = [exact, half, small]
    assert choose([], 1.0, 1.0) is None and choose([exact], 1.0, 1.0) is exact
    assert choose(every, None, 1.0) is small  # rate unknown: the fewest bytes
    assert choose(every, 10_000, 1.0) is exact  # everything in time: the lowest rank
    assert choose(every, 2500, 1.0) is half and choose(every, 1500, 1.0) is small
    assert choose(every, 100, 1.0) is small  # nothing in time: the fewest bytes
    assert choose(every, 2500, None) is half  # no budget sent: network.weight_budget_s's default


def test_the_link_rate_is_smoothed_and_ignores_small_versions() -> None:
    link = LinkRate()
    link.measured(MIN_RATE_BYTES - 1, 0.001)
    assert link.rate is None
    link.measured(100_000, 1.0)
    link.measured(300_000, 1.0)
    assert link.rate == 200_000.0 and link.samples == 2


def test_small_messages_add_up_to_a_rate_sample_so_a_worker_fed_deltas_has_its_rate_kept_current() -> None:
    # int8 deltas of 13 KB: the rate stayed that of the first full version, 47.5 KB/s, while the
    # link carried 30 KB/s, and deltas queued behind it
    link = LinkRate()
    for _ in range(3):
        link.measured(MIN_RATE_BYTES // 4, 1.0)
    assert link.rate is None  # 3/4 of MIN_RATE_BYTES so far: too little to say
    link.measured(MIN_RATE_BYTES // 4, 1.0)
    assert link.rate == MIN_RATE_BYTES / 4.0 and link.samples == 1
    link.measured(MIN_RATE_BYTES * 2, 1.0)  # a large one is a sample of its own, as before
    assert link.rate == 0.5 * MIN_RATE_BYTES * 2 + 0.5 * MIN_RATE_BYTES / 4.0 and link.samples == 2


def slow_workers_told(trainer: Peer, timeout: float = 3.0) -> list[int]:
    """The ``slow_workers`` counts of the server's heartbeats to ``trainer`` within ``timeout``."""
    told: list[int] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        trainer.send(Message(MsgType.HEARTBEAT, trainer.name, body={}))
        msg = trainer.recv(0.1)
        if msg is not None and msg.type is MsgType.HEARTBEAT and "stats" in msg.body:
            told.append(msg.body["stats"]["slow_workers"])
    return told


def test_the_trainer_hears_how_many_workers_cannot_get_float32_in_the_budget(
        server: tuple[Server, zmq.Context]) -> None:
    # network.weight_format adaptive: the trainer adds the compact formats only while one is slow
    srv, ctx = server
    trainer = connect(srv, ctx)
    worker = Peer(ctx, srv.worker_port, "worker", "w")
    worker_hello(worker)
    assert slow_workers_told(trainer, 0.3)[-1:] == [0]  # its rate unknown: not slow
    publish(trainer, 1, nbytes=2 * MIN_RATE_BYTES, budget_s=0.1, part_bytes=64 << 10)
    got = received(worker)  # (0.4 s)
    ack(worker, got[0])  # 128 KiB in 0.4 s or more: at most 33 KiB in the 0.1 s budget
    wait_until(lambda: slow_workers_told(trainer, 0.3)[-1:] == [1], 5, "a slow worker told")
    # the same link, a budget it keeps (10 s: a trainer publishing every 10 s), measured so often
    # enough for the hysteresis
    for version in range(2, 2 + FAST_SAMPLES):
        fast_sample(srv, trainer, worker, version)
    wait_until(lambda: slow_workers_told(trainer, 0.3)[-1:] == [0], 5, "no slow worker told")


def arrival(worker: Peer, version: int) -> Got:
    """Part 0 of ``version`` once it reaches ``worker``: looked for up to 5 s (a loaded machine; each
    look is a heartbeat: a silent worker is lost)."""
    got: list[Got] = []
    deadline = time.monotonic() + 5
    while not any(g[1] == version for g in got) and time.monotonic() < deadline:
        got += received(worker)
    assert any(g[1] == version for g in got), (version, got)
    return next(g for g in got if g[1] == version)


def fast_sample(srv: Server, trainer: Peer, worker: Peer, version: int) -> None:
    """Publish ``version`` with a budget of 10 s (one the link keeps) and ACK it: one more rate
    sample of the worker's link, a fast one."""
    samples = srv.peers.workers()[0].link.samples
    publish(trainer, version, nbytes=2 * MIN_RATE_BYTES, budget_s=10.0, part_bytes=64 << 10)
    ack(worker, arrival(worker, version))
    wait_until(lambda: srv.peers.workers()[0].link.samples == samples + 1, 5, f"v{version} measured",
               poll=0.02)


def test_a_slow_worker_counts_as_fast_again_only_after_several_fast_rate_samples(
        server: tuple[Server, zmq.Context]) -> None:
    # hysteresis: a link near the threshold must not flip the trainer's encoding on and off with
    # each rate sample (adaptive: float32 alone, then every format, then float32 alone...)
    srv, ctx = server
    trainer = connect(srv, ctx)
    worker = Peer(ctx, srv.worker_port, "worker", "w")
    worker_hello(worker)
    publish(trainer, 1, nbytes=2 * MIN_RATE_BYTES, budget_s=0.1, part_bytes=64 << 10)
    ack(worker, arrival(worker, 1))  # 128 KiB in 0.4 s or more: slow in a 0.1 s budget
    wait_until(lambda: srv.weights.slow_workers(srv.peers.workers(), time.monotonic()) == 1, 5,
               "the worker slow")
    for version in range(2, 2 + FAST_SAMPLES):
        fast_sample(srv, trainer, worker, version)
        fast = version - 1
        assert srv.weights.slow_workers(srv.peers.workers(), time.monotonic()) == (fast < FAST_SAMPLES), fast
    # slow again at one slow sample (a 0.1 s budget), and again only fast after FAST_SAMPLES more
    publish(trainer, 2 + FAST_SAMPLES, nbytes=2 * MIN_RATE_BYTES, budget_s=0.1, part_bytes=64 << 10)
    ack(worker, arrival(worker, 2 + FAST_SAMPLES))
    wait_until(lambda: srv.weights.slow_workers(srv.peers.workers(), time.monotonic()) == 1, 5,
               "the worker slow again")
    fast_sample(srv, trainer, worker, 3 + FAST_SAMPLES)
    assert srv.weights.slow_workers(srv.peers.workers(), time.monotonic()) == 1


def test_a_worker_whose_first_version_never_arrives_is_slow_and_stays_so_across_its_reconnect(
        server: tuple[Server, zmq.Context]) -> None:
    # a 4 MB float32 version behind reno at 1% loss: the worker reconnected during each 1 MiB part,
    # no ACK came, no rate was measured, and adaptive never turned to the compact formats
    srv, ctx = server
    trainer = connect(srv, ctx)
    worker = Peer(ctx, srv.worker_port, "worker", "w")
    worker_hello(worker)
    publish(trainer, 1, nbytes=4 * MIN_RATE_BYTES, budget_s=0.2, part_bytes=64 << 10)
    assert received(worker, 0.2)  # on its way (never acknowledged)
    assert slow_workers_told(trainer, 0.2)[-1:] == [0]  # not yet twice the budget
    wait_until(lambda: slow_workers_told(trainer, 0.3)[-1:] == [1], 5, "a slow worker told")
    worker.sock.close()
    again = Peer(ctx, srv.worker_port, "worker", "w")
    again.session = worker.session  # the same process, on a new connection
    worker_hello(again)
    wait_until(lambda: [p.session for p in srv.peers.workers()] == [again.session], 5, "the worker reconnected")
    # remembered at once, before anything on its way to the new connection could say so: nothing measured since
    assert srv.weights.slow_workers(srv.peers.workers(), time.monotonic()) == 1
    other = Peer(ctx, srv.worker_port, "worker", "other")
    worker_hello(other)
    wait_until(lambda: srv.peers.worker_count() == 2, 5, "another worker")
    assert srv.weights.slow_workers([p for p in srv.peers.workers() if p.name == "other"], time.monotonic()) == 0


# -- pipelined deltas ------------------------------------------------------------------------------------------------
def delta_version(trainer: Peer, version: int, nbytes: int = 64, delta_bytes: int = 8) -> None:
    """``delta``: a float32 full version, and from v2 on a delta from the version before."""
    publish(trainer, version, nbytes=nbytes)
    if version > 1:
        publish(trainer, version, base=version - 1, nbytes=delta_bytes)


def in_flight(srv: Server, model: str = "policy") -> list[str]:
    return list(srv.snapshot()["workers"][0]["models"][model].get("in_flight", []))


def test_a_slow_worker_gets_deltas_pipelined_up_to_the_bound_and_its_acks_pop_them_in_order(
        server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    trainer = connect(srv, ctx)
    delta_version(trainer, 1)
    worker = Peer(ctx, srv.worker_port, "worker", "w")
    worker_hello(worker)
    assert received(worker) == [("policy", 1, "float32", None)]
    for v in range(2, 7):
        delta_version(trainer, v)
    wait_until(lambda: srv.weights.newest.get("policy") == 6, 5, "v6 cached", poll=0.02)
    got = received(worker)  # v1 unacknowledged: deltas behind it, MAX_PIPELINE (4) messages in all
    assert got == [("policy", 2, "float32", 1), ("policy", 3, "float32", 2), ("policy", 4, "float32", 3)]
    assert in_flight(srv) == ["v1 (float32)", "v2 (float32, delta from v1)", "v3 (float32, delta from v2)",
                              "v4 (float32, delta from v3)"]
    ack(worker, ("policy", 1, "float32", None))
    assert received(worker) == [("policy", 5, "float32", 4)]  # one out, one in
    wait_until(lambda: srv.peers.workers()[0].version == 1, 5, "v1 acknowledged", poll=0.02)
    ack(worker, ("policy", 2, "float32", None))
    assert received(worker) == [("policy", 6, "float32", 5)]
    for v in range(3, 7):
        ack(worker, ("policy", v, "float32", None))
    wait_until(lambda: srv.peers.workers()[0].version == 6, 5, "v6 acknowledged", poll=0.02)
    assert in_flight(srv) == [] and received(worker, 0.2) == [] and srv.stats["rejected"] == 0


def test_an_acknowledgement_out_of_order_is_refused_naming_both(
        server: tuple[Server, zmq.Context], caplog: pytest.LogCaptureFixture) -> None:
    srv, ctx = server
    trainer = connect(srv, ctx)
    delta_version(trainer, 1)
    worker = Peer(ctx, srv.worker_port, "worker", "w")
    worker_hello(worker)
    delta_version(trainer, 2)
    delta_version(trainer, 3)
    assert received(worker) == [("policy", 1, "float32", None), ("policy", 2, "float32", 1),
                                ("policy", 3, "float32", 2)]
    with caplog.at_level(logging.WARNING, logger="netrl.server.admission"):
        ack(worker, ("policy", 2, "float32", None))  # v1 first
        # the line, not the count: the server's thread counts the refusal before it logs it
        wait_until(lambda: "but was sent" in caplog.text, 5, "the acknowledgement refused", poll=0.02)
    assert "[2] ('float32') but was sent 'policy' v1 (float32) first" in caplog.text
    assert srv.stats["rejected"] == 1
    for v in (1, 2, 3):  # the right order still counts
        ack(worker, ("policy", v, "float32", None))
    wait_until(lambda: srv.peers.workers()[0].version == 3, 5, "v3 acknowledged", poll=0.02)
    assert srv.stats["rejected"] == 1


def test_need_full_drops_the_pipeline_ignores_its_acks_quietly_and_gets_a_full_version_next(
        server: tuple[Server, zmq.Context], caplog: pytest.LogCaptureFixture) -> None:
    srv, ctx = server
    trainer = connect(srv, ctx)
    delta_version(trainer, 1)
    delta_version(trainer, 2)
    worker = Peer(ctx, srv.worker_port, "worker", "w")
    worker_hello(worker)
    ack(worker, received(worker)[0])
    wait_until(lambda: srv.peers.workers()[0].version == 2, 5, "v2 acknowledged", poll=0.02)
    for v in range(3, 7):
        delta_version(trainer, v)
    got = received(worker)
    assert got == [("policy", v, "float32", v - 1) for v in range(3, 7)]
    with caplog.at_level(logging.DEBUG, logger="netrl.server"):
        ack(worker, got[0], need_full=True)  # v3's delta did not apply: v4..v6's cannot either
        assert received(worker) == [("policy", 6, "float32", None)]
        assert in_flight(srv) == ["v6 (float32)"] and srv.peers.workers()[0].version == -1
        for g in got[1:]:  # the worker answers need_full for each delta dropped
            ack(worker, g, need_full=True)
        ack(worker, ("policy", 6, "float32", None))  # then the full version
        wait_until(lambda: srv.peers.workers()[0].version == 6, 5, "the full v6 acknowledged", poll=0.02)
    assert srv.stats["rejected"] == 0
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    delta_version(trainer, 7)  # and deltas go on from it
    assert received(worker) == [("policy", 7, "float32", 6)]


def test_a_full_version_is_never_sent_while_a_message_of_its_model_is_in_flight(
        server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    trainer = connect(srv, ctx)
    auto(trainer, 1)
    cached(srv, 1, "int8")
    worker = Peer(ctx, srv.worker_port, "worker", "w")
    worker_hello(worker, ["policy"], ["float32", "int8"])
    assert received(worker) == [("policy", 1, "int8", None)]
    srv.peers.workers()[0].link.rate = 1e6  # fast: float32 in full is in budget, and preferred to int8's delta
    auto(trainer, 2)
    wait_until(lambda: deltas(srv) == [2], 5, "v2's delta cached", poll=0.02)
    assert received(worker) == []  # a full version waits for v1's ACK
    ack(worker, ("policy", 1, "int8", None))
    assert received(worker) == [("policy", 2, "float32", None)]


def test_a_pipelined_message_is_timed_from_the_ack_of_the_one_before_it(server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    trainer = connect(srv, ctx)
    worker = Peer(ctx, srv.worker_port, "worker", "w")
    worker_hello(worker)
    publish(trainer, 1, nbytes=1024)  # too small to say anything of the link
    assert received(worker) == [("policy", 1, "float32", None)]
    delta_version(trainer, 2, nbytes=4 * MIN_RATE_BYTES, delta_bytes=MIN_RATE_BYTES)
    assert received(worker) == [("policy", 2, "float32", 1)]
    [_, second] = srv.peers.workers()[0].models["policy"].inflight
    second.started -= 10  # as if it had queued behind v1 for 10 s
    ack(worker, ("policy", 1, "float32", None))
    wait_until(lambda: srv.peers.workers()[0].version == 1, 5, "v1 acknowledged", poll=0.02)
    time.sleep(0.2)  # the link's own time: from v1's ACK to v2's
    ack(worker, ("policy", 2, "float32", None))
    rate = wait_until(lambda: srv.snapshot()["workers"][0]["link_rate"], 5, "the rate measured", poll=0.02)
    assert MIN_RATE_BYTES / 5 < rate < MIN_RATE_BYTES / 0.2  # not MIN_RATE_BYTES / 10.2


# -- bad input ---------------------------------------------------------------------------------------------------
def test_more_models_than_max_models_are_refused_logged_once_and_the_rest_still_served(
        server: tuple[Server, zmq.Context], caplog: pytest.LogCaptureFixture) -> None:
    srv, ctx = server
    trainer = connect(srv, ctx)
    names = ["policy", *(f"m{i}" for i in range(1, MAX_MODELS + 1))]
    with caplog.at_level(logging.ERROR, logger="netrl.server.weight_cache"):
        for v in (1, 2):
            for name in names:
                publish(trainer, v, model=name, nbytes=8)
        wait_until(lambda: srv.stats["rejected"] == 2, 5, "the extra model's versions refused", poll=0.02)
    assert sorted(srv.weights.models) == sorted(names[:MAX_MODELS])
    lines = [r.getMessage() for r in caplog.records if f"model '{names[-1]}' refused" in r.getMessage()]
    assert len(lines) == 1 and f"already sends {MAX_MODELS} models" in lines[0]
    worker = Peer(ctx, srv.worker_port, "worker", "w")
    worker_hello(worker, names[:MAX_MODELS])
    assert sorted(m for m, *_ in received(worker)) == sorted(names[:MAX_MODELS])


def test_acknowledgements_of_a_model_never_sent_or_of_another_version_are_refused_naming_both(
        server: tuple[Server, zmq.Context], caplog: pytest.LogCaptureFixture) -> None:
    srv, ctx = server
    trainer = connect(srv, ctx)
    auto(trainer, 1)
    cached(srv, 1, "int8")
    worker = Peer(ctx, srv.worker_port, "worker", "w")
    worker_hello(worker, ["policy", "obs_norm"], ["float32", "int8"])
    got = received(worker)
    assert got == [("policy", 1, "int8", None)]
    with caplog.at_level(logging.WARNING, logger="netrl.server.admission"):
        ack(worker, ("critic", 1, "float32", None))
        ack(worker, ("policy", 1, "float32", None))  # it was sent int8
        ack(worker, ("policy", 7, "int8", None))
        wait_until(lambda: srv.stats["rejected"] == 3, 5, "three acknowledgements refused", poll=0.02)
    text = caplog.text
    assert "model 'critic' [1], but was never sent that model" in text
    assert "[1] ('float32') but was sent 'policy' v1 (int8)" in text
    assert "[7] ('int8') but was sent 'policy' v1 (int8)" in text
    ack(worker, got[0])  # the right one still counts
    wait_until(lambda: srv.peers.workers()[0].version == 1, 5, "v1 acknowledged", poll=0.02)


def test_a_delta_that_continues_nothing_is_dropped_and_never_sent(
        server: tuple[Server, zmq.Context], caplog: pytest.LogCaptureFixture) -> None:
    srv, ctx = server
    trainer, worker = int8_worker_holding_v2(srv, ctx)
    with caplog.at_level(logging.DEBUG, logger="netrl.server.weight_encodings"):
        publish(trainer, 9, fmt="int8", base=7, nbytes=4, rank=2)  # v7 was never sent
        wait_until(lambda: srv.stats["rejected"] == 1, 5, "the delta refused", poll=0.02)
    assert "continues no version of this model and format" in caplog.text
    assert received(worker, 0.2) == []
    assert list(srv.weights.models["policy"].deltas["int8"].links) == [2]
    auto(trainer, 3)  # the next versions go on as ever
    assert received(worker) == [("policy", 3, "int8", 2)]


def test_a_hello_with_malformed_model_or_format_lists_is_refused_with_the_reason(
        server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    for models, formats in ((["policy", "bad name"], None), (None, ["Float32"]), (None, [1]),
                            ([f"m{i}" for i in range(MAX_MODELS + 1)], None)):
        peer = Peer(ctx, srv.worker_port, "worker", "w")
        reply = worker_hello(peer, models, formats)
        assert reply.type is MsgType.REJECT and "is not a list of at most" in reply.body["reason"], (models, formats)
    assert srv.peers.worker_count() == 0


def test_deltas_queue_behind_the_message_in_flight_only_while_the_link_drains_it_in_the_budget() -> None:
    # float32 deltas of 3 MB behind a 10 Mbit/s link would queue up and bring the worker only old versions
    from netrl.server.weight_cache import drains_in_time
    from netrl.server.weight_choice import Sent, WorkerModel

    st = WorkerModel()
    st.inflight.append(Sent(1, "float32", None, None, 3_000_000))
    assert not drains_in_time(st, None, 0.5)  # rate unknown: wait for the ACK
    assert not drains_in_time(st, 1_250_000, 0.5)  # 2.4 s of link for a 0.5 s budget
    assert drains_in_time(st, 1_250_000, 3.0)
    assert not drains_in_time(st, 1_250_000, None)  # no budget sent: network.weight_budget_s's default, 1 s
    assert drains_in_time(st, 10_000_000, None)
    small = WorkerModel()
    small.inflight.append(Sent(1, "int8", 0, None, MIN_RATE_BYTES))
    assert drains_in_time(small, None, 0.5)  # too little to hold a newer version back: pipelined on any link


def test_small_deltas_queue_only_as_far_as_the_measured_link_drains_them_in_the_budget() -> None:
    # three int8 deltas of 13 KB queued behind a 35 KB/s link (reno, 100 ms each way, 5% loss):
    # each arrived 1.5 s late, and the versions behind them later still
    from netrl.server.weight_cache import drains_in_time
    from netrl.server.weight_choice import Sent, WorkerModel

    st = WorkerModel()
    st.inflight.append(Sent(1, "int8", 0, None, 13_000))
    assert drains_in_time(st, 35_000, 0.38)  # 0.37 s of link: the next may queue behind it
    st.inflight.append(Sent(2, "int8", 1, None, 13_000))
    assert not drains_in_time(st, 35_000, 0.38)  # 0.74 s: the next waits for an ACK
    # one small message always queues behind the one in flight, so the link stays busy while the
    # ACK comes back: 9 KB deltas, one per round trip behind a link measured at 20 KB/s with a
    # budget of 0.24 s, left the worker 8 versions behind
    one = WorkerModel()
    one.inflight.append(Sent(1, "int8", 0, None, 9_000))
    assert drains_in_time(one, 20_000, 0.24)
    one.inflight.append(Sent(2, "int8", 1, None, 9_000))
    assert not drains_in_time(one, 20_000, 0.24)
    assert drains_in_time(st, None, 0.38)  # unmeasured: under MIN_RATE_BYTES may queue
    assert drains_in_time(st, 10_000_000, 0.38)  # a fast link drains them at once
