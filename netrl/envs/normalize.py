"""Observation normalisation (``env.normalize_obs``): running mean and variance
per float ``Box`` leaf.

Calling sequence::

    norm = ObsNormalizer(observation_space, clip=10.0)  # mean 0, var 1, count 0: a near-identity
                                                        # before any data
    norm.update(packet_obs)      # trainer: numpy rows (leading dimension n) of every packet it
                                 # receives
    memory.obs_transform = norm  # trainer: a batch's obs and next_obs, as the memory gathers them
    obs = norm(obs)              # worker: the observation before act, with the statistics it last
                                 # received

``forward`` applies SB3 VecNormalize's rule to each float ``Box`` leaf,
``clip((x - mean) / sqrt(var + 1e-8), -clip, clip)`` in float32; other leaves (integer images,
Discrete...) pass through untouched. The statistics live in float32 buffers ``mean_<i>`` and
``var_<i>`` (``<i>``: the leaf's index in the observation's flattened leaves, the order of
:func:`netrl.samples.flatten`, so ``mean_1`` belongs to ``obs/1``) and one float64 ``count``:
what is published to the workers as the model ``"obs_norm"``. :meth:`update` merges new rows into
float64 accumulators (Chan et al.'s parallel variance) and writes them to the buffers, so the worker
and the memory compute the same function of the same float32 numbers: for one statistics version,
both give bit-identical normalised observations.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from netrl.errors import ConfigError
from netrl.samples.columns import flatten
from netrl.samples.spaces import space_kind, storage_dtype

__all__ = ["EPS", "ObsNormalizer", "normalize_batches"]

EPS = 1e-8  # added to the variance under the square root (SB3's VecNormalize epsilon)
KEY = "env.normalize_obs"


def _space_tree(space: Any) -> Any:
    """A Tuple/Dict space as a tuple/dict of its leaf spaces, which :func:`flatten`
    names like the observations."""
    kind = space_kind(space)
    if kind == "Tuple":
        return tuple(_space_tree(s) for s in space.spaces)
    if kind == "Dict":
        return {k: _space_tree(s) for k, s in space.spaces.items()}
    return space


class ObsNormalizer(torch.nn.Module):
    """Running observation statistics and the normalisation they define (see the module docstring).

    Args:
        observation_space: one env's observation space (gymnasium); its float ``Box``
            leaves are normalised.
        clip: normalised values are clipped to ``[-clip, clip]`` (``env.normalize_obs_clip``), > 0.

    Raises:
        ConfigError: the space has no float ``Box`` leaf: there is nothing to normalise
            (names ``env.normalize_obs``).
    """

    # The statistics travel in float32 whatever network.weight_format says: the worker and
    # the memory must normalise with the same numbers for one version, and they are a few
    # floats per observation dimension.
    exact_weights = True

    def __init__(self, observation_space: Any, clip: float = 10.0) -> None:
        super().__init__()
        if not clip > 0:
            raise ValueError(f"env.normalize_obs_clip must be > 0 (got {clip!r})")
        self.clip = float(clip)
        _, leaves = flatten(_space_tree(observation_space), "obs")
        self.leaf_names = [name for name, _ in leaves]
        # leaf index -> per-row shape, for the float Box leaves
        self.shapes: dict[int, tuple[int, ...]] = {}
        for i, (_, space) in enumerate(leaves):
            if space_kind(space) == "Box" and storage_dtype(space).kind == "f":
                shape = tuple(int(d) for d in space.shape)
                self.shapes[i] = shape
                self.register_buffer(f"mean_{i}", torch.zeros(shape, dtype=torch.float32))
                self.register_buffer(f"var_{i}", torch.ones(shape, dtype=torch.float32))
        if not self.shapes:
            raise ConfigError([f"{KEY} is true, but the observation space "
                               f"{observation_space} has no float Box leaf to normalise (its "
                               f"leaves: {', '.join(self.leaf_names)}): set {KEY} to false"])
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        # float64 accumulators: the float32 buffers are what is published and
        # applied, never merged into
        self._mean = {i: np.zeros(s) for i, s in self.shapes.items()}
        self._var = {i: np.ones(s) for i, s in self.shapes.items()}
        self._count = 0.0

    # -- applying ----------------------------------------------------------------------------------
    def forward(self, obs: Any) -> Any:
        """``obs`` (a tree of tensors or arrays, each leaf ``(..., *leaf_shape)``) normalised, in
        the same structure: float leaves become float32 tensors on their own device; the others
        are returned as they came."""
        count = [0]

        def walk(node: Any) -> Any:
            if isinstance(node, (tuple, list)):
                return type(node)(walk(child) for child in node)
            if isinstance(node, dict):
                # flatten's order, which numbers the leaves
                done = {k: walk(node[k]) for k in sorted(node)}
                return {k: done[k] for k in node}
            i = count[0]
            count[0] += 1
            return self._normalize(i, node) if i in self.shapes else node

        out = walk(obs)
        if count[0] != len(self.leaf_names):
            raise ValueError(f"{KEY}: the observation has {count[0]} leaves, the observation "
                             f"space {len(self.leaf_names)} ({', '.join(self.leaf_names)}): "
                             f"normalise observations of the space the normaliser was built from")
        return out

    def _normalize(self, i: int, x: Any) -> torch.Tensor:
        shape = self.shapes[i]
        if not isinstance(x, torch.Tensor):
            x = np.asarray(x)
            # torch warns on a read-only array
            x = torch.from_numpy(x if x.flags.writeable else x.copy())
        t = x
        if tuple(t.shape[t.dim() - len(shape):]) != shape or t.dim() < len(shape):
            raise ValueError(f"{KEY}: observation leaf {self.leaf_names[i]} has the shape "
                             f"{tuple(t.shape)}, which does not end with its space's shape {shape}")
        mean, var = getattr(self, f"mean_{i}"), getattr(self, f"var_{i}")
        if mean.device != t.device:
            mean, var = mean.to(t.device), var.to(t.device)
        # the one formula both the worker and the memory run (see the module docstring): no
        # fused or reordered form
        return ((t.to(torch.float32) - mean) / torch.sqrt(var + EPS)).clamp_(-self.clip, self.clip)

    # -- learning ----------------------------------------------------------------------------------
    def update(self, obs: Any) -> None:
        """Merge the rows of ``obs`` (a tree of numpy arrays, each leaf ``(n, *leaf_shape)``) into
        the statistics and write them to the float32 buffers. ValueError, with nothing changed,
        when a float leaf's rows do not have their space's shape, the leaves disagree on ``n``, or
        the result would not be finite."""
        _, leaves = flatten(obs, "obs")
        if len(leaves) != len(self.leaf_names):
            raise ValueError(f"{KEY}: the observations have {len(leaves)} leaves, the observation "
                             f"space {len(self.leaf_names)} ({', '.join(self.leaf_names)})")
        self._sync_accumulators()
        rows: dict[int, np.ndarray] = {}
        for i, shape in self.shapes.items():
            x = np.asarray(leaves[i][1])
            if x.shape[1:] != shape:
                raise ValueError(f"{KEY}: observation leaf {self.leaf_names[i]} arrives "
                                 f"with rows of shape {x.shape[1:]}, its space's shape is "
                                 f"{shape}: the statistics need the observations as "
                                 f"the env returns them (a sample compressor that "
                                 f"changes a float leaf cannot be combined with {KEY})")
            rows[i] = x
        n = {x.shape[0] for x in rows.values()}
        if len(n) != 1:
            raise ValueError(f"{KEY}: the observation leaves hold "
                             f"different numbers of rows ({sorted(n)})")
        m = float(n.pop())
        if m == 0:
            return
        total = self._count + m
        merged: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        # (overflow warnings silenced: a non-finite result is refused below)
        for i, x in rows.items():
            x64 = x.astype(np.float64, copy=False)
            with np.errstate(over="ignore", invalid="ignore"):
                batch_mean, batch_var = x64.mean(axis=0), x64.var(axis=0)
                delta = batch_mean - self._mean[i]
                mean = self._mean[i] + delta * (m / total)
                m2 = self._var[i] * self._count + batch_var * m + delta**2 * (self._count * m / total)
            # arrays also for a scalar leaf: numpy's reductions give scalars
            var = np.asarray(m2 / total)
            mean = np.asarray(mean)
            if not (np.isfinite(mean).all() and np.isfinite(var).all()):
                raise ValueError(f"{KEY}: observation leaf {self.leaf_names[i]} would "
                                 f"make its statistics non-finite (values beyond "
                                 f"float64's range): the rows are left out")
            merged[i] = mean, var
        for i, (mean, var) in merged.items():
            self._mean[i], self._var[i] = mean, var
            getattr(self, f"mean_{i}").copy_(torch.from_numpy(np.asarray(mean, np.float32)))
            getattr(self, f"var_{i}").copy_(torch.from_numpy(np.asarray(var, np.float32)))
        self._count = total
        self.get_buffer("count").fill_(total)

    def _sync_accumulators(self, force: bool = False) -> None:
        """After statistics were loaded (a checkpoint, :meth:`load_state_dict`, tensors assigned),
        continue from them: the float32 buffers are all there is of the loaded state."""
        count = float(self.get_buffer("count"))
        if count == self._count and not force:
            return
        self._count = count
        for i in self.shapes:
            self._mean[i] = getattr(self, f"mean_{i}").detach().cpu().numpy().astype(np.float64)
            self._var[i] = getattr(self, f"var_{i}").detach().cpu().numpy().astype(np.float64)

    # -- loading -----------------------------------------------------------------------------------
    def check_state(self, state: Any) -> list[str]:
        """The problems that keep ``state`` (name -> array or tensor) from being these statistics,
        each naming the observation leaf, both shapes and ``env.normalize_obs``; [] when it fits."""
        problems = []
        for i, shape in self.shapes.items():
            for kind in ("mean", "var"):
                got = state.get(f"{kind}_{i}")
                if got is not None and tuple(got.shape) != shape:
                    problems.append(f"{KEY}: the statistics' {kind}_{i} for observation leaf "
                                    f"{self.leaf_names[i]} has the shape {tuple(got.shape)}, "
                                    f"this observation space's leaf has {shape}: the "
                                    f"trainer and the workers must run the same env "
                                    f"(statistics from another env's run do not fit)")
        known = {f"{k}_{i}" for i in self.shapes for k in ("mean", "var")} | {"count"}
        problems += [f"{KEY}: the statistics hold {name!r}, which this observation "
                     f"space has no float Box leaf for (its float leaves: "
                     f"{', '.join(self.leaf_names[i] for i in self.shapes)})"
                     for name in state if name not in known]
        return problems

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """As ``torch.nn.Module.load_state_dict``, with a ValueError naming the observation leaf and
        both shapes when the statistics do not fit this observation space (torch's message names
        neither the leaf nor the setting)."""
        problems = self.check_state(state_dict)
        if problems and (strict or any("shape" in p for p in problems)):
            raise ValueError("; ".join(problems))
        result = super().load_state_dict(state_dict, strict=strict, assign=assign)
        self._sync_accumulators(force=True)
        return result

    def extra_repr(self) -> str:
        leaves = ", ".join(f"{self.leaf_names[i]} {s}" for i, s in self.shapes.items())
        return (f"normalised: {leaves}; clip={self.clip:g}, "
                f"count={float(self.get_buffer('count')):g}")


def normalize_batches(memory: Any, observation_space: Any, clip: float) -> ObsNormalizer:
    """A new :class:`ObsNormalizer` set as ``memory``'s ``obs_transform`` (a trainer's, with
    ``env.normalize_obs``). ValueError when the memory has an ``obs_preprocessor``: it would
    store, and so normalise, what that returns, while the statistics are of the observations as
    the env returns them."""
    if getattr(memory, "obs_preprocessor", None) is not None:
        raise ValueError(f"{KEY} is true and the memory has an obs_preprocessor: the statistics "
                         f"are of the observations as the env returns them; normalise "
                         f"inside the obs_preprocessor instead, or set {KEY} to false")
    norm = ObsNormalizer(observation_space, clip)
    memory.obs_transform = norm
    return norm
