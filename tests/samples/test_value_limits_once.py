"""The value limits' fast pass (two reductions per leaf) refuses whatever the full checks refuse,
and names the same problem: it only decides that a packet surely passes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from netrl.samples.value_limits import Bounds, ValueLimits

ROWS = 10


def limits() -> ValueLimits:
    return ValueLimits({"obs": Bounds(np.array([-1, -1, -8.0]), np.array([1, 1, 8.0]), "observation_space"),
                        "act": Bounds(np.array([-2.0]), np.array([2.0]), "action_space"),
                        "obs/1": Bounds(np.array([0.0]), np.array([math.inf]), "observation_space[1]"),
                        "act/1": Bounds(np.array(0), np.array(4), "action_space[1]", exact=True)}, 100.0)


def honest(rng: np.random.Generator) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    leaves = {"obs": rng.uniform(-1, 1, (ROWS, 3)).astype(np.float32) * [1, 1, 8],
              "act": rng.uniform(-2, 2, (ROWS, 1)).astype(np.float32),
              "obs/1": rng.uniform(0, 1e6, ROWS).astype(np.float32)[:, None],
              "act/1": rng.integers(0, 5, ROWS).astype(np.int64),
              "extra/logp": rng.normal(size=ROWS).astype(np.float32)}
    leaves = {k: np.asarray(v, np.float32) if v.dtype.kind == "f" else v for k, v in leaves.items()}
    reset = np.zeros(ROWS, bool)
    reset[0] = True
    return leaves, rng.normal(size=ROWS).astype(np.float32), reset


# (leaf, row, element, value): each breaks a limit, or (reset row's action) need not fit one
CASES = [("obs", 3, 2, 9.0), ("obs", 0, 0, np.nan), ("obs", 9, 1, -np.inf), ("act", 4, 0, 2.5),
         ("act", 0, 0, 7.0), ("act", 0, 0, np.inf), ("obs/1", 2, 0, np.inf), ("obs/1", 5, 0, -1.0),
         ("act/1", 6, None, 5), ("act/1", 1, None, -1), ("extra/logp", 7, None, np.nan),
         ("rew", 8, None, np.inf), ("rew", 2, None, np.nan), ("rew", 5, None, -101.0)]


@pytest.mark.parametrize(("leaf", "row", "element", "value"), CASES)
def test_the_fast_pass_never_lets_through_what_the_full_checks_refuse(
        leaf: str, row: int, element: int | None, value: float, monkeypatch: pytest.MonkeyPatch) -> None:
    leaves, rew, reset = honest(np.random.default_rng(row))
    target = rew if leaf == "rew" else leaves[leaf]
    target[(row, element) if element is not None else row] = value
    got = limits().problem(leaves, rew, reset)
    monkeypatch.setattr(ValueLimits, "_passes", lambda *_: False)  # the full checks alone
    assert got == limits().problem(leaves, rew, reset)
    if leaf == "act" and row == 0 and math.isfinite(value):
        assert got is None  # a reset row's placeholder action need not fit the space
    else:
        assert got is not None and f"row {row}" in got


def test_honest_packets_pass_both_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    packets = [honest(rng) for _ in range(50)]
    assert all(limits().problem(*p) is None for p in packets)
    assert all(limits()._passes(p[0], p[1]) for p in packets)  # the fast pass decides them all
    monkeypatch.setattr(ValueLimits, "_passes", lambda *_: False)
    assert all(limits().problem(*p) is None for p in packets)


@pytest.mark.parametrize("value", [0.5, 3.0])
def test_leaves_of_several_dimensions_per_row_are_judged_as_the_full_checks_judge_them(value: float) -> None:
    """A Box of shape (2, 3): the fast pass reduced the rows' minimum and maximum over the first axis only, and
    asked an array for its truth value."""
    lim = ValueLimits({"obs": Bounds(np.zeros((2, 3)), np.ones((2, 3)), "observation_space")}, 100.0)
    obs = np.full((ROWS, 2, 3), 0.25, np.float32)
    obs[4, 1, 2] = value
    got = lim.problem({"obs": obs}, np.zeros(ROWS, np.float32), np.zeros(ROWS, bool))
    assert (got is None) == (value <= 1) and (got is None or "row 4" in got)
