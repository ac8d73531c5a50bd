"""The trainer and the worker of the weights family (benchmarks/weights.py), each run as a process
of its own by the parent (``child_trainer``, ``child_worker``): a real TrainerLink publishing an
actor it trains for real between publications, and a real RolloutWorker that only receives weights.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import time
from typing import Any

import numpy as np

from benchmarks.common import report_loaded

OBS, ACT = 64, 8  # the actor: OBS -> hidden -> hidden -> mean and log-std of ACT actions


def spaces() -> tuple[Any, Any]:
    import gymnasium

    return (gymnasium.spaces.Box(-1, 1, (OBS,), np.float32),
            gymnasium.spaces.Box(-1, 1, (ACT,), np.float32))


def actor(hidden: int) -> Any:
    from netrl.agents.sac import MLPActor

    return MLPActor(*spaces(), hidden_sizes=(hidden, hidden))


def child_trainer(cfg_path: str, hidden: str, fmt: str, budget_s: str, interval: str,
                  seconds: str, steps: str) -> None:
    """A real TrainerLink publishing a trained actor every ``interval`` s for ``seconds`` s (after
    the parent's go), then keeping the link open until the parent stops it."""
    import torch

    from netrl.config.load import load_config
    from netrl.net.keys import client_keys
    from netrl.net.transport import new_session
    from netrl.trainer.delivery import Deliveries
    from netrl.trainer.trainer import TrainerLink

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = load_config(cfg_path)
    keys = client_keys(cfg.keys_dir, "trainer", "trainer") if cfg.security == "curve" else None
    budget = 0.0 if fmt == "float32" else float(budget_s)  # (float32 never reads a budget)
    link = TrainerLink(cfg.network, "trainer", new_session(), cfg.network.trainer_port, 8,
                       Deliveries(), None, None, keys, weight_format=fmt, weight_budget_s=budget)
    link.start()
    model = actor(int(hidden))
    optim = torch.optim.Adam(model.parameters(), lr=3e-4)
    teacher = torch.randn(OBS, ACT) / OBS ** 0.5  # a fixed target policy to regress on
    while not link.link.ready:
        time.sleep(0.01)
    print(json.dumps({"ready": True}), flush=True)
    sys.stdin.readline()  # the parent says go once the worker is connected
    start = time.time()
    version = trained = 0
    step_s: list[float] = []
    loss: torch.Tensor | None = None
    # as many versions as the raw row publishes
    while (due := start + version * float(interval)) < start + float(seconds):
        time.sleep(max(0.0, due - time.time()))
        if version:  # the first version is the initial actor
            t = time.perf_counter()
            for _ in range(int(steps)):
                obs = torch.rand(64, OBS) * 2 - 1
                act, _ = model(obs, test=True, with_logprob=False)
                loss = ((act - torch.tanh(obs @ teacher)) ** 2).mean()
                optim.zero_grad()
                loss.backward()
                optim.step()
                trained += 1
            step_s.append(time.perf_counter() - t)
        version += 1
        t0 = time.time()
        link.publish(model, version, trained)
        print(json.dumps({"v": version, "t0": t0, "loss": None if loss is None else loss.item()}),
              flush=True)
    median = statistics.median(step_s) if step_s else None
    print(json.dumps({"done": True, "train_s_median": median}), flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        sys.stdin.readline()  # the parent says stop once the worker has the newest version
    link.halt(2.0)


class StillEnv:
    """The worker's env: the actor's spaces, never stepped (the worker here only receives
    weights)."""

    def __init__(self) -> None:
        self.observation_space, self.action_space = spaces()

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        return np.zeros(OBS, np.float32), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        return np.zeros(OBS, np.float32), 0.0, False, False, {}

    def close(self) -> None:
        pass


def child_worker(cfg_path: str, hidden: str, host: str, port: str) -> None:
    """A real RolloutWorker connected through the link (the server at ``host``:``port``), printing
    when each weight version is loaded."""
    import torch

    from netrl.agents.sac import MLPActor
    from netrl.config.load import load_config
    from netrl.net.keys import client_keys
    from netrl.util import partial
    from netrl.worker.worker import RolloutWorker

    torch.set_num_threads(1)
    cfg = load_config(cfg_path)
    keys = client_keys(cfg.keys_dir, "worker", "far") if cfg.security == "curve" else None
    # no weights file (run_dir None): the figure is the time to a loaded actor
    worker = RolloutWorker(StillEnv, partial(MLPActor, hidden_sizes=(int(hidden), int(hidden))),
                           server_ip=host, server_port=int(port), worker_id="far",
                           network=cfg.network, keys=keys, run_dir=None)
    worker.start()
    assert worker.net is not None and worker.weights is not None
    while not worker.net.link.ready:
        time.sleep(0.01)
    report_loaded(worker, 0.01)  # polling faster only loads the machine


def child_raw_receiver(server_public: str, host: str, port: str) -> None:
    """The raw baseline's far end: a PAIR socket (CURVE) that answers each version with its number
    and arrival time, over the same link."""
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
    sock.curve_serverkey = server_public.encode()
    sock.connect(f"tcp://{host}:{port}")
    with contextlib.suppress(KeyboardInterrupt):
        while True:
            frames = sock.recv_multipart(copy=False)
            sock.send(json.dumps([int(frames[0].bytes), time.time()]).encode())


def child_raw_sender(server_public: str, server_secret: str, host: str, port: str, hidden: str,
                     seconds: str, interval: str, grace: str) -> None:
    """The raw baseline's near end: the actor's float32 bytes, PAIR to PAIR, a version every
    ``interval`` s for ``seconds`` s, the newest published sent once the one before arrived; prints
    the publications and arrivals as JSON."""
    import torch
    import zmq

    with torch.no_grad():
        state = actor(int(hidden)).state_dict().values()
        payload = np.concatenate([t.numpy().ravel() for t in state]).tobytes()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    sock.curve_server = True
    sock.curve_secretkey, sock.curve_publickey = server_secret.encode(), server_public.encode()
    sock.bind(f"tcp://{host}:{port}")
    print(json.dumps({"bound": True}), flush=True)  # the receiver connects once: one SYN
    sock.send_multipart([b"0", b"hello"])  # the connection and CURVE handshake, before the clock
    sock.recv()
    print(json.dumps({"ready": True}), flush=True)
    published: dict[int, float] = {}
    loaded: dict[int, float] = {}
    start = time.time()
    sent = version = 0
    while True:
        now = time.time()
        if now < start + float(seconds) and now >= start + version * float(interval):
            version += 1
            published[version] = now
        if version > sent and (sent == 0 or sent in loaded):
            sent = version
            sock.send_multipart([str(version).encode(), payload], copy=False)
        if sock.poll(5):
            v, t = json.loads(sock.recv())
            loaded[v] = t
        over = now - start - float(seconds)
        if over > 0 and ((sent == version and sent in loaded) or over > float(grace)):
            break
    print(json.dumps({"start": start, "published": published, "loaded": loaded,
                      "payload_bytes": len(payload)}), flush=True)
    ctx.destroy(0)
