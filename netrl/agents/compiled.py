"""Compiled training steps (``trainer.compile``) and the fused in-place updates the built-in agents share.

Three modes, each agent taking a ``compile`` argument::

    none        eager PyTorch, as written (the default)
    compile     torch.compile of the agent's loss functions: forward and backward run as generated kernels
    cudagraphs  the same, each graph also captured as a CUDA graph and replayed (torch.compile's
                "reduce-overhead"); CUDA only, refused elsewhere

An agent compiles its *loss functions* (what turns a batch into losses), not the whole ``train``: the backward pass
of a compiled loss is compiled with it, while the optimiser steps (fused Adam: one kernel per parameter group) and
the metrics stay eager. The batch goes in as tensors, so a memory's prioritised ``weight`` or a sequence batch's
``extra`` reaches the compiled code unchanged. Compilation happens on the first steps (warm-up: tens of seconds on
a CPU) and again only if the shapes change (a batch of another size).

Every parameter the compiled functions read must keep its storage: state is restored with ``copy_`` (checkpoints,
the undo of a non-finite step), never by assigning new tensors, and target networks move in place
(:func:`polyak_` and :func:`copy_params_`), which CUDA graphs require.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar, cast, get_args

import torch

__all__ = ["COMPILE_MODES", "CompileMode", "check_compile", "compile_fn", "compile_kwargs", "copy_params_",
           "module_tensors", "polyak_", "step_begin", "to_floats"]

CompileMode = Literal["none", "compile", "cudagraphs"]
COMPILE_MODES: tuple[str, ...] = get_args(CompileMode)

F = TypeVar("F", bound=Callable[..., Any])


def check_compile(mode: str, device: str | torch.device, owner: str = "trainer.compile") -> None:
    """ValueError naming ``owner`` when ``mode`` is unknown, or is cudagraphs on a device that is not CUDA."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"{owner} must be one of {', '.join(map(repr, COMPILE_MODES))} (got {mode!r})")
    if mode == "cudagraphs":
        kind = torch.device(device).type
        if kind != "cuda":
            raise ValueError(f"{owner} 'cudagraphs' captures CUDA graphs, but the training device is {kind!r} "
                             f"(trainer.device): use 'compile' on a {kind}, or train on a CUDA device")
        if not torch.cuda.is_available():
            raise ValueError(f"{owner} 'cudagraphs' needs CUDA, which this torch ({torch.__version__}) does not see: "
                             "use 'compile', or install a CUDA build of torch")


def compile_fn(fn: F, mode: CompileMode) -> F:
    """``fn`` itself (none), or torch.compile'd (compile), or compiled with CUDA graph capture (cudagraphs)."""
    if mode == "none":
        return fn
    # dynamic=False: a training batch keeps its shape, and static shapes give the fastest kernels
    return cast(F, torch.compile(fn, dynamic=False, mode="reduce-overhead" if mode == "cudagraphs" else None))


def step_begin(mode: CompileMode) -> None:
    """Call at the start of each training step: tells CUDA graph trees that the previous step's outputs are done
    with, so their memory may be reused (without it, reading an output after the next replay raises)."""
    if mode == "cudagraphs":
        torch.compiler.cudagraph_mark_step_begin()  # type: ignore[no-untyped-call]


def compile_kwargs(agent_cls: Callable[..., Any], mode: str, device: str) -> dict[str, Any]:
    """The keyword arguments that give ``agent_cls`` the ``trainer.compile`` mode: none for "none" (an agent need
    not know about compilation), else ``{"compile": mode}``; ValueError when the agent takes no ``compile``."""
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
        raise ValueError(f"trainer.compile is {mode!r}, but {name} takes no compile argument (the built-in SACAgent, "
                         "DQNAgent and PPOAgent do): set trainer.compile to 'none', or give the agent a compile "
                         "argument")
    return {"compile": mode}


@torch.no_grad()
def polyak_(targets: list[torch.Tensor], sources: list[torch.Tensor], polyak: float) -> None:
    """``target <- polyak * target + (1 - polyak) * source`` for every pair, in place, in one fused call."""
    torch._foreach_lerp_(targets, sources, 1.0 - polyak)


@torch.no_grad()
def copy_params_(targets: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """``target <- source`` for every pair, in place, in one fused call (a hard target update)."""
    torch._foreach_copy_(targets, sources)


def module_tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    """The parameters and buffers of ``module``, in ``state_dict`` order: what a target copy holds."""
    return list(module.state_dict(keep_vars=True).values())


def to_floats(values: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """Scalar tensors (all on one device) as floats, with one device synchronisation instead of one per metric."""
    floats = torch.stack([v.detach().reshape(()).float() for v in values.values()]).tolist()
    return dict(zip(values, floats, strict=True))
