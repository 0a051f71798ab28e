"""GRPO on the embedded model visibly learns tic-tac-toe within a small, fixed-seed budget."""

import pytest

from artmlx.config import load_config
from artmlx.metrics import read_metrics
from artmlx.apps.train import train


@pytest.mark.slow
def test_grpo_lifts_the_eval_score(tmp_path):
    config = load_config(None, {"steps": 8, "eval_every": 8, "eval_episodes": 100, "checkpoint_every": 8,
                                "seed": 1, "out": str(tmp_path / "run")})
    rows = read_metrics(train(config, echo=False))
    evals = [r for r in rows if "eval_score" in r]
    assert [r["step"] for r in evals] == [0, 8]
    before, after = evals[0], evals[1]
    assert after["eval_score"] >= before["eval_score"] + 0.1, (before, after)
    assert after["eval_illegal_rate"] < before["eval_illegal_rate"]
    trained = [r for r in rows if "reward_mean" in r]
    assert all(abs(r["ratio_mean"] - 1) < 1e-3 for r in trained), "on-policy updates must have ratio 1"
