"""The learning rate of each update: a warm-up, then constant, linear or cosine decay over the run.

The shapes are Hugging Face Transformers' (`get_linear_schedule_with_warmup`, `get_cosine_schedule_with_warmup`,
what TRL's `lr_scheduler_type` picks), counted in updates. The one difference is the warm-up: update k of W
(1-based) takes k / (W + 1) of the peak, so the first update moves the adapters (Transformers' first step has
a rate of 0). A function of the update's number alone, so a resumed run continues on the same curve.
"""

from __future__ import annotations

import math

SCHEDULES = ("constant", "linear", "cosine")


def learning_rate_at(update: int, total: int, peak: float, schedule: str = "constant", warmup: int = 0) -> float:
    """The rate of the `update`-th update (1-based) of a run of `total`; past `total` the last update's."""
    if schedule not in SCHEDULES:
        raise ValueError(f"learning-rate schedule {schedule!r} is not one of {', '.join(SCHEDULES)}")
    if update < 1:
        raise ValueError(f"updates are counted from 1, got {update}")
    if update <= warmup:
        return peak * update / (warmup + 1)
    if schedule == "constant":
        return peak
    decaying = max(1, total - warmup)
    progress = min(update - warmup - 1, decaying - 1) / decaying
    if schedule == "linear":
        return peak * (1.0 - progress)
    return peak * 0.5 * (1.0 + math.cos(math.pi * progress))
