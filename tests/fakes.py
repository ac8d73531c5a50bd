"""What tests share, in one place, so that no test file imports another: fake peers, sample buffers and weight
messages, small spaces and configs, a counting env with a batched actor, a server in a thread, and waiting for a
condition with a deadline."""

from __future__ import annotations

import ast
import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import gymnasium
import numpy as np
import torch
import zmq

from netrl.actor import ActorModule
from netrl.config.sections import Config, NetworkConfig
from netrl.launch import free_port, write_config
from netrl.net.keys import keygen
from netrl.protocol.messages import Message, MsgType
from netrl.protocol.wire import decode, encode
from netrl.samples import Buffer, EpisodeStats
from netrl.server.server import Server
from netrl.storage.segments import SegmentLog

T = TypeVar("T")
MakeServer = Callable[..., tuple[Server, zmq.Context]]  # the make_server fixture

# -- waiting ----------------------------------------------------------------------------------------------------


def wait_until(predicate: Callable[[], T], timeout: float, what: str, poll: float = 0.2) -> T:
    """Call ``predicate`` every ``poll`` seconds until it returns something true, and return that; fail after
    ``timeout`` seconds, naming ``what`` was awaited. (Use this, not a fixed sleep, before checking what a thread
    or a process does: a fixed pause is too short on a loaded machine and too long on an idle one.)"""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


# -- small spaces and configs -------------------------------------------------------------------------------------

OBS = gymnasium.spaces.Box(-1, 1, (3,), np.float32)
ACT = gymnasium.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32))

NET = NetworkConfig(heartbeat_interval_s=0.2, heartbeat_liveness=5)  # a silent peer is lost after 1 s
PATIENT_NET = NetworkConfig(heartbeat_interval_s=0.2, heartbeat_liveness=10)  # after 2 s: for peers that pause

# a trainer that trains for as long as the test runs, in short rounds
FAST_TRAINER = {"epochs": 100_000, "rounds": 1, "steps": 100, "start_training": 100, "worker_lead": 300,
                "update_model_interval": 20}


def small_config(tmp_path: Path, **sections: Any) -> Path:
    """A config for fast tests: free ports, short training, wandb disabled, outputs under tmp_path."""
    keygen(tmp_path / "keys")  # tests run with the secure default: CURVE
    base: dict[str, Any] = {
        "run_name": "test", "weights_folder": str(tmp_path / "weights"), "seed": 1, "keys_dir": str(tmp_path / "keys"),
        "network": {"trainer_port": free_port(), "worker_port": free_port(), "heartbeat_interval_s": 0.2,
                    "heartbeat_liveness": 5, "reconnect_initial_s": 0.1, "reconnect_max_s": 1.0},
        "server": {"min_samples_per_server_packet": 20, "max_packet_delay_s": 0.02, "status_port": free_port()},
        "worker": {"min_samples_per_worker_packet": 10, "test_episode_interval": 0},
        "trainer": {"epochs": 1, "rounds": 2, "steps": 60, "update_model_interval": 20,
                    "update_buffer_interval": 10, "start_training": 100, "worker_lead": 50},
        "memory": {"memory_size": 10_000, "batch_size": 32},
        "agent": {"hidden_sizes": [32, 32]},
        "wandb": {"mode": "disabled"},
    }
    for name, values in sections.items():
        base.setdefault(name, {}).update(values) if isinstance(values, dict) else base.__setitem__(name, values)
    return write_config(Config(), tmp_path / "config.json", **base)


# a user's own pipeline module, config.json's env.pipeline "my_pipeline:build"
OWN_PIPELINE = '''
import gymnasium, numpy as np
from netrl.agents.sac import MLPActor, MLPActorCritic, SACAgent
from netrl.memory import ReplayMemory
from netrl.pipelines.base import Pipeline
from netrl.util import partial


class Drift(gymnasium.Env):
    """The user's env: its one setting comes from config.json's env.kwargs."""
    observation_space = gymnasium.spaces.Box(-10, 10, (2,), np.float32)
    action_space = gymnasium.spaces.Box(-1, 1, (1,), np.float32)

    def __init__(self, drift):
        self.drift, self.t = drift, 0

    def reset(self, seed=None, options=None):
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        obs = np.array([self.drift, self.t / 10], np.float32)
        return obs, -float(abs(action[0] - self.drift)), False, self.t >= 5, {}


def build(cfg):
    return Pipeline(env_cls=partial(Drift, drift=cfg.env.kwargs["drift"]),
                    actor_module_cls=partial(MLPActor, hidden_sizes=(8,)), memory_cls=ReplayMemory,
                    training_agent_cls=partial(SACAgent, model_cls=partial(MLPActorCritic, hidden_sizes=(8,))))


def not_a_pipeline(cfg):
    return {"env_cls": Drift}
'''


# -- samples and weights ------------------------------------------------------------------------------------------


def sample_buffer(n: int = 5, image: bool = False) -> Buffer:
    """A packet of ``n`` rows (reset first, terminated last) with two episode summaries; its observations are a
    tuple of 3 and 2 floats, or 4x16x16 uint8 image stacks."""
    rng = np.random.default_rng(0)
    if image:  # image-like: a flat background with a bright moving square
        frames = np.full((n, 4, 16, 16), 30, np.uint8)
        for i in range(n):
            frames[i, :, i % 12: i % 12 + 4, 5:9] = 220
    obs = (frames if image
           else (rng.normal(size=(n, 3)).astype(np.float32), rng.normal(size=(n, 2)).astype(np.float32)))
    return Buffer(
        act=rng.normal(size=(n, 2)).astype(np.float32), obs=obs, rew=rng.normal(size=n).astype(np.float32),
        terminated=np.arange(n) == n - 1, truncated=np.zeros(n, bool), reset=np.arange(n) == 0,
        context=np.zeros(n, bool), policy_version=np.arange(n, dtype=np.int64),
        episodes=[EpisodeStats(-12.5, 200, False, 3), EpisodeStats(-1.0, 5, True, 4)],
    )


def weights_message(version: int, session: str = "t", sender: str = "trainer", value: float | None = None) -> Message:
    """A one-part WEIGHTS message holding one tensor "w" of three floats (all equal to ``value`` or ``version``)."""
    flat = np.full(3, version if value is None else value, np.float32).view(np.uint8)
    return Message(MsgType.WEIGHTS, sender, policy_version=version, arrays={"chunk": flat},
                   body={"trained_steps": version, "session": session, "part": 0, "parts": 1, "offset": 0,
                         "nbytes": flat.nbytes, "layout": [["w", "<f4", [3], 0]]})


# -- envs and actors for many envs per worker -----------------------------------------------------------------------


class Counter(gymnasium.Env):  # type: ignore[type-arg]
    """obs = [tag, episode, t]; env ``tag`` ends its episodes after ``LENGTHS[tag]`` steps. Its step refuses an action
    that is not its own tag (the batched actor returns each env's tag), so a row given to the wrong env fails."""

    LENGTHS = (3, 5, 4)
    made: list[Counter] = []

    def __init__(self) -> None:
        self.tag = len(Counter.made)
        Counter.made.append(self)
        self.length = self.LENGTHS[self.tag % len(self.LENGTHS)]
        self.observation_space = gymnasium.spaces.Box(-1e6, 1e6, (3,), np.float32)
        self.action_space = gymnasium.spaces.Box(-1e6, 1e6, (1,), np.float32)
        self.ep, self.t = -1, 0

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.ep, self.t = self.ep + 1, 0
        return self._obs(), {}

    def _obs(self) -> np.ndarray:
        return np.array([self.tag, self.ep, self.t], np.float32)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        assert action.shape == (1,) and action[0] == self.tag, (action, self.tag)
        self.t += 1
        return self._obs(), 1.0, self.t >= self.length, False, {}


class TagActor(ActorModule):
    """Acts each env's tag, for a whole batch; counts its calls and their test flags."""

    def __init__(self, observation_space: Any, action_space: Any) -> None:
        super().__init__(observation_space, action_space)
        self.p = torch.nn.Parameter(torch.zeros(1))
        self.calls: list[tuple[int, bool]] = []

    def act(self, obs: Any, test: bool = False) -> np.ndarray:
        self.calls.append((obs.shape[0], test))
        return obs[:, :1].numpy().copy()


# -- a server in a thread, and fake peers ------------------------------------------------------------------------


@contextlib.contextmanager
def running_server(**kwargs: Any) -> Iterator[tuple[Server, zmq.Context]]:
    """A Server on free ports (unless given) in a thread of this process, plus a context for fake peers; both closed
    after. Tests take the ``server`` or ``make_server`` fixture; this is for the few that stop a server mid-test."""
    srv = Server(**{"trainer_port": free_port(), "worker_port": free_port(), **kwargs})
    srv.open()  # bound before this returns: a test that starts two servers knows which one got a port first
    stop = threading.Event()
    thread = threading.Thread(target=srv.run, args=(stop,), daemon=True)
    thread.start()
    ctx = zmq.Context()
    try:
        yield srv, ctx
    finally:
        stop.set()
        thread.join(5)
        ctx.destroy(0)
        assert not thread.is_alive(), "server did not stop within 5 s"


class Peer:
    """A raw DEALER speaking the wire protocol, for driving the server by hand."""

    def __init__(self, ctx: zmq.Context, port: int, role: str, name: str, rid: bytes | None = None) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if rid is not None:
            self.sock.setsockopt(zmq.ROUTING_ID, rid)
        self.sock.connect(f"tcp://127.0.0.1:{port}")
        self.role, self.name, self.session = role, name, os.urandom(4).hex()

    def send(self, msg: Message) -> None:
        self.sock.send_multipart(encode(msg))

    def hello(self, role: str | None = None) -> Message:
        self.send(Message(MsgType.HELLO, self.name, body={"role": role or self.role, "netrl_version": "0.1.0",
                                                          "worker_id": self.name, "session": self.session}))
        return self.expect(MsgType.WELCOME, MsgType.REJECT)

    def recv(self, timeout: float = 2.0) -> Message | None:
        if not self.sock.poll(int(timeout * 1000)):
            return None
        return decode(self.sock.recv_multipart())

    def expect(self, *types: MsgType, timeout: float = 2.0) -> Message:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = self.recv(deadline - time.monotonic())
            if msg is not None and msg.type in types:
                return msg
        raise AssertionError(f"{self.name} got no {[t.value for t in types]} within {timeout} s")


# -- on disk ----------------------------------------------------------------------------------------------------


def flip_byte(log: SegmentLog, index: int, back: int = 3) -> Path:
    """Flip one byte inside the data of the ``index``-th record of ``log`` (closed), as a failing disk would."""
    record = list(log.read())[index]
    path = log.dir / f"{record.position.segment:08d}.seg"
    data = bytearray(path.read_bytes())
    data[record.next.offset - back] ^= 0xFF
    path.write_bytes(bytes(data))
    return path


def upto(min_steps: int, max_bytes: int) -> Callable[[int, int, int, int, int, int], bool]:
    """A bundling rule for Spool.take: at least ``min_steps`` samples, then more while they fit in ``max_bytes``."""
    return lambda count, steps, nbytes, size, inflated, next_inflated: steps < min_steps or nbytes + size <= max_bytes


def imported_modules(node: ast.AST) -> list[str] | None:
    """The modules an ``import`` or ``from ... import`` statement names (None for any other node)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        return [node.module or ""]
    return None


class ListSource:
    """A SampleSource that hands over a list of packets once, and keeps what was published, by version."""

    def __init__(self, bufs: list[Buffer]) -> None:
        self.bufs, self.published = bufs, {}  # type: list[Buffer], dict[int, dict[str, torch.Tensor]]

    def fetch(self) -> list[Buffer]:
        out, self.bufs = self.bufs, []
        return out

    def wait(self, timeout: float) -> None:
        pass

    def publish(self, actor: torch.nn.Module, version: int, trained_steps: int) -> None:
        self.published[version] = {k: v.clone() for k, v in actor.state_dict().items()}

    def progress(self, *args: Any) -> None:
        pass

    def taken_version(self) -> int:
        return -1
