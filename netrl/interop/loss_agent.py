"""TorchRLAgent: a TorchRL loss module (``SACLoss``, ``DQNLoss``, ...) as a netrl
:class:`~netrl.agents.base.TrainingAgent`.

It trains on netrl's batches laid out by :func:`~netrl.interop.tensordicts.to_tensordict`, steps
the loss's optimisers and its target updater, returns the loss terms as metrics (and the new
priorities of a prioritized memory's samples), and publishes the policy it wraps as a
:class:`~netrl.interop.policies.TensorDictActor`. The training loop builds it from the spaces, so a
pipeline passes factories for what depends on them::

    def make_loss(observation_space, action_space):      # -> a LossModule
        actor, qvalue = ...                               # TorchRL modules, as its examples do
        loss = SACLoss(actor, qvalue, num_qvalue_nets=2, target_entropy=-1.0)
        loss.make_value_estimator(gamma=0.99)
        return loss

    agent_cls = partial(TorchRLAgent, loss=make_loss,
                        optimizer=lambda loss: torch.optim.Adam(loss.parameters(), 3e-4),
                        updater=lambda loss: SoftUpdate(loss, tau=0.005))

One step, as TorchRL's SAC example runs it: ``loss(td)``, the sum of its ``loss_*`` terms
backpropagated once, every optimiser stepped (one over all parameters, or a dict of them, one per
loss term, each over its own parameters), then ``updater.step()``. ``state_dict`` holds the loss
module (its parameters, target parameters and entropy coefficient), the optimisers, the updater's
counter and the torch random state the loss samples from, so a run resumed from a checkpoint
trains on exactly as it would have.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium
import torch
from torchrl.objectives import LossModule
from torchrl.objectives.utils import TargetNetUpdater

from netrl.agents.base import TrainingAgent
from netrl.agents.compiled import to_floats
from netrl.interop.policies import TensorDictActor
from netrl.interop.tensordicts import DiscreteEncoding, to_tensordict
from netrl.memory.priority import PRIORITY_KEY

__all__ = ["TorchRLAgent"]

Optimizers = torch.optim.Optimizer | dict[str, torch.optim.Optimizer]


class TorchRLAgent(TrainingAgent):
    """A TorchRL loss as a netrl agent (see the module docstring).

    Args:
        observation_space, action_space, device: as the training loop passes them.
        loss: the ``LossModule``, or a factory ``(observation_space, action_space) -> LossModule``.
        optimizer: one optimiser, a dict ``{loss term: optimiser}`` (``{"loss_actor": ...,
            "loss_qvalue": ..., "loss_alpha": ...}``), or a factory ``loss -> either``.
        updater: the target updater (``SoftUpdate``/``HardUpdate``), a factory ``loss ->
            updater``, or None for a loss without target parameters.
        policy: what the workers run, if not the loss's own actor (``actor_network``, else
            ``value_network``): an exploration policy around it (``EGreedyModule``), sharing its
            parameters; a module or a factory ``loss -> module``.
        priority_key: where the loss writes each sample's priority (TorchRL's ``"td_error"``);
            returned to a prioritized memory (a batch with ``extra["index"]``).
        discrete: the policy's Discrete action encoding (:func:`to_tensordict`'s).
        extra_keys: the policy's out_keys that travel as extra outputs
            (:class:`~netrl.interop.policies.TensorDictActor`'s); None: all.

    Raises:
        ValueError: a trainable parameter of the loss is no optimiser's, an optimiser dict names a
            term the loss does not return, or the loss has no policy to publish and none is given.
    """

    def __init__(
        self,
        observation_space: gymnasium.Space,
        action_space: gymnasium.Space,
        device: str,
        loss: LossModule | Callable[[gymnasium.Space, gymnasium.Space], LossModule],
        optimizer: Optimizers | Callable[[LossModule], Optimizers],
        updater: TargetNetUpdater | Callable[[LossModule], TargetNetUpdater] | None = None,
        policy: torch.nn.Module | Callable[[LossModule], torch.nn.Module] | None = None,
        priority_key: str = "td_error",
        discrete: DiscreteEncoding = "one_hot",
        extra_keys: list[str] | None = None,
    ) -> None:
        super().__init__(observation_space, action_space, device)
        if not isinstance(loss, LossModule):
            loss = loss(observation_space, action_space)
        self.loss = loss.to(device)
        built: Any = optimizer
        if not _is_optimizers(optimizer):
            built = optimizer(self.loss)  # type: ignore[operator]
        # one optimiser is keyed "all": it steps on the sum of every term, as a dict's do
        self.optimizers: dict[str, torch.optim.Optimizer] = (
            dict(built) if isinstance(built, dict) else {"all": built}
        )
        _check_optimised(self.loss, self.optimizers)
        self.updater = (
            updater
            if updater is None or isinstance(updater, TargetNetUpdater)
            else updater(self.loss)
        )
        self.priority_key, self.discrete = priority_key, discrete
        if policy is not None and not isinstance(policy, torch.nn.Module):
            policy = policy(self.loss)
        policy = policy if policy is not None else _loss_policy(self.loss)
        self.actor = TensorDictActor(
            observation_space, action_space, policy=policy, discrete=discrete, extra_keys=extra_keys
        )
        self._terms_checked = False

    def train(self, batch: Any) -> dict[str, Any]:
        td = to_tensordict(batch, self.observation_space, self.action_space, self.discrete)
        out = self.loss(td)
        terms = {k: v for k, v in out.items() if k.startswith("loss")}
        if not self._terms_checked:
            self._check_terms(terms)
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=True)
        # one backward for all terms: over disjoint parameters, each gets its own term's gradient
        torch.autograd.backward(sum(t.sum() for t in terms.values()))
        for opt in self.optimizers.values():
            opt.step()
        if self.updater is not None:
            self.updater.step()
        metrics: dict[str, Any] = to_floats({k: v for k, v in out.items() if v.numel() == 1})
        if "index" in batch.extra:  # a prioritized memory's batch: its samples' new priorities
            priority = td.get(self.priority_key, None)
            if priority is None:
                raise ValueError(
                    f"{type(self.loss).__name__} wrote no {self.priority_key!r} for a "
                    f"prioritized memory's batch: pass the priority_key it writes"
                )
            metrics[PRIORITY_KEY] = priority.detach().reshape(batch.rew.shape)
        return metrics

    def _check_terms(self, terms: dict[str, torch.Tensor]) -> None:
        """Once: an optimiser dict's keys are loss terms the loss returns."""
        unknown = sorted(set(self.optimizers) - set(terms) - {"all"})
        if unknown:
            raise ValueError(
                f"the optimisers {unknown} name no loss term of {type(self.loss).__name__}, "
                f"which returns {sorted(terms)}: key them by those names"
            )
        self._terms_checked = True

    def get_actor(self) -> TensorDictActor:
        return self.actor

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "loss": self.loss.state_dict(),
            "optimizers": {k: opt.state_dict() for k, opt in self.optimizers.items()},
            "rng": torch.get_rng_state(),
        }
        if self.updater is not None:
            state["updater"] = dict(self.updater.state_dict())
        if torch.device(self.device).type == "cuda":
            state["cuda_rng"] = torch.cuda.get_rng_state(torch.device(self.device))
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(self.optimizers) != set(state["optimizers"]):  # checked before anything is loaded
            raise ValueError(
                f"the checkpoint's optimisers {sorted(state['optimizers'])} are not "
                f"this agent's {sorted(self.optimizers)}"
            )
        self.loss.load_state_dict(state["loss"])
        for k, opt in self.optimizers.items():
            opt.load_state_dict(state["optimizers"][k])
        if self.updater is not None and "updater" in state:
            self.updater.load_state_dict(state["updater"])
        torch.set_rng_state(state["rng"])
        if "cuda_rng" in state and torch.device(self.device).type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"], torch.device(self.device))


def _is_optimizers(value: Any) -> bool:
    return isinstance(value, torch.optim.Optimizer) or (
        isinstance(value, dict)
        and all(isinstance(v, torch.optim.Optimizer) for v in value.values())
    )


def _check_optimised(loss: LossModule, optimizers: dict[str, torch.optim.Optimizer]) -> None:
    """Every trainable parameter of the loss is some optimiser's: one left out would take
    gradients and never move (a dict that forgot ``loss_alpha``, say)."""
    stepped = {id(p) for opt in optimizers.values() for g in opt.param_groups for p in g["params"]}
    left = [n for n, p in loss.named_parameters() if p.requires_grad and id(p) not in stepped]
    if left:
        shown = ", ".join(left[:4]) + (f" and {len(left) - 4} more" if len(left) > 4 else "")
        raise ValueError(
            f"no optimiser steps the parameters {shown} of {type(loss).__name__}: give them one "
            f"(or set requires_grad False on those meant to stay fixed)"
        )


def _loss_policy(loss: LossModule) -> torch.nn.Module:
    """The loss's own policy: its actor, else its value network (DQN's QValueActor)."""
    for name in ("actor_network", "value_network"):
        module = getattr(loss, name, None)
        if isinstance(module, torch.nn.Module):
            return module
    raise ValueError(
        f"{type(loss).__name__} has neither an actor_network nor a value_network to "
        f"publish: pass policy= (the module the workers run)"
    )
