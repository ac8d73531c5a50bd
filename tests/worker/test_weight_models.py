"""Named models on the worker's side (issue 34): a version of each reaches its target through a real server, is
swapped in between env steps, and tagged on every row; a model the worker has no target for is refused by name."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
import torch
import zmq

from netrl.agents.sac import MLPActor
from netrl.envs.gym import GenericGymEnv
from netrl.launch import free_port
from netrl.protocol.messages import Message, MsgType
from netrl.protocol.weights import PART_BYTES, flat_layout, snapshot_into
from netrl.protocol.wire import buffer_from_message, decode, encode, weight_parts
from netrl.server.server import Server
from netrl.util import partial
from netrl.worker.link import WorkerLink
from netrl.worker.weight_receiver import ModelReceivers, WeightReceiver
from netrl.worker.worker import RolloutWorker
from tests.fakes import NET, Peer


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
        w._send_packet()
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
        assert w.version == -1 and net.weights_acks == {}  # not loaded into the actor, and not acknowledged
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
