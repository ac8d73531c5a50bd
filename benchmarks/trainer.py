"""Trainer speed: SAC gradient steps/s through netrl's real training loop, per ``trainer.compile`` mode, beside the
same SAC as a plain single-file script (CleanRL's structure), in the same run.

Rows:

* **mlp**: Pendulum-sized SAC (3 observations, 1 action, 256x256 MLPs), batch 256;
* **cnn**: the image pipeline's SAC (``CNNActorCritic``: 4 stacked 64x64 frames, 2 actions), batch 64.

Each netrl row runs :class:`netrl.training.loop.TrainingOffline` (the loop the Trainer runs, with
its safeguards and weight
publications) on a replay memory filled beforehand with random packets of those shapes, so it never waits for
samples, and reads the loop's own round metrics: ``steps_per_s``, ``train_fraction`` (inside ``agent.train``) and
``sample_fraction`` (inside ``memory.sample``). Time outside ``agent.train`` is ``1 - train_fraction``. The first
round is warm-up (compilation, for the compiled modes) and is reported as such, never counted in steps/s. The modes'
rounds run interleaved (eager round 1, compile round 1, CleanRL's round 1, eager round 2, ...) so that load from
other processes falls on all of them alike. ``cudagraphs`` needs CUDA; on a machine without it its rows say so.

    .venv/bin/python scripts/bench_trainer.py              # about 2 minutes on 2 idle CPU cores, compiling included
    .venv/bin/python scripts/bench_trainer.py --rows mlp --rounds 5 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import torch

from netrl.agents.cnn import CNNActorCritic
from netrl.agents.sac import MLPActorCritic, SACAgent
from netrl.memory.replay import ReplayMemory
from netrl.samples import Buffer
from netrl.training.loop import TrainingOffline
from netrl.util import partial

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/benchmarks, as bench.py finds it
from benchmarks import cleanrl_sac

MODES = ("none", "compile", "cudagraphs")
ROWS: dict[str, dict[str, Any]] = {
    "mlp": {"obs": gymnasium.spaces.Box(-1.0, 1.0, (3,), np.float32),
            "act": gymnasium.spaces.Box(-2.0, 2.0, (1,), np.float32), "model": MLPActorCritic, "batch": 256,
            "rows": 10_000, "steps": 300, "what": "SAC, MLP 256x256, Pendulum-sized, batch 256"},
    "cnn": {"obs": gymnasium.spaces.Box(0, 255, (4, 64, 64), np.uint8),
            "act": gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32), "model": CNNActorCritic, "batch": 64,
            "rows": 2_000, "steps": 60, "what": "SAC, image pipeline's CNN (4x64x64 frames), batch 64"},
}


class FilledSource:
    """A SampleSource that hands over its packets once and keeps the newest published actor (as a copy, as the
    Trainer's link serialises it)."""

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
        out.append(Buffer(
            act=rng.uniform(act_space.low, act_space.high, (n, *act_space.shape)).astype(np.float32), obs=obs,
            rew=rng.normal(size=n).astype(np.float32), terminated=rng.random(n) < 0.005, truncated=np.zeros(n, bool),
            reset=np.arange(n) == 0, context=np.zeros(n, bool), policy_version=np.zeros(n, np.int64),
            recv_version=1, worker="bench", seq=seq + 1))
    return out


def netrl_rows(name: str, modes: list[str], rounds: int, steps: int | None, device: str) -> list[dict[str, Any]]:
    spec = ROWS[name]
    steps = steps or spec["steps"]
    runs: dict[str, Any] = {}
    for mode in modes:
        if mode == "cudagraphs" and not device.startswith("cuda"):
            runs[mode] = None
            continue
        training = TrainingOffline(
            env_cls=(spec["obs"], spec["act"]), memory_cls=ReplayMemory,
            training_agent_cls=partial(SACAgent, model_cls=spec["model"]), epochs=1, rounds=rounds + 1, steps=steps,
            update_model_interval=20, update_buffer_interval=20, max_training_steps_per_env_step=1e9,
            start_training=0, device=device, memory_size=spec["rows"], batch_size=spec["batch"], seed=1,
            compile=mode)
        source = FilledSource(packets(spec, spec["rows"]))
        training.start(source)  # type: ignore[arg-type]
        runs[mode] = (training, training.run_epoch(source, threading.Event()), source)  # type: ignore[arg-type]
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    cleanrl = cleanrl_sac.rounds(steps, spec["batch"], device=device) if name == "mlp" else None
    cleanrl_rounds = []
    for _ in range(rounds + 1):  # interleaved: a burst of load hits every mode's round alike
        for mode, run in runs.items():
            if run is not None:
                results[mode].append(next(run[1]))
        if cleanrl is not None:  # CleanRL's script is an MLP SAC; its sizes and batch are the mlp row's
            cleanrl_rounds.append(next(cleanrl))
    rows = []
    for mode in modes:
        row: dict[str, Any] = {"row": name, "what": spec["what"], "mode": mode, "device": device}
        if runs[mode] is None:
            rows.append({**row, "note": "needs CUDA"})
            continue
        warm, steady = results[mode][0], results[mode][1:]
        wall = sum(r["wall_s"] for r in steady)
        train = sum(r["train_fraction"] * r["wall_s"] for r in steady)
        sample = sum(r["sample_fraction"] * r["wall_s"] for r in steady)
        rows.append({**row, "warmup_s": warm["wall_s"], "steps_per_s": sum(r["steps_per_s"] * r["wall_s"]
                                                                             for r in steady) / wall,
                     "round_steps_per_s": [round(r["steps_per_s"], 1) for r in steady],
                     "outside_train": 1 - train / wall, "sample_fraction": sample / wall,
                     "loss_critic": steady[-1].get("loss_critic")})
    if cleanrl_rounds:
        steady = cleanrl_rounds[1:]
        rows.append({"row": name, "what": spec["what"], "mode": "cleanrl", "device": device,
                     "steps_per_s": sum(r["steps_per_s"] * r["wall_s"] for r in steady) / sum(r["wall_s"]
                                                                                              for r in steady),
                     "round_steps_per_s": [round(r["steps_per_s"], 1) for r in steady]})
    eager = next((r["steps_per_s"] for r in rows if r["mode"] == "none" and "steps_per_s" in r), None)
    for r in rows:
        if eager and "steps_per_s" in r:
            r["vs_eager"] = r["steps_per_s"] / eager
    return rows


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = f", GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return (f"{cpu}, {os.cpu_count()} cores{gpu}; torch {torch.__version__}, {torch.get_num_threads()} torch "
            f"thread(s); Python {platform.python_version()}")


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| row | trainer.compile | warm-up (s) | gradient steps/s | vs eager | outside agent.train |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        if "note" in r:
            lines.append(f"| {r['what']} | {r['mode']} | | {r['note']} | | |")
        elif r["mode"] == "cleanrl":
            lines.append(f"| {r['what']} | CleanRL-structured single-file script (eager) | | {r['steps_per_s']:.1f} | "
                         f"{r['vs_eager']:.2f}x | |")
        else:
            outside = f"{100 * r['outside_train']:.1f}% (sample {100 * r['sample_fraction']:.1f}%)"
            lines.append(f"| {r['what']} | {r['mode']} | {r['warmup_s']:.1f} | {r['steps_per_s']:.1f} | "
                         f"{r['vs_eager']:.2f}x | {outside} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="mlp,cnn", help="comma-separated: mlp, cnn")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated trainer.compile modes")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds per mode (after one warm-up round)")
    parser.add_argument("--steps", type=int, default=None, help="gradient steps per round (default: per row)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (config.json torch_threads: 1)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"--modes: unknown {unknown}; choose among {', '.join(MODES)}")
    print(f"machine: {machine()}", flush=True)
    rows: list[dict[str, Any]] = []
    for name in [n for n in args.rows.split(",") if n]:
        if name not in ROWS:
            parser.error(f"--rows: unknown {name!r}; choose among {', '.join(ROWS)}")
        t0 = time.perf_counter()
        rows += netrl_rows(name, modes, args.rounds, args.steps, args.device)
        print(f"{name}: done in {time.perf_counter() - t0:.0f} s", flush=True)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
