"""Named models on the worker's side (issue 34): a version of each reaches its target through a real server, is
swapped in between env steps, and tagged on every row; a model the worker has no target for is refused by name."""

from __future__ import annotations

import copy
import logging
from typing import Any

import gymnasium
import numpy as np
import pytest
import torch
import zmq

from netrl.agents.sac import MLPActor
from netrl.envs.gym import GenericGymEnv
from netrl.launch import free_port
from netrl.net.transport import new_session
from netrl.protocol.messages import Message, MsgType
from netrl.protocol.weight_formats import formats_for, get_format, sends_deltas
from netrl.protocol.weights import PART_BYTES, flat_layout, snapshot_into
from netrl.protocol.wire import buffer_from_message, decode, encode, weight_parts
from netrl.server.server import Server
from netrl.trainer.delivery import Deliveries
from netrl.trainer.encoding import WeightEncoder
from netrl.trainer.link import TrainerLink
from netrl.util import partial
from netrl.worker.link import WorkerLink
from netrl.worker.weight_receiver import ModelReceivers, WeightReceiver
from netrl.worker.worker import RolloutWorker
from tests.fakes import NET, Peer, wait_until

OBS3 = gymnasium.spaces.Box(-1, 1, (3,), np.float32)
ACT1 = gymnasium.spaces.Box(-1, 1, (1,), np.float32)


class Norm(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(3))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))


def norm_weights(trainer: Peer, version: int, mean: list[float], count: float,
                 model: str = "obs_norm") -> list[Message]:
    module = Norm()
    module.mean[:] = torch.tensor(mean)
    module.count.fill_(count)
    layout, nbytes = flat_layout(module)
    flat = np.zeros(nbytes, np.uint8)
    snapshot_into(module, layout, flat)
    return weight_parts("trainer", trainer.session, version, 0, flat, layout, PART_BYTES, {"model": model})


def worker(port: int, **kw: Any) -> RolloutWorker:
    return RolloutWorker(partial(GenericGymEnv, id="Pendulum-v1"), partial(MLPActor, hidden_sizes=(8,)),
                         server_ip="127.0.0.1", server_port=port, worker_id="w", seed=0, network=NET,
                         min_samples_per_worker_packet=5, max_samples_per_episode=10, flush_timeout_s=1.0, **kw)


def test_a_model_reaches_its_target_and_every_row_carries_its_version(server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    trainer = Peer(ctx, srv.trainer_port, "trainer", "trainer")
    trainer.hello()
    w = worker(srv.worker_port, models={"obs_norm": Norm()})
    try:
        w.start()
        assert w.net is not None and w.net.link.hello_extra["models"] == ["policy", "obs_norm"]
        w.run_episode()  # rows under the module as built: version -1
        for msg in norm_weights(trainer, 3, [1.0, 2.0, 3.0], 7.0):
            trainer.send(msg)
        for _ in range(100):
            w.run_episode()
            if w.models.versions["obs_norm"] == 3:
                break
        assert w.models.versions["obs_norm"] == 3
        w.run_episode()  # rows under v3
        norm = w.model("obs_norm")
        assert torch.equal(norm.mean, torch.tensor([1.0, 2.0, 3.0])) and norm.count.dtype == torch.float64
        assert float(norm.count) == 7.0
        assert w.version == -1 and w.weights is not None and w.weights.version == -1  # the actor is untouched
        assert w.net.weight_stats["obs_norm_version"] == 3
        with pytest.raises(KeyError, match=r"worker w has no model 'other'; its models: \['obs_norm'\]"):
            w.model("other")
        w.sink.send()
        versions: list[int] = []
        trainer.send(Message(MsgType.CREDIT, "trainer", body={"bundles": 64}))
        while len(versions) < w.produced + w.episodes_done:  # every row, its episode's reset row too
            bundle = trainer.expect(MsgType.BUNDLE, timeout=5)
            for part in bundle.parts:
                buf = buffer_from_message(decode(part))
                assert buf.extra is not None and buf.extra["obs_norm_version"].dtype == np.int64
                versions += buf.extra["obs_norm_version"].tolist()
        assert versions[:11] == [-1] * 11 and versions[-11:] == [3] * 11  # an episode's 11 rows: reset and 10 steps
        assert set(versions) == {-1, 3}
        assert versions == sorted(versions)  # never back to -1 once v3 was in use
    finally:
        w.close()


def test_weights_for_a_model_without_a_target_are_refused_by_name_and_the_worker_goes_on(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # A server streams a model only to workers whose HELLO names it: the test plays a server that does not.
    monkeypatch.setattr(WorkerLink, "start", lambda self: None)  # the test plays the network thread
    monkeypatch.setattr(WorkerLink, "_ack_weights", lambda self: None)  # (no socket to send on)
    w = worker(free_port())
    trainer = Peer.__new__(Peer)
    trainer.session = "abcd"
    try:
        with caplog.at_level(logging.INFO):
            w.start()
            net = w.net
            assert net is not None and net.link.hello_extra["models"] == ["policy"]
            for version in (3, 4):
                for msg in norm_weights(trainer, version, [1.0, 2.0, 3.0], 7.0):
                    net.on_message(decode(encode(msg)))
            for _ in range(3):
                w.run_episode()
        refusals = [r.getMessage() for r in caplog.records if "no target" in r.getMessage()]
        assert refusals == ["rejected weights v3 of the model 'obs_norm' from the server: this worker has no target "
                            "for it (its targets: policy). The worker goes on without it; to load it, give the worker "
                            "a module of that name (RolloutWorker(models={'obs_norm': module}))"]  # once per name
        assert net.weight_stats["weights_unknown_model"] == 2  # once per version
        assert w.version == -1 and not net.weights_acks  # not loaded into the actor, and not acknowledged
        assert w.produced == 30 and w.episodes_done == 3
    finally:
        w.close()


def test_the_receivers_route_by_model_count_once_per_version_and_log_once_per_name(
        caplog: pytest.LogCaptureFixture) -> None:
    policy = WeightReceiver(Norm(), Norm(), -1, None)
    norm = WeightReceiver(Norm(), Norm(), -1, None, model="obs_norm")
    receivers = ModelReceivers({"policy": policy, "obs_norm": norm})
    trainer = Peer.__new__(Peer)
    trainer.session = "abcd"
    for version in (1, 2):
        for msg in norm_weights(trainer, version, [0.0, 1.0, 2.0], 1.0, model="stranger"):
            stats = receivers(decode(encode(msg)))
            assert receivers.ack(msg) is None
    [done] = norm_weights(trainer, 4, [0.0, 1.0, 2.0], 1.0)
    stats = receivers(decode(encode(done)))
    assert receivers.ack(done) == {"seqs": [4], "model": "obs_norm", "format": "float32"}
    assert stats["weights_unknown_model"] == 2 and stats["obs_norm_version"] == 4 and stats["version"] == -1
    assert policy.version == -1 and norm.version == 4
    assert len([r for r in caplog.records if "'stranger'" in r.getMessage()]) == 1
    assert "its targets: policy, obs_norm" in caplog.text


# -- weight formats (issue 34, phase 2) --------------------------------------------------------------------------


def _versions(n: int) -> list[torch.nn.Module]:
    """``n`` successive versions of a small MLP actor, each a little trained (moved) from the one before."""
    torch.manual_seed(0)
    actor = MLPActor(OBS3, ACT1, hidden_sizes=(32,))
    out = []
    for _ in range(n):
        with torch.no_grad():
            for p in actor.parameters():
                p.add_(0.01 * torch.randn_like(p))
        out.append(copy.deepcopy(actor))
    return out


def _messages(encoder: WeightEncoder, version: int, module: torch.nn.Module) -> list[tuple[dict[str, Any], Message]]:
    """The WEIGHTS messages the trainer sends for one version (each encoding's first part's fields, and every part)."""
    layout, nbytes = flat_layout(module)
    flat = np.zeros(nbytes, np.uint8)
    snapshot_into(module, layout, flat)
    out = []
    for encoded in encoder.encode("policy", version, flat, layout):
        for msg in weight_parts("trainer", "abcd", version, version, encoded.data.copy(), layout, 4096, encoded.fields):
            out.append((encoded.fields, decode(encode(msg))))
    return out


def _flat(module: torch.nn.Module) -> np.ndarray:
    layout, nbytes = flat_layout(module)
    flat = np.zeros(nbytes, np.uint8)
    snapshot_into(module, layout, flat)
    return flat


@pytest.mark.parametrize("setting", ["float32", "float16", "bfloat16", "int8", "delta", "auto"])
def test_each_format_decodes_into_the_worker_module_as_its_encoding_says(setting: str) -> None:
    # The receiver gets each version in one format (as the server picks); its module then holds exactly what that
    # format's encoding decodes to: float32 and deltas bit-exact, lossy formats within their promise.
    versions = _versions(4)
    for fmt in formats_for(setting):
        encoder = WeightEncoder(setting, 1.0)  # each format's worker sees the trainer's versions from the first
        rx = WeightReceiver(versions[0], copy.deepcopy(versions[0]), -1, None)
        check = get_format(fmt).encoder(flat_layout(versions[0])[0])  # replays the trainer's encoder (int8's scales)
        for v, module in enumerate(versions, 1):
            sent = [(f, m) for f, m in _messages(encoder, v, module) if f["format"] == fmt]
            deltas = [m for f, m in sent if "base" in f]
            use = deltas if deltas and v > 1 else [m for f, m in sent if "base" not in f]
            assert (len(deltas) > 0) == (encoder.deltas and v > 1)
            for msg in use:
                rx(msg)
            assert rx.version == v and rx.counts["weights_rejected"] == 0
            expected = np.zeros_like(_flat(module))
            get_format(fmt).decode(check.encode(_flat(module)), flat_layout(module)[0], expected)
            swapped = rx.slot.swap(copy.deepcopy(versions[0]))
            assert swapped is not None
            got = _flat(swapped[2])
            assert got.tobytes() == expected.tobytes(), (fmt, v)
            if get_format(fmt).exact:
                assert got.tobytes() == _flat(module).tobytes()
        if not get_format(fmt).exact:  # the trainer measured it, within the promise's order
            assert 0 < encoder.max_errors[fmt] < 0.05


def test_a_version_the_worker_cannot_apply_is_refused_by_name_and_acked_with_need_full(
        caplog: pytest.LogCaptureFixture) -> None:
    encoder = WeightEncoder("delta", 1.0)
    versions = _versions(3)
    rx = WeightReceiver(versions[0], copy.deepcopy(versions[0]), -1, None)
    receivers = ModelReceivers({"policy": rx})
    for fields, msg in _messages(encoder, 1, versions[0]):
        if "base" not in fields:
            receivers(msg)
    assert rx.version == 1 and rx.encodings.held is not None and rx.encodings.held.version == 1
    v2 = _messages(encoder, 2, versions[1])
    v3 = _messages(encoder, 3, versions[2])
    [delta3] = [m for f, m in v3 if "base" in f]  # a delta against v2, which this worker never got
    receivers(delta3)
    assert rx.version == 1 and receivers.ack(delta3) == {"seqs": [3], "model": "policy", "format": "float32",
                                                          "need_full": True}
    assert "weights v3 are a delta against v2 in float32, but this worker holds v1 in float32" in caplog.text
    [delta2] = [m for f, m in v2 if "base" in f]
    rx.encodings.held.encoding[7] ^= 1  # a base that is not the trainer's: the crc after the delta tells
    receivers(delta2)
    assert rx.version == 1 and "crc" in caplog.text and receivers.ack(delta2)["need_full"] is True  # type: ignore
    for fields, msg in v3:  # the full version the server sends next
        if "base" not in fields:
            receivers(msg)
    assert rx.version == 3 and "need_full" not in (receivers.ack(msg) or {})
    odd = decode(encode(Message(MsgType.WEIGHTS, "trainer", policy_version=4, arrays={"chunk": np.zeros(8, np.uint8)},
                                body={**msg.body, "format": "float8", "part": 0, "parts": 1, "offset": 0,
                                      "nbytes": 8, "encoded": 8})))
    receivers(odd)
    assert "weights v4 come in the format 'float8', which this worker does not know (it knows float32, float16, " \
           "bfloat16, int8" in caplog.text
    assert receivers.ack(odd)["need_full"] is True  # type: ignore[index]
    assert rx.counts["weights_need_full"] == 3 and rx.version == 3


def test_a_weight_beyond_float16s_range_goes_in_float32_for_that_version(caplog: pytest.LogCaptureFixture) -> None:
    big = _versions(1)[0]
    with torch.no_grad():
        next(big.parameters()).view(-1)[0] = 1e6  # beyond float16's 65504
    alone = WeightEncoder("float16", 1.0).encode("policy", 1, _flat(big), flat_layout(big)[0])
    assert [e.fields["format"] for e in alone] == ["float32"] and alone[0].data.tobytes() == _flat(big).tobytes()
    auto = WeightEncoder("auto", 1.0).encode("policy", 1, _flat(big), flat_layout(big)[0])
    assert [e.fields["format"] for e in auto] == ["int8", "float32"]  # float32 is sent anyway (smallest first)
    assert "weights v1 goes in float32 in place of float16" in caplog.text
    assert "weights v1 is not sent in float16" in caplog.text


def _sparse_versions(n: int, actor: torch.nn.Module) -> list[torch.nn.Module]:
    """``n`` versions of ``actor``, each changing a few weights (deltas between them are small)."""
    torch.manual_seed(1)
    out = []
    for i in range(n):
        with torch.no_grad():
            for p in actor.parameters():
                p.view(-1)[i % p.numel()] += 0.5
        out.append(copy.deepcopy(actor))
    return out


@pytest.mark.parametrize("setting", ["float32", "float16", "bfloat16", "int8", "delta", "auto"])
def test_each_format_reaches_a_worker_through_the_server(server: tuple[Server, zmq.Context], setting: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    srv, _ = server
    link = TrainerLink(NET, "trainer", new_session(), srv.trainer_port, 8, Deliveries(), None, weight_format=setting)
    w = worker(srv.worker_port)
    try:
        link.start()
        w.start()
        rx = w.weights
        assert rx is not None and w.net is not None and set(w.net.link.hello_extra["formats"]) >= {"int8", "float16"}
        versions = _sparse_versions(6, copy.deepcopy(w.actor))
        layout = flat_layout(versions[0])[0]
        replay = {name: get_format(name).encoder(layout) for name in formats_for(setting)}
        expected: dict[str, np.ndarray] = {}

        def publish(v: int) -> None:
            link.publish(versions[v - 1], v, v)
            if link.encoder is not None:
                assert link.encoder.wait(5)
            for name, enc in replay.items():  # what each format's worker must hold: the trainer's encoding, decoded
                out = np.zeros_like(_flat(versions[v - 1]))
                get_format(name).decode(enc.encode(_flat(versions[v - 1])), layout, out)
                expected[name] = out

        def holds(v: int) -> None:
            """The worker's module is the decoding of v's encoding in the format it came in."""
            wait_until(lambda: rx.version == v, 10, f"v{v} at the worker", poll=0.02)
            w.policy.swap()
            held = rx.encodings.held.format if rx.encodings.held is not None else "float32"
            assert _flat(w.actor).tobytes() == expected[held].tobytes(), (v, held)
            if get_format(held).exact:
                assert _flat(w.actor).tobytes() == _flat(versions[v - 1]).tobytes()

        publish(1)
        holds(1)
        if not sends_deltas(setting):
            return
        # a worker that missed versions: its ACK of v2 is held while v3..v5 are published, then a chain of deltas
        net, ack = w.net, w.net._ack_weights

        def ack_up_to_v1() -> None:  # (v1's ACK may still be on its way)
            if all(a["seqs"] == [1] for a in net.weights_acks):
                ack()

        monkeypatch.setattr(net, "_ack_weights", ack_up_to_v1)
        publish(2)
        wait_until(lambda: rx.version == 2, 10, "v2 at the worker", poll=0.02)
        received = rx.counts["weights_received"]
        for v in (3, 4, 5):
            publish(v)
        wait_until(lambda: srv.weights.newest_versions().get("policy") == 5, 10, "v5 at the server", poll=0.02)
        monkeypatch.undo()  # the next tick sends the ACK of v2
        holds(5)
        if setting == "delta":  # (auto: the server may find another format's full version smaller than the chain)
            assert rx.counts["weights_received"] - received == 3  # v3, v4 and v5, each a delta on the one before
        # need_full: the base the worker holds is not the trainer's (the crc after the delta tells), so it asks for
        # a full version, and the server sends one
        assert rx.encodings.held is not None
        rx.encodings.held.encoding[3] ^= 0xFF
        publish(6)
        holds(6)
        assert rx.counts["weights_need_full"] == 1
    finally:
        w.close()
        link.halt()


def test_a_float32_delta_chain_published_faster_than_the_worker_acks_is_pipelined_and_ends_bit_exact(
        server: tuple[Server, zmq.Context], monkeypatch: pytest.MonkeyPatch) -> None:
    srv, _ = server
    link = TrainerLink(NET, "trainer", new_session(), srv.trainer_port, 8, Deliveries(), None, weight_format="delta")
    w = worker(srv.worker_port)
    try:
        link.start()
        w.start()
        rx, net = w.weights, w.net
        assert rx is not None and net is not None
        versions = _sparse_versions(6, copy.deepcopy(w.actor))

        def publish(v: int) -> None:
            link.publish(versions[v - 1], v, v)
            assert link.encoder is not None and link.encoder.wait(5)

        publish(1)
        wait_until(lambda: srv.peers.worker_count() == 1 and srv.peers.workers()[0].version == 1, 10,
                   "v1 acknowledged", poll=0.02)
        monkeypatch.setattr(net, "_ack_weights", lambda: None)  # from now on the worker's ACKs wait
        for v in range(2, 6):
            publish(v)
        wait_until(lambda: rx.version == 5, 10, "v5 applied, with no ACK since v1", poll=0.02)
        st = srv.peers.workers()[0].models["policy"]
        assert [(s.version, s.base) for s in st.inflight] == [(2, 1), (3, 2), (4, 3), (5, 4)]  # deltas in flight
        publish(6)
        wait_until(lambda: srv.weights.newest_versions().get("policy") == 6, 10, "v6 at the server", poll=0.02)
        assert len(net.weights_acks) == 4 and st.streaming is None  # MAX_PIPELINE reached: v6 waits for an ACK
        monkeypatch.undo()  # the next tick sends the ACKs, in order
        wait_until(lambda: srv.peers.workers()[0].version == 6, 10, "v6 acknowledged", poll=0.02)
        w.policy.swap()
        assert _flat(w.actor).tobytes() == _flat(versions[5]).tobytes()
        assert rx.counts["weights_received"] == 6 and rx.counts["weights_need_full"] == 0
        assert rx.counts["weights_rejected"] == 0 and srv.stats["rejected"] == 0
    finally:
        w.close()
        link.halt()
