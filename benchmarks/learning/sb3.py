"""Stable-Baselines3's learners for the learning loop (loop.py): its DQN and PPO with RL Zoo's
hyperparameters, in this process, as the baselines of the CartPole and PPO rows (rows.py).

Both need ``pip install -e .[bench]`` (stable-baselines3). A callback after every env step tells
the loop SB3's env steps (``num_timesteps``, all envs together) and hands it the model's
deterministic policy, so that SB3 is judged exactly as netrl is: evaluated at the first step past
each mark, by the same judge.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks.learning.loop import Act, Progress


def _callback(progress: Callable[[Progress], bool]) -> Any:
    """An SB3 callback that reports to ``progress`` and stops learning when it says so."""
    from stable_baselines3.common.callbacks import BaseCallback

    class Report(BaseCallback):  # type: ignore[misc]  # SB3 ships no type information
        def _on_step(self) -> bool:
            model = self.model

            def policy() -> Act:
                return lambda obs: model.predict(obs, deterministic=True)[0]

            return not progress(Progress(int(self.num_timesteps), policy))

    return Report()


class DQN:
    """SB3's DQN with RL Zoo's CartPole-v1 hyperparameters (``zoo``). RL Zoo's exploration_fraction
    0.16 is of its 50,000 steps; over the run's budget the same schedule is a smaller fraction."""

    def __init__(self, env_id: str, seed: int, max_steps: int, zoo: dict[str, Any]) -> None:
        self.env_id, self.seed, self.max_steps, self.zoo = env_id, seed, max_steps, zoo

    def learn(self, progress: Callable[[Progress], bool]) -> None:
        from stable_baselines3 import DQN as SB3DQN

        model = SB3DQN("MlpPolicy", self.env_id, seed=self.seed, verbose=0,
                       exploration_fraction=0.16 * 50_000 / self.max_steps, **self.zoo)
        model.learn(self.max_steps, callback=_callback(progress))

    def problems(self) -> list[str]:
        return []


class PPO:
    """SB3's PPO with RL Zoo's hyperparameters for the row's env (``zoo``: its ``n_envs`` and
    ``n_timesteps`` too; ``("lin", x)`` is RL Zoo's ``lin_x``, x times the fraction of n_timesteps
    left)."""

    def __init__(self, env_id: str, seed: int, max_steps: int, zoo: dict[str, Any]) -> None:
        self.env_id, self.seed, self.max_steps, self.zoo = env_id, seed, max_steps, zoo

    def learn(self, progress: Callable[[Progress], bool]) -> None:
        from stable_baselines3 import PPO as SB3PPO
        from stable_baselines3.common.env_util import make_vec_env

        zoo = dict(self.zoo)
        n_envs, n_timesteps = zoo.pop("n_envs"), zoo.pop("n_timesteps")
        for key in ("learning_rate", "clip_range"):
            if isinstance(zoo[key], tuple):
                start = zoo[key][1]
                zoo[key] = lambda remaining, start=start: remaining * start
        env = make_vec_env(self.env_id, n_envs=n_envs, seed=self.seed)
        model = SB3PPO("MlpPolicy", env, seed=self.seed, verbose=0, **zoo)
        # learn() over RL Zoo's n_timesteps, so that its linear schedules are RL Zoo's; the loop
        # stops it sooner
        model.learn(max(n_timesteps, self.max_steps), callback=_callback(progress))

    def problems(self) -> list[str]:
        return []
