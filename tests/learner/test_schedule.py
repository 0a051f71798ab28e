import math

import numpy as np
import pytest

from artmlx.config import load_config
from artmlx.learner.schedule import learning_rate_at


def transformers_reference(total: int, peak: float, schedule: str, warmup: int) -> np.ndarray:
    """Transformers' `get_{linear,cosine}_schedule_with_warmup` (0-based optimizer step s; rate = peak * factor),
    written out from its source with the warm-up of update k of W at k / (W + 1)."""
    s = np.arange(total, dtype=np.float64)
    progress = (s - warmup) / max(1, total - warmup)
    decayed = {"constant": np.ones_like(s), "linear": np.maximum(0.0, 1.0 - progress),
               "cosine": np.maximum(0.0, 0.5 * (1.0 + np.cos(np.pi * progress)))}[schedule]
    warming = (s + 1) / (warmup + 1)
    return peak * np.where(s < warmup, warming, decayed)


@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine"])
@pytest.mark.parametrize("total,warmup", [(50, 0), (50, 5), (7, 3), (1, 0), (2, 1)])
def test_the_schedule_matches_the_transformers_shapes(schedule, total, warmup):
    ours = [learning_rate_at(u, total, 1e-4, schedule, warmup) for u in range(1, total + 1)]
    np.testing.assert_allclose(ours, transformers_reference(total, 1e-4, schedule, warmup), rtol=1e-12, atol=0)


def test_every_update_moves_and_the_peak_follows_the_warm_up():
    rates = [learning_rate_at(u, 10, 2e-4, "linear", 3) for u in range(1, 11)]
    assert rates[:4] == pytest.approx([5e-5, 1e-4, 1.5e-4, 2e-4])  # 1/4, 2/4, 3/4 of the peak, then the peak
    assert all(r > 0 for r in rates) and rates == sorted(rates[:4]) + sorted(rates[4:], reverse=True)
    assert rates[-1] == pytest.approx(2e-4 / 7)  # the last of 7 decaying updates keeps a seventh
    assert learning_rate_at(10, 10, 2e-4, "cosine", 3) == pytest.approx(1e-4 * (1 + math.cos(math.pi * 6 / 7)))
    # a resumed run told to go on past its steps keeps the last update's rate instead of going negative
    assert learning_rate_at(15, 10, 2e-4, "linear", 3) == pytest.approx(rates[-1])


def test_auto_decays_linearly_where_artmlx_runs_the_loop():
    from artmlx.learner.settings import TrainerSettings

    config = load_config(None, {})
    assert config.lr_schedule == "auto" and TrainerSettings.of(config).lr_schedule == "linear"
    assert TrainerSettings.of(load_config(None, {"lr_schedule": "constant"})).lr_schedule == "constant"


def test_bad_schedules_are_refused_by_name():
    with pytest.raises(ValueError, match="'lr_schedule' must be one of"):
        load_config(None, {"lr_schedule": "step"})
    with pytest.raises(ValueError, match="'warmup_steps' .* must be less than steps"):
        load_config(None, {"steps": 10, "warmup_steps": 10})
    with pytest.raises(ValueError, match="'warmup_steps' must be >= 0"):
        load_config(None, {"warmup_steps": -1})
    with pytest.raises(ValueError, match="schedule 'step' is not one of"):
        learning_rate_at(1, 10, 1e-4, "step")
    with pytest.raises(ValueError, match="counted from 1"):
        learning_rate_at(0, 10, 1e-4)
