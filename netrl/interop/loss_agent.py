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

Sequence batches (``memory.sequence_length`` > 1, ``[B, T]`` with a ``"mask"`` False at the padded
steps after a sequence's end): a loss over transitions (``SACLoss``, ``DQNLoss``...) trains on
the real steps only, ``td[mask]``, and a prioritized batch's TD errors go back per step (zeros at
the padding, which the memory skips). A recurrent loss (one whose modules hold an ``LSTMModule`` or
``GRUModule``) keeps ``[B, T]``, as TorchRL's recurrent losses take a ``SliceSampler``'s slices:
its modules run in recurrent mode from the state stored with each sequence's first step,
``("collector", "mask")`` (which TorchRL's losses reduce over) is False at the padding and at the
first ``burn_in`` steps, ``"is_init"`` is False (a netrl sequence never crosses an episode's start,
and a stored state is already zeros there), and ``("next", <state>)`` at step t is the state
stored with step t + 1 (where a value network reads the next observations from). A sequence with a
single real step has no stored next state: it is left out of the loss and counted
(``recurrent_steps_left_out``); its priorities are the TD errors of the steps learned from, zeros
elsewhere. TorchRL's losses have no burn-in of their own: here the burn-in steps run through the
recurrent modules with gradient, and only their loss terms are masked.
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
from netrl.interop.policies import TensorDictActor, recurrent_modules
from netrl.interop.tensordicts import DiscreteEncoding, ObservationKey, to_tensordict
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
        observation_key: where the loss's and the policy's modules read the observation
            (:func:`to_tensordict`'s): ``"pixels"``, or a Dict's entries mapped to keys.
        burn_in: a recurrent loss's first steps of each sequence that take no loss term (the
            memory's ``burn_in``; see the module docstring).

    Raises:
        ValueError: a trainable parameter of the loss is no optimiser's, an optimiser dict names a
            term the loss does not return, the loss has no policy to publish and none is given;
            in ``train``, a recurrent loss given a batch that is not a sequence batch.
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
        observation_key: ObservationKey = "observation",
        burn_in: int = 0,
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
            observation_space,
            action_space,
            policy=policy,
            discrete=discrete,
            extra_keys=extra_keys,
            observation_key=observation_key,
        )
        self.observation_key, self.burn_in = observation_key, burn_in
        self.recurrent = any(recurrent_modules(m) for m in _networks(self.loss))
        self._state_keys = list(self.actor.recurrent_state())
        self._terms_checked = False

    def train(self, batch: Any) -> dict[str, Any]:
        td = to_tensordict(
            batch, self.observation_space, self.action_space, self.discrete, self.observation_key
        )
        mask = batch.extra.get("mask")
        left_out = None
        if self.recurrent:
            td, left_out = self._sequences(td, mask)
            out = self.loss(td)
        elif mask is not None:  # transitions: the real steps only, not the padding
            td = td[mask]
            out = self.loss(td)
        else:
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
        if left_out is not None:
            metrics["recurrent_steps_left_out"] = left_out
        if "index" in batch.extra:  # a prioritized memory's batch: its samples' new priorities
            priority = td.get(self.priority_key, None)
            if priority is None:
                raise ValueError(
                    f"{type(self.loss).__name__} wrote no {self.priority_key!r} for a "
                    f"prioritized memory's batch: pass the priority_key it writes"
                )
            priority = priority.detach()
            if mask is not None and not self.recurrent:  # back to [B, T], zeros at the padding
                full = torch.zeros(batch.rew.shape, dtype=priority.dtype, device=priority.device)
                full[mask] = priority.reshape(-1)
                priority = full
            elif self.recurrent:  # a step that took no loss term gives no priority either
                learn = td.get(("collector", "mask"))
                priority = torch.where(learn, priority.reshape(learn.shape), 0.0)
            metrics[PRIORITY_KEY] = priority.reshape(batch.rew.shape)
        return metrics

    def _sequences(self, td: Any, mask: torch.Tensor | None) -> tuple[Any, float]:
        """A sequence batch as a recurrent loss takes it (module docstring), and how many real
        steps it leaves out."""
        if mask is None or td.ndim != 2:
            raise ValueError(
                f"{type(self.loss).__name__} holds recurrent modules, which need sequences "
                f"[B, T]: set memory.sequence_length > 1 (got a batch of shape "
                f"{tuple(td.batch_size)})"
            )
        size = td.batch_size
        # a one-step sequence has no stored state after its step (where the next values start)
        alone = ~mask[:, 1] if size[1] > 1 else torch.ones_like(mask[:, 0])
        learn = mask.clone()
        learn[:, : self.burn_in] = False
        learn[alone] = False
        td.set(("collector", "mask"), learn)
        no_init = torch.zeros(*size, 1, dtype=torch.bool, device=mask.device)
        td.set("is_init", no_init)
        td.set(("next", "is_init"), no_init)
        for key in self._state_keys:
            state = td.get(key)
            td.set(("next", key), torch.cat([state[:, 1:], state[:, -1:]], 1))
        left = mask & ~learn
        left[:, : self.burn_in] = False  # burn-in steps are not left out: they run unlearned
        return td, float(left.sum())

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


def _networks(loss: LossModule) -> list[torch.nn.Module]:
    """The loss's modules: its children, and the networks TorchRL's losses keep outside them
    (``value_network``, ``actor_network``... held as plain attributes, their parameters apart)."""
    found = [loss]
    found += [v for v in vars(loss).values() if isinstance(v, torch.nn.Module)]
    return found


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
