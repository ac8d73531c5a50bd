"""Trainer speed: SAC gradient steps/s through netrl's real training loop, per ``trainer.compile``
mode, beside the same SAC as a plain single-file script (CleanRL's structure), in the same run.

Rows:

* **mlp**: Pendulum-sized SAC (3 observations, 1 action, 256x256 MLPs), batch 256;
* **cnn**: the image pipeline's SAC (``CNNActorCritic``: 4 stacked 64x64 frames, 2 actions),
  batch 64.

Each netrl row runs :class:`netrl.training.loop.TrainingOffline` (the loop the Trainer runs, with
its safeguards and weight publications) on a replay memory filled beforehand with random packets
of those shapes, so it never waits for samples, and reads the loop's own round metrics:
``steps_per_s``, ``train_fraction`` (inside ``agent.train``) and ``sample_fraction`` (inside
``memory.sample``). Time outside ``agent.train`` is ``1 - train_fraction``. The first round is
warm-up (compilation, for the compiled modes) and is reported as such, never counted in steps/s.
The modes' rounds run interleaved (eager round 1, compile round 1, CleanRL's round 1, eager round
2, ...) so that load from other processes falls on all of them alike. ``cudagraphs`` needs CUDA; on
a machine without it its rows say so. The baseline, CleanRL's SAC, is benchmarks/cleanrl_sac.py.
Target: ``compile`` at least 1.5x eager on the MLP.
"""

from __future__ import annotations

import argparse
import dataclasses
import threading
import time
from typing import Any

import gymnasium
import numpy as np
import torch

from benchmarks import cleanrl_sac
from benchmarks.results import Row
from benchmarks.settings import choose, names, positive
from netrl.agents.cnn import CNNActorCritic
from netrl.agents.sac import MLPActorCritic, SACAgent
from netrl.memory.replay import ReplayMemory
from netrl.samples import Buffer
from netrl.training.loop import TrainingOffline
from netrl.util import partial

MODES = ("none", "compile", "cudagraphs")
TARGET = 1.5  # compile against eager, the MLP row
ROWS: dict[str, dict[str, Any]] = {
    "mlp": {"obs": gymnasium.spaces.Box(-1.0, 1.0, (3,), np.float32),
            "act": gymnasium.spaces.Box(-2.0, 2.0, (1,), np.float32), "model": MLPActorCritic,
            "batch": 256, "rows": 10_000, "steps": 300,
            "what": "SAC, MLP 256x256, Pendulum-sized, batch 256"},
    "cnn": {"obs": gymnasium.spaces.Box(0, 255, (4, 64, 64), np.uint8),
            "act": gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32), "model": CNNActorCritic,
            "batch": 64, "rows": 2_000, "steps": 60,
            "what": "SAC, image pipeline's CNN (4x64x64 frames), batch 64"},
}


@dataclasses.dataclass(frozen=True)
class Settings:
    rows: tuple[str, ...] = tuple(ROWS)
    modes: tuple[str, ...] = MODES
    rounds: int = 3  # measured rounds per mode, after one warm-up round
    steps: int = 0  # gradient steps per round; 0: the row's own (MLP 300, CNN 60)
    device: str = "auto"  # auto: cuda where there is one, else cpu
    threads: int = 1  # torch threads (config.json's torch_threads: 1)

    def __post_init__(self) -> None:
        choose(self.rows, ROWS, "--rows")
        choose(self.modes, MODES, "--modes")
        positive("--rounds", self.rounds, 1, strict=False)
        positive("--steps", self.steps, strict=False)
        positive("--threads", self.threads, 1, strict=False)


SMOKE = Settings(rows=("mlp",), modes=("none",), rounds=1, steps=5)


def add_options(p: argparse.ArgumentParser) -> None:
    d = Settings()
    p.add_argument("--rows", type=names, help=f"which rows (default {','.join(d.rows)})")
    p.add_argument("--modes", type=names,
                   help=f"trainer.compile modes (default {','.join(d.modes)})")
    p.add_argument("--rounds", type=int, help=f"measured rounds per mode (default {d.rounds})")
    p.add_argument("--steps", type=int, help="gradient steps per round (default: the row's)")
    p.add_argument("--device", help="cpu, cuda, ... (default: cuda where there is one)")
    p.add_argument("--threads", type=int, help=f"torch threads (default {d.threads})")


class FilledSource:
    """A SampleSource that hands over its packets once and keeps the newest published actor (as a
    copy, as the Trainer's link serialises it)."""

    def __init__(self, packets: list[Buffer]) -> None:
        self.packets = packets
        self.published: dict[str, torch.Tensor] = {}

    def fetch(self) -> list[Buffer]:
        out, self.packets = self.packets, []
        return out

    def wait(self, timeout: float) -> None:
        time.sleep(min(timeout, 0.01))

    def publish(self, actor: torch.nn.Module, version: int, trained_steps: int) -> None:
        self.published = {k: v.detach().cpu().clone() for k, v in actor.state_dict().items()}

    def progress(self, trained_steps: int, samples: int, wanted: int) -> None:
        pass

    def taken_version(self) -> int:
        return -1


def packets(spec: dict[str, Any], rows: int, per_packet: int = 1000) -> list[Buffer]:
    rng = np.random.default_rng(1)
    out = []
    for seq in range(rows // per_packet):
        n = per_packet
        obs_space, act_space = spec["obs"], spec["act"]
        if obs_space.dtype == np.uint8:
            obs = rng.integers(0, 256, (n, *obs_space.shape), dtype=np.uint8)
        else:
            obs = rng.uniform(-1, 1, (n, *obs_space.shape)).astype(np.float32)
        act = rng.uniform(act_space.low, act_space.high, (n, *act_space.shape))
        out.append(Buffer(
            act=act.astype(np.float32), obs=obs, rew=rng.normal(size=n).astype(np.float32),
            terminated=rng.random(n) < 0.005,
            truncated=np.zeros(n, bool), reset=np.arange(n) == 0, context=np.zeros(n, bool),
            policy_version=np.zeros(n, np.int64), recv_version=1, worker="bench", seq=seq + 1))
    return out


def netrl_rows(name: str, modes: tuple[str, ...], rounds: int, steps: int | None,
               device: str) -> list[dict[str, Any]]:
    spec = ROWS[name]
    steps = steps or spec["steps"]
    runs: dict[str, Any] = {}
    for mode in modes:
        if mode == "cudagraphs" and not device.startswith("cuda"):
            runs[mode] = None
            continue
        training = TrainingOffline(
            env_cls=(spec["obs"], spec["act"]), memory_cls=ReplayMemory,
            training_agent_cls=partial(SACAgent, model_cls=spec["model"]), epochs=1,
            rounds=rounds + 1, steps=steps, update_model_interval=20, update_buffer_interval=20,
            max_training_steps_per_env_step=1e9, start_training=0, device=device,
            memory_size=spec["rows"], batch_size=spec["batch"], seed=1, compile=mode)
        source = FilledSource(packets(spec, spec["rows"]))
        training.start(source)
        rounds_of = training.run_epoch(source, threading.Event())
        runs[mode] = (training, rounds_of, source)
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    cleanrl = cleanrl_sac.rounds(steps, spec["batch"], device=device) if name == "mlp" else None
    cleanrl_rounds = []
    for _ in range(rounds + 1):  # interleaved: a burst of load hits every mode's round alike
        for mode, run in runs.items():
            if run is not None:
                results[mode].append(next(run[1]))
        if cleanrl is not None:  # CleanRL's script is an MLP SAC: the mlp row's sizes and batch
            cleanrl_rounds.append(next(cleanrl))
    rows = []
    for mode in modes:
        row: dict[str, Any] = {"row": name, "what": spec["what"], "mode": mode, "device": device,
                               "steps": steps}
        if runs[mode] is None:
            rows.append({**row, "note": "needs CUDA"})
            continue
        warm, steady = results[mode][0], results[mode][1:]
        wall = sum(r["wall_s"] for r in steady)
        train = sum(r["train_fraction"] * r["wall_s"] for r in steady)
        sample = sum(r["sample_fraction"] * r["wall_s"] for r in steady)
        rows.append({**row, "warmup_s": warm["wall_s"],
                     "steps_per_s": sum(r["steps_per_s"] * r["wall_s"] for r in steady) / wall,
                     "round_steps_per_s": [round(r["steps_per_s"], 1) for r in steady],
                     "outside_train": 1 - train / wall, "sample_fraction": sample / wall,
                     "loss_critic": steady[-1].get("loss_critic")})
    if cleanrl_rounds:
        steady = cleanrl_rounds[1:]
        wall = sum(r["wall_s"] for r in steady)
        rows.append({"row": name, "what": spec["what"], "mode": "cleanrl", "device": device,
                     "steps": steps,
                     "steps_per_s": sum(r["steps_per_s"] * r["wall_s"] for r in steady) / wall,
                     "round_steps_per_s": [round(r["steps_per_s"], 1) for r in steady]})
    eager = next((r["steps_per_s"] for r in rows if r["mode"] == "none" and "steps_per_s" in r),
                 None)
    for r in rows:
        if eager and "steps_per_s" in r:
            r["vs_eager"] = r["steps_per_s"] / eager
    return rows


def device_of(setting: str) -> str:
    """``auto``: CUDA where this machine has it, else the CPU."""
    if setting != "auto":
        return setting
    return "cuda" if torch.cuda.is_available() else "cpu"


def run(s: Settings) -> list[Row]:
    torch.set_num_threads(s.threads)
    device = device_of(s.device)
    gpu = f", GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    print(f"trainer: torch {torch.__version__}, {torch.get_num_threads()} torch thread(s), "
          f"device {device}{gpu}", flush=True)
    out = []
    for name in s.rows:
        t0 = time.perf_counter()
        for r in netrl_rows(name, s.modes, s.rounds, s.steps or None, device):
            out.append(_row(r, s, device))
        print(f"{name}: done in {time.perf_counter() - t0:.0f} s", flush=True)
    return out


def _row(r: dict[str, Any], s: Settings, device: str) -> Row:
    params = {"row": r["row"], "mode": r["mode"], "steps": r["steps"], "rounds": s.rounds,
              "device": device, "threads": s.threads}
    label = ("CleanRL-structured single-file script (eager)" if r["mode"] == "cleanrl"
             else f"trainer.compile {r['mode']}")
    if "note" in r:
        print(f"  {r['what']}, {label}: {r['note']}", flush=True)
        return Row("trainer", f"{r['what']}, {label}", "gradient steps/s", None, "steps/s",
                   params=params, detail=r)
    outside = (f", outside agent.train {r['outside_train']:.1%} (sample {r['sample_fraction']:.1%})"
               f", warm-up {r['warmup_s']:.1f} s" if "outside_train" in r else "")
    print(f"  {r['what']}, {label}: {r['steps_per_s']:.1f} steps/s, {r['vs_eager']:.2f}x "
          f"eager{outside}", flush=True)
    judged = r["row"] == "mlp" and r["mode"] == "compile"
    eager = r["steps_per_s"] / r["vs_eager"]
    return Row("trainer", f"{r['what']}, {label}", "gradient steps/s", r["steps_per_s"], "steps/s",
               eager, "trainer.compile none (eager)", r["vs_eager"], "x",
               f">= {TARGET:g}x" if judged else "", r["vs_eager"] >= TARGET if judged else None,
               params, r)
