"""netrl's learners for the learning loop (loop.py): the three roles as processes, and the same
worker, memory, agent and training loop in one process (``netrl.local``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Literal

from benchmarks.learning.loop import Act, Progress, env_steps, no_policy
from netrl.config.sections import Config
from netrl.launch import spawn_role, stop_processes, write_config

POLL_S = 0.5  # how often a learner of processes reads its progress


class Processes:
    """netrl's server, trainer and worker(s) as processes on this machine, from ``cfg``.

    Env steps are counted from the first worker's episodes CSV (``count`` "episodes", which moves
    when an episode ends) or by the server (``count`` "server": the samples it accepted from every
    worker, through its status port). The policy is the one the first worker last received (the
    weights file it keeps)."""

    def __init__(self, cfg: Config, folder: Path, workers: tuple[str, ...] = ("bench",),
                 count: Literal["episodes", "server"] = "episodes") -> None:
        self.cfg, self.folder, self.workers, self.count = cfg, folder, workers, count
        self.episodes = cfg.run_dir / f"episodes_{workers[0]}.csv"
        self.policy_file = cfg.run_dir / f"worker_policy_{workers[0]}.pt"
        self.log = folder / "roles.log"
        self._actor: Any = None

    def learn(self, progress: Callable[[Progress], bool]) -> None:
        path = write_config(self.cfg, self.folder / "config.json")
        with self.log.open("wb") as logs:
            server = spawn_role("server", path, stdout=logs)
            procs = [spawn_role("trainer", path, stdout=logs)]
            procs += [spawn_role("worker", path, "--worker-id", w, stdout=logs,
                                 log_level="WARNING") for w in self.workers]
            try:
                self._follow(progress, [server, *procs], logs)
            finally:
                stop_processes(procs, then=[server])

    def _follow(self, progress: Callable[[Progress], bool], procs: list[Any],
                logs: IO[Any]) -> None:
        while True:
            if any(p.poll() is not None for p in procs):
                logs.flush()
                raise RuntimeError(f"a netrl process exited early; see {self.log}:\n"
                                   f"{self.log.read_text(errors='replace')[-3000:]}")
            steps = self._server_steps() if self.count == "server" else env_steps(self.episodes)
            if progress(Progress(steps, self._policy, self.episodes, self._env)):
                return
            time.sleep(POLL_S)

    def _server_steps(self) -> int:
        """Env steps the server has accepted from all workers (0 until its status port answers)."""
        from netrl.monitor.status import query_status

        try:
            status = query_status(self.cfg.server.status_port, 2.0)
        except Exception:  # the server is not listening yet
            return 0
        return sum(int(w["samples"]) for w in status["workers"])

    def _policy(self) -> Act | None:
        """The weights the first worker last received, in an actor of the pipeline's own."""
        from netrl.storage.weight_files import read_weights_file

        if not self.policy_file.exists():
            return None
        if self._actor is None:
            # the pipeline's own env gives the spaces: hidden observation entries, an action
            # buffer left out and env.transforms change them (and the drone is no env id)
            env = self._env()
            pipe = self._pipeline()
            self._actor = pipe.actor_module_cls(env.observation_space, env.action_space)
            env.close()
        state, _ = read_weights_file(self.policy_file)
        self._actor.load_state_dict(state)
        return Acting(self._actor)

    def _pipeline(self) -> Any:
        from netrl.pipelines.make import make_pipeline

        return make_pipeline(self.cfg)

    def _env(self) -> Any:
        """A new env of the run's pipeline, as its worker builds it (for a judge that plays it)."""
        return self._pipeline().env_cls()

    def trainer_summary(self) -> dict[str, float]:
        """The trainer's last ``trained_steps`` and ``samples`` (metrics.csv) and their ratio:
        a real-time env does not wait for a slow trainer, so variants may train unequally."""
        import csv

        metrics = self.cfg.run_dir / "metrics.csv"
        if not metrics.exists():
            return {}
        with metrics.open(newline="") as f:
            last = list(csv.DictReader(f))[-1:]
        if not last:
            return {}
        trained, samples = float(last[0]["trained_steps"]), float(last[0]["samples"])
        return {"trained_steps": trained, "samples": samples,
                "steps_per_sample": round(trained / samples, 2) if samples else 0.0}

    def problems(self) -> list[str]:
        """The roles' warnings and errors (their log lines at W and E), then what tells a
        learning failure from a delivery one: the weight versions the worker and the trainer
        last saved, and the trainer's last metrics (DQN's dead_units at 1: a dead network)."""
        lines = []
        if self.log.exists():
            lines = [line for line in self.log.read_text(errors="replace").splitlines()
                     if " W [" in line or " E [" in line]
        return lines + diagnosis(self.cfg.run_dir, self.workers[0])


METRICS = ("trained_steps", "samples", "policy_version", "return_mean", "epsilon", "q", "loss_q",
           "grad_norm", "dead_units")


def diagnosis(run_dir: Path, worker: str) -> list[str]:
    """The versions of the weights the worker and the trainer last saved, and the trainer's
    last metrics.csv line (the keys of METRICS it has)."""
    import csv
    import json

    out = []
    for name in (f"worker_policy_{worker}.pt", "policy.pt"):
        meta = run_dir / f"{name}.json"
        if meta.exists():
            version = json.loads(meta.read_text()).get("version")
            out.append(f"{name}: weights v{version}")
    metrics = run_dir / "metrics.csv"
    if metrics.exists():
        with metrics.open(newline="") as f:
            last = list(csv.DictReader(f))[-1:]
        if last:
            out.append("last metrics: " + ", ".join(f"{k} {last[0][k]}" for k in METRICS
                                                     if last[0].get(k) not in (None, "")))
    return out


class Acting:
    """One deterministic action of a netrl actor for one observation (an actor with extra outputs
    returns them beside the action: only the action is played). A recurrent actor's state is
    carried from step to step, as the worker carries it, and :meth:`reset` (before each episode)
    starts it again from its initial state: called without its state, a recurrent actor would
    act from the initial state at every step, a policy without memory."""

    def __init__(self, actor: Any) -> None:
        self.actor, self.state = actor, None
        self.recurrent = bool(actor.recurrent_state())

    def reset(self) -> None:
        self.state = None

    def __call__(self, obs: Any) -> Any:
        if self.recurrent:
            out = self.actor.act_(obs, test=True, state=self.state)
            self.state = out[1]
            return out[0]
        out = self.actor.act_(obs, test=True)
        return out[0] if isinstance(out, tuple) else out


class Local:
    """netrl's worker, memory, agent and training loop in this process, without the network
    (``netrl.local``): env steps are the worker's, counted as it produces them, and the run is
    judged on its training returns (the loop hands the worker the trainer's actor itself)."""

    def __init__(self, cfg: Config, seed: int) -> None:
        self.cfg, self.seed = cfg, seed

    def learn(self, progress: Callable[[Progress], bool]) -> None:
        import torch

        from netrl.local import run_local
        from netrl.memory.disk import close_ring_storage
        from netrl.pipelines.make import make_pipeline
        from netrl.trainer.trainer import Trainer
        from netrl.worker.worker import RolloutWorker

        torch.set_num_threads(self.cfg.torch_threads)
        torch.manual_seed(self.seed)
        pipeline = make_pipeline(self.cfg)
        episodes = self.cfg.run_dir / f"episodes_{self.cfg.worker.worker_id}.csv"
        stop = threading.Event()
        worker = RolloutWorker.from_config(self.cfg, pipeline)
        worker.episode_log_level = logging.DEBUG
        training = Trainer.from_config(self.cfg, pipeline).training_cls()

        def on_round(_: dict[str, Any]) -> None:
            if progress(Progress(worker.produced, no_policy, episodes)):
                stop.set()

        try:
            run_local(training, worker, stop, on_round)
        finally:  # memory.storage disk: the files go now, not whenever the memory is collected
            close_ring_storage(training.memory)

    def problems(self) -> list[str]:
        return []
