"""Compiled training steps (``trainer.compile``) and the fused in-place updates
the built-in agents share.

Three modes, each agent taking a ``compile`` argument::

    none        eager PyTorch, as written (the default)
    compile     torch.compile of the agent's training step (see below): forward and backward run
                as generated kernels
    cudagraphs  the same, each graph also captured as a CUDA graph and replayed (torch.compile's
                "reduce-overhead"); CUDA only, refused elsewhere

DQN and PPO compile their *loss functions* (what turns a batch into losses): the backward pass of a
compiled loss is compiled with it, while the optimiser steps (fused Adam: one kernel per parameter
group) and the metrics stay eager. SAC compiles its *whole update* as one graph: the losses run
through :class:`Reparametrized`, their gradients come from :func:`torch.func.grad_and_value`,
the optimiser steps from :func:`adam_`, then the target update. On a CPU the MLP's matrix
products are most of a step; compiling the losses alone left the Python around them (autograd,
three optimisers) as slow as the element-wise work it saved. The batch goes in as tensors, so a
memory's prioritised ``weight`` or a sequence batch's ``extra`` reaches the compiled code
unchanged. Compilation happens on the first steps (warm-up: tens of seconds on a CPU) and
again only if the shapes change (a batch of another size), or after a checkpoint is loaded
(new optimiser state tensors).

Every parameter the compiled functions read must keep its storage: state is restored with ``copy_``
(checkpoints, the undo of a non-finite step), never by assigning new tensors, and target networks
move in place (:func:`polyak_` and :func:`copy_params_`), which CUDA graphs require.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, Literal, NamedTuple, TypeVar, cast, get_args

import torch
from torch import nn
from torch.optim.adam import adam as functional_adam

__all__ = ["COMPILE_MODES", "AdamState", "CompileMode", "Reparametrized", "adam_", "adam_state", "check_compile",
           "compile_fn", "compile_kwargs", "copy_params_", "module_tensors", "polyak_", "step_begin", "to_floats"]

CompileMode = Literal["none", "compile", "cudagraphs"]
COMPILE_MODES: tuple[str, ...] = get_args(CompileMode)

F = TypeVar("F", bound=Callable[..., Any])


def check_compile(mode: str, device: str | torch.device, owner: str = "trainer.compile") -> None:
    """ValueError naming ``owner`` when ``mode`` is unknown, or is cudagraphs on a
    device that is not CUDA."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"{owner} must be one of "
                         f"{', '.join(map(repr, COMPILE_MODES))} (got {mode!r})")
    if mode == "cudagraphs":
        kind = torch.device(device).type
        if kind != "cuda":
            raise ValueError(f"{owner} 'cudagraphs' captures CUDA graphs, but the "
                             f"training device is {kind!r} (trainer.device): use "
                             f"'compile' on a {kind}, or train on a CUDA device")
        if not torch.cuda.is_available():
            raise ValueError(f"{owner} 'cudagraphs' needs CUDA, which this "
                             f"torch ({torch.__version__}) does not see: use "
                             f"'compile', or install a CUDA build of torch")


def compile_fn(fn: F, mode: CompileMode) -> F:
    """``fn`` itself (none), or torch.compile'd (compile), or compiled with CUDA
    graph capture (cudagraphs)."""
    if mode == "none":
        return fn
    # dynamic=False: a training batch keeps its shape, and static shapes give the fastest kernels
    return cast(F, torch.compile(fn, dynamic=False, mode="reduce-overhead" if mode == "cudagraphs" else None))


def step_begin(mode: CompileMode) -> None:
    """Call at the start of each training step: tells CUDA graph trees that the previous
    step's outputs are done with, so their memory may be reused (without it, reading an output
    after the next replay raises)."""
    if mode == "cudagraphs":
        torch.compiler.cudagraph_mark_step_begin()  # type: ignore[no-untyped-call]


def compile_kwargs(agent_cls: Callable[..., Any], mode: str, device: str) -> dict[str, Any]:
    """The keyword arguments that give ``agent_cls`` the ``trainer.compile`` mode: none for "none"
    (an agent need not know about compilation), else ``{"compile": mode}``; ValueError when the
    agent takes no ``compile``."""
    check_compile(mode, device)
    if mode == "none":
        return {}
    preset = getattr(agent_cls, "keywords", None) or {}  # a functools.partial's
    if "compile" in preset:
        return {}  # set in the partial; the agent checks it
    name = getattr(getattr(agent_cls, "func", agent_cls), "__name__", repr(agent_cls))
    try:
        params = inspect.signature(agent_cls).parameters.values()
    except (TypeError, ValueError):
        params = None
    if params is not None and not any(p.name == "compile" or p.kind is inspect.Parameter.VAR_KEYWORD
                                      for p in params):
        raise ValueError(f"trainer.compile is {mode!r}, but {name} takes no compile "
                         f"argument (the built-in SACAgent, DQNAgent and PPOAgent do): set "
                         f"trainer.compile to 'none', or give the agent a compile argument")
    return {"compile": mode}


@torch.no_grad()
def polyak_(targets: list[torch.Tensor], sources: list[torch.Tensor], polyak: float) -> None:
    """``target <- polyak * target + (1 - polyak) * source`` for every pair, in place, in
    one fused call."""
    torch._foreach_lerp_(targets, sources, 1.0 - polyak)


@torch.no_grad()
def copy_params_(targets: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """``target <- source`` for every pair, in place, in one fused call (a hard target update)."""
    torch._foreach_copy_(targets, sources)


def module_tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    """The parameters and buffers of ``module``, in ``state_dict`` order:
    what a target copy holds."""
    return list(module.state_dict(keep_vars=True).values())


def to_floats(values: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """Scalar tensors (all on one device) as floats, with one device synchronisation
    instead of one per metric."""
    floats = torch.stack([v.detach().reshape(()).float() for v in values.values()]).tolist()
    return dict(zip(values, floats, strict=True))


class Reparametrized(nn.Module):
    """Calls ``fn`` with ``modules`` as its submodules, so that :func:`torch.func.functional_call`
    can run ``fn`` (a loss reading those modules) on other parameters, named
    ``"<module>.<parameter>"``: what :func:`torch.func.grad_and_value` differentiates, the loss
    being written once for eager and compiled steps."""

    def __init__(self, fn: Callable[..., Any], **modules: nn.Module) -> None:
        super().__init__()
        self.fn = fn
        for name, module in modules.items():
            self.add_module(name, module)

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


class AdamState(NamedTuple):
    """One ``torch.optim.Adam``'s parameters and per-parameter state, as the lists
    its functional form takes."""

    params: list[torch.Tensor]
    exp_avgs: list[torch.Tensor]
    exp_avg_sqs: list[torch.Tensor]
    steps: list[torch.Tensor]


def adam_state(optimizer: torch.optim.Adam, params: list[torch.Tensor] | None = None) -> AdamState:
    """The tensors of ``optimizer`` (for ``params`` only, when given: those it steps), their state
    created as its first ``step()`` would create it where there is none yet. Read it again after
    ``optimizer.load_state_dict``, which replaces the state tensors."""
    if params is None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
    for p in params:
        state = optimizer.state[p]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    states = [optimizer.state[p] for p in params]
    return AdamState(params, [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
                     [s["step"] for s in states])


def adam_(optimizer: torch.optim.Adam, state: AdamState, grads: list[torch.Tensor]) -> None:
    """``optimizer.step()`` with ``grads`` as the gradients of ``state.params``, in place, through
    torch's own functional Adam (one parameter group, no amsgrad), written element by element
    for the compiler to fuse."""
    (group,) = optimizer.param_groups
    if group["amsgrad"]:
        raise ValueError("adam_ does not implement amsgrad: use "
                         "Adam(amsgrad=False) or step the optimiser eagerly")
    beta1, beta2 = group["betas"]
    functional_adam(state.params, grads, state.exp_avgs, state.exp_avg_sqs, [], state.steps, foreach=False,
                          amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"],
                          eps=group["eps"], maximize=group["maximize"],
                          decoupled_weight_decay=group.get("decoupled_weight_decay", False))
