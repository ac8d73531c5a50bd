"""GAE over flat on-policy rows against brute-force references: several envs' pieces in one batch, terminations,
truncations and fragment ends, each restarting the recursion, and only the last two bootstrapping."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from netrl.agents.gae import gae, trajectory_ends
from netrl.samples import Batch

GAMMA, LAM = 0.9, 0.8


def rows() -> dict[str, torch.Tensor]:
    """Three envs' fragments of 7 rows each, env-major as a RolloutMemory stores a packet, with a new traj_id at every
    episode start: env 0 terminates at row 2 and runs on to the fragment's end; env 1 is truncated at row 10 (a time
    limit) and terminates on its last row; env 2 runs the whole fragment, then a second packet of env 0 follows."""
    n = 26
    g = torch.Generator().manual_seed(3)
    terminated, truncated = torch.zeros(n), torch.zeros(n)
    terminated[[2, 13]] = 1.0
    truncated[10] = 1.0
    traj_ids = torch.tensor([0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5])
    value, next_value = torch.randn(n, generator=g), torch.randn(n, generator=g)
    # within a piece, the next observation is the next row's: V(next_obs_t) = V(obs_t+1), as a critic would give
    same = torch.nonzero((traj_ids[1:] == traj_ids[:-1]) & (terminated[:-1] == 0) & (truncated[:-1] == 0)).flatten()
    next_value[same] = value[same + 1]
    return {"rew": torch.randn(n, generator=g), "value": value, "next_value": next_value, "terminated": terminated,
            "truncated": truncated, "traj_ids": traj_ids}


def reference(r: dict[str, torch.Tensor], gamma: float, lam: float) -> np.ndarray:
    """A_t as the sum over the rest of its piece of (gamma * lam)^l * delta_{t+l}, one row at a time."""
    rew, v, nv = (r[k].double().numpy() for k in ("rew", "value", "next_value"))
    term, trunc, ids = r["terminated"].numpy(), r["truncated"].numpy(), r["traj_ids"].numpy()
    n = len(rew)
    adv = np.zeros(n)
    for t in range(n):
        k, total = t, 0.0
        while True:
            delta = rew[k] + (0.0 if term[k] else gamma * nv[k]) - v[k]
            total += (gamma * lam) ** (k - t) * delta
            if term[k] or trunc[k] or k == n - 1 or ids[k + 1] != ids[k]:
                break
            k += 1
        adv[t] = total
    return adv


def run(r: dict[str, torch.Tensor], gamma: float = GAMMA, lam: float = LAM) -> tuple[torch.Tensor, torch.Tensor]:
    ends = trajectory_ends(r["terminated"], r["truncated"], r["traj_ids"])
    return gae(r["rew"], r["value"], r["next_value"], r["terminated"], ends, gamma, lam)


def test_trajectory_ends_at_terminations_truncations_new_ids_and_the_last_row() -> None:
    r = rows()
    ends = trajectory_ends(r["terminated"], r["truncated"], r["traj_ids"])
    assert torch.nonzero(ends).flatten().tolist() == [2, 6, 10, 13, 20, 25]


def test_gae_matches_the_brute_force_sum_of_discounted_deltas() -> None:
    r = rows()
    adv, target = run(r)
    assert adv.dtype == torch.float32 and adv.shape == (26,)
    np.testing.assert_allclose(adv.numpy(), reference(r, GAMMA, LAM), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(target.numpy(), adv.numpy() + r["value"].numpy(), rtol=1e-5, atol=1e-6)


def test_with_lambda_one_the_target_is_the_discounted_return_of_the_piece_plus_its_bootstrap() -> None:
    r = rows()
    _, target = run(r, lam=1.0)
    # env 0's second episode (rows 3..6) ends at the fragment's end: bootstrap from V(next_obs) of row 6
    rew, nv = r["rew"].double(), r["next_value"].double()
    want = sum(GAMMA**k * rew[3 + k] for k in range(4)) + GAMMA**4 * nv[6]
    assert float(target[3]) == pytest.approx(float(want), rel=1e-5)
    # env 1's second episode (rows 11..13) terminates: no bootstrap at all
    assert float(target[11]) == pytest.approx(float(sum(GAMMA**k * rew[11 + k] for k in range(3))), rel=1e-5)
    # env 1's first episode (rows 7..10) is truncated: a time limit bootstraps like a fragment's end
    want = sum(GAMMA**k * rew[7 + k] for k in range(4)) + GAMMA**4 * nv[10]
    assert float(target[7]) == pytest.approx(float(want), rel=1e-5)


def test_a_terminal_row_never_bootstraps_and_a_bootstrap_reaches_only_its_own_piece() -> None:
    r = rows()
    adv, _ = run(r)
    changed = dict(r, next_value=r["next_value"].clone())
    changed["next_value"][[2, 13]] += 100.0  # terminal rows: V(next_obs) must not count
    assert torch.equal(run(changed)[0], adv)
    changed = dict(r, next_value=r["next_value"].clone())
    changed["next_value"][10] += 1.0  # the truncated row of env 1's first episode
    moved = torch.nonzero(run(changed)[0] != adv).flatten().tolist()
    assert moved == [7, 8, 9, 10]


def test_batch_extra_carries_named_tensors_through_replace_and_unpacking() -> None:
    r = rows()
    batch = Batch(r["value"], r["value"], r["rew"], r["value"], r["terminated"], r["truncated"],
                  extra={"traj_ids": r["traj_ids"]})
    o, a, rew, o2, term, trunc, weight = batch
    assert weight is None and torch.equal(rew, r["rew"])
    assert torch.equal(batch._replace(rew=rew * 2).extra["traj_ids"], r["traj_ids"])
    assert Batch(o, a, rew, o2, term, trunc).extra == {}
