"""What the trainer's log lines call it, and the status line it logs every ``status_interval_s``.

Both are text only: the trainer's network thread reads the training loop's counters
(:attr:`~netrl.training.loop.TrainingOffline.live`) and its rates, and logs the line
:func:`status_line` makes of them.
"""

from __future__ import annotations

from typing import Any

from netrl.util import version_label

__all__ = ["status_line", "trainer_label"]


def trainer_label(name: str) -> str:
    """How the logs name a trainer: "trainer", or "trainer 'gpu-box'" for one with another name."""
    return "trainer" if name == "trainer" else f"trainer {name!r}"


def status_line(name: str, s: dict[str, Any], rates: dict[str, float], server: str) -> str:
    """One line with the loop's rates and state: ``s`` is what the loop's ``live()`` returned,
    ``rates`` the training steps and samples per second since the last line, ``server`` the
    connection's state."""
    lag = "-" if s["lag"] is None else f"{s['lag'][0]}/{s['lag'][1]:.1f}/{s['lag'][2]}"
    ret = ("-" if s["return_mean"] is None
           else f"{s['return_mean']:.1f} over {s['episodes']} eps this round")
    waiting = (f" | training starts at {s['start_training']:,} samples"
               if s["samples"] < s["start_training"] else "")
    if s.get("collection") == "sync":  # the batch under way replaces the replay memory's fill
        who = f", waiting for {', '.join(s['waiting_for'])}" if s["waiting_for"] else ""
        waiting = (f" | batch v{s['batch_version']}: {s['batch_steps']:,} of "
                   f"{s['frames_per_batch']:,} env steps{who} | waits: trainer "
                   f"{s['trainer_wait_s']:.2f} s, workers {s['worker_wait_s']:.2f} s | "
                   f"{s['late_samples']:,} late samples")
    weights = version_label(s["version"]) + "".join(
        f", {m} v{v}" for m, v in s.get("model_versions", {}).items())
    memory = (f"{s['memory_len']:,} of {s['memory_size']:,} "
              f"({100 * s['memory_len'] / max(1, s['memory_size']):.1f}%)")
    # workers whose values were implausible (netrl.training.plausibility), shown once there are any
    odd = s.get("implausible") or {}
    implausible = (f" | implausible packets {odd['implausible_packets']:,}, workers quarantined "
                   f"{odd['quarantined_workers']}, revoked {odd['revoked_workers']}"
                   if any(odd.values()) else "")
    return (f"status | {trainer_label(name)} | {rates['trained_steps']:.0f} training steps/s | "
            f"samples in {rates['samples']:.0f}/s | memory {memory} | weights {weights} | "
            f"lag {lag} | return {ret} | server {server}{waiting}{implausible}")
