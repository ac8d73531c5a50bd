"""Deploy a trained policy without a server: load policy.pt into the actor and run test episodes.

A trainer saves its policy to ``<run folder>/policy.pt`` (a ``state_dict``, read with ``torch.load(...,
weights_only=True)``) and ``policy.pt.json`` (its version). Deployment needs only the env, the actor class and that
file: no server, trainer or network. The policy comes from a training run, which must come first:
the demo (``python -m netrl --demo``) writes ``weights/pendulum-sac/policy.pt``,
``tmrl_tutorial_learn.py`` writes ``weights/tutorial/policy.pt``. Usage::

    python examples/deploy_policy.py weights/tutorial/policy.pt                 # the drone of tmrl_tutorial.py
    python examples/deploy_policy.py weights/pendulum-sac/policy.pt --config config.json  # any python -m netrl run
    python examples/deploy_policy.py weights/tutorial/policy.pt --random        # random actions, to compare
    python examples/deploy_policy.py weights/tutorial/policy.pt --worker        # through RolloutWorker(standalone=True)

``--config`` builds the env and the actor from that config's ``env.pipeline`` (a built-in one, or your own
"module:function", imported from the folder you start in); without it, they come from ``--module``'s ``env_cls``
and ``actor_module_cls`` (default: tmrl_tutorial, beside this file). The plain loop below is what to copy onto a
robot; ``--worker`` runs the same episodes through netrl's worker, which also checks the env and times its steps.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

Episode = dict[str, Any]  # rewards (one per step), terminated


def evaluate(env_cls: Callable[[], Any], actor_module_cls: Callable[..., Any], policy: str | Path | None,
             episodes: int, seed: int = 1000, obs_preprocessor: Callable[[Any], Any] | None = None) -> list[Episode]:
    """Run ``episodes`` test episodes of the policy saved in ``policy`` (None: uniformly random actions), each
    reset with its own seed (``seed``, ``seed + 1``...), so that two policies meet the same targets."""
    env = env_cls()
    actor = actor_module_cls(env.observation_space, env.action_space)
    if policy is not None:
        actor.load_state_dict(torch.load(policy, map_location="cpu", weights_only=True))
    actor.eval()
    rng = np.random.default_rng(seed)
    results: list[Episode] = []
    try:
        for episode in range(episodes):
            obs, _ = env.reset(seed=seed + episode)
            rewards: list[float] = []
            while True:
                if policy is None:
                    act = rng.uniform(env.action_space.low, env.action_space.high).astype(env.action_space.dtype)
                else:  # act_ takes one observation and returns one action, as a worker calls it
                    act = actor.act_(obs_preprocessor(obs) if obs_preprocessor else obs, test=True)
                obs, rew, terminated, truncated, _ = env.step(act)
                rewards.append(float(rew))
                if terminated or truncated:
                    break
            results.append({"rewards": rewards, "terminated": bool(terminated)})
    finally:
        env.close()
    return results


def evaluate_with_worker(env_cls: Callable[[], Any], actor_module_cls: Callable[..., Any], policy: str | Path,
                         episodes: int, seed: int = 1000,
                         obs_preprocessor: Callable[[Any], Any] | None = None) -> list[tuple[float, int]]:
    """The same through a standalone RolloutWorker: (return, length) of each test episode."""
    from netrl import RolloutWorker

    worker = RolloutWorker(env_cls, actor_module_cls, obs_preprocessor=obs_preprocessor, model_path=str(policy),
                           standalone=True, seed=seed)
    try:
        stats = [worker.run_episode(test=True) for _ in range(episodes)]
    finally:
        worker.close()
    return [(s.ret, s.length) for s in stats if s is not None]


def classes(args: argparse.Namespace) -> tuple[Callable[[], Any], Callable[..., Any], Callable[[Any], Any] | None]:
    """The env class, the actor class and the observation preprocessor the policy was trained with."""
    if args.config:
        from netrl import load_config
        from netrl.pipelines import make_pipeline

        sys.path.insert(0, os.getcwd())  # as python -m netrl does: "module:function" pipelines live there
        pipe = make_pipeline(load_config(args.config, role="worker"))
        return pipe.env_cls, pipe.actor_module_cls, pipe.obs_preprocessor
    module = importlib.import_module(args.module)
    return module.env_cls, module.actor_module_cls, getattr(module, "obs_preprocessor", None)


# the run each example's policy comes from: deploying needs that run first
TRAINED_BY = {
    "tutorial": "examples/tmrl_tutorial_learn.py --minutes 5 (or tmrl_tutorial.py's three roles)",
    "pendulum-sac": "the demo, python -m netrl --demo (or ./scripts/demo.sh)",
    "reach": "the custom pipeline's demo, python -m netrl --demo in examples/custom_pipeline"}


def train_first(policy: Path) -> str:
    """What to run before deploying ``policy``: a trainer writes its run folder's policy.pt after
    every epoch and when it stops, so a policy exists only once a run has trained."""
    run = TRAINED_BY.get(policy.parent.name, "a trainer (python -m netrl --demo, or --trainer with "
                                             "a server and a worker) with the same run_name")
    return (f"deploying needs a trained policy, so train one first: {run} writes {policy} after "
            f"every epoch and when you stop it (Ctrl+C), relative to the folder it starts in "
            f"(you are in {Path.cwd()})")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("policy", help="the policy file, e.g. weights/tutorial/policy.pt")
    p.add_argument("--config", help="a netrl config.json: its pipeline gives the env and the actor")
    p.add_argument("--module", default="tmrl_tutorial", help="else a module with env_cls and actor_module_cls")
    p.add_argument("--episodes", type=int, default=10)
    p.add_argument("--seed", type=int, default=1000, help="the first episode's reset seed")
    p.add_argument("--random", action="store_true", help="random actions instead of the policy")
    p.add_argument("--worker", action="store_true", help="run the policy through RolloutWorker(standalone=True)")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(1)  # one observation at a time: more threads only add overhead
    policy = Path(args.policy)
    if not args.random and not policy.is_file():
        p.error(f"{policy} does not exist: {train_first(policy)}")
    env_cls, actor_module_cls, obs_preprocessor = classes(args)
    sidecar = policy.with_name(policy.name + ".json")
    version = json.loads(sidecar.read_text()).get("version") if sidecar.is_file() and not args.random else None
    label = "random actions" if args.random else f"{policy} (version {version})"
    if args.worker and not args.random:
        returns, lengths = zip(*evaluate_with_worker(env_cls, actor_module_cls, policy, args.episodes, args.seed,
                                                     obs_preprocessor), strict=True)
        terminated = None
    else:
        episodes = evaluate(env_cls, actor_module_cls, None if args.random else policy, args.episodes, args.seed,
                            obs_preprocessor)
        returns = tuple(sum(e["rewards"]) for e in episodes)
        lengths = tuple(len(e["rewards"]) for e in episodes)
        terminated = float(np.mean([e["terminated"] for e in episodes]))
    for i, (ret, length) in enumerate(zip(returns, lengths, strict=True)):
        print(f"episode {i + 1}: return {ret:.3f} in {length} steps")
    summary = {"policy": label, "episodes": len(returns), "mean_return": round(float(np.mean(returns)), 4),
               "mean_length": round(float(np.mean(lengths)), 2), "terminated": terminated}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
