"""`artmlx bench`: every command runs end to end on the embedded model and reports what it claims."""

import json
import os
import subprocess
import sys

import pytest

from artmlx.bench.protocol import adapter_sizes, bench_fanout
from artmlx.apps.launch import placements


def bench(tmp_path, *args):
    out = tmp_path / "report.json"
    result = subprocess.run([sys.executable, "-m", "artmlx", "bench", *args, "--json", str(out)], capture_output=True,
                            text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"), timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    assert report["command"].startswith("artmlx bench") and report["machine"]["versions"]["mlx"]
    return report, result.stdout


def test_rollout_bench_compares_the_three_ways_side_by_side(tmp_path):
    report, output = bench(tmp_path, "rollout", "--model", "tiny", "--quick", "--rows", "16")
    (row,) = report["results"]["groups"]
    assert row["G"] == 8 and row["rows"] == 16
    for method in ("engine", "batch_generate", "sequential"):
        assert row[method]["tokens"] > 0 and row[method]["tok_s"] > 0 and row[method]["peak_gb"] >= 0
    assert row["engine_vs_sequential"] == pytest.approx(row["engine"]["tok_s"] / row["sequential"]["tok_s"])
    agreement = report["results"]["agreement"]
    assert agreement["policy_tokens"] > 0 and agreement["max_abs_logprob_diff"] < 1e-3  # exact on the CPU
    memory = report["results"]["prefill_memory"]
    assert memory["max_abs_logit_diff"] < 1e-3 and memory["peak_gb_last_position"] > 0
    assert "x sequential" in output


def test_learner_bench_runs_both_steps_plain_and_compiled(tmp_path):
    report, _ = bench(tmp_path, "learner", "--model", "tiny", "--quick", "--groups", "2", "--prompt", "32",
                      "--reply", "16")
    runs = report["results"]["runs"]
    assert {(r["method"], r["compiled"]) for r in runs} == {
        ("artmlx GRPO", False), ("artmlx GRPO", True),
        ("mlx-lm LoRA (cross-entropy)", False), ("mlx-lm LoRA (cross-entropy)", True)}
    assert all(r["tok_s"] > 0 and r["peak_gb"] > 0 for r in runs)
    assert report["results"]["ratio_plain"] > 0 and report["results"]["tokens_per_step"] == 2 * 8 * 48


@pytest.mark.slow
def test_pipeline_bench_measures_train_and_run(tmp_path):
    report, output = bench(tmp_path, "pipeline", "--model", "tiny", "--quick", "--actors", "1", "--steps", "3",
                           "--out", str(tmp_path / "runs"), "--set", "groups_per_step=4", "--set", "group_size=4")
    train, run = report["results"]["runs"]
    assert train["run"] == "train" and train["ideal_overlap_bound"] >= 1.0 and train["gen_seconds"] > 0
    assert run["actors"] == 1 and run["seconds_per_update"] > 0 and 0 <= run["learner_idle_frac"] <= 1
    assert run["speedup_vs_train"] > 0 and len(run["actors_peak_gb"]) == 1
    assert "ideal overlap bound" in output


def test_adapter_sizes_follow_the_layer_shapes():
    sizes = {(r["architecture"], r["rank"]): r for r in adapter_sizes()}
    # Qwen2.5-0.5B, rank 8, every linear layer of 24 blocks: 8 x sum(in + out) over q, k, v, o, gate, up, down.
    per_block = (896 + 896) + 2 * (896 + 128) + (896 + 896) + 2 * (896 + 4864) + (4864 + 896)
    assert sizes[("qwen2.5-0.5b", 8)]["parameters"] == 24 * 8 * per_block
    assert sizes[("qwen2.5-7b", 64)]["MB_bfloat16"] == sizes[("qwen2.5-7b", 64)]["MB_float32"] / 2


def test_bfloat16_adapter_fan_out_reaches_an_actor():
    row = bench_fanout(None, 1, "bfloat16", rounds=2)
    assert row["adapter_MB"] == pytest.approx(3.0) and row["latency_ms_median"] > 0


def test_placements_give_each_actor_its_device_and_count_the_sharers():
    learner, actors = placements(3, ["1", "2"], "0")
    assert learner == {"CUDA_VISIBLE_DEVICES": "0", "ARTMLX_MEMORY_SHARING": "1"}
    assert [a["CUDA_VISIBLE_DEVICES"] for a in actors] == ["1", "2", "1"]  # entries cycle
    assert [a["ARTMLX_MEMORY_SHARING"] for a in actors] == ["2", "1", "2"]
    learner, actors = placements(2, [], "")
    assert learner == {"ARTMLX_MEMORY_SHARING": "3"} and all(a == {"ARTMLX_MEMORY_SHARING": "3"} for a in actors)
    with pytest.raises(ValueError, match="GPU index or 'cpu'"):
        placements(1, ["gpu1"])
