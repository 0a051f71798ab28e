"""The data-parallel learner's update over mx.distributed's ring backend, with real local rank processes."""

import json
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np

from artmlx.learner.data_parallel import shard_groups

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "data_parallel.py"


def test_groups_are_shared_whole_and_balanced_by_tokens():
    costs = [500, 90, 410, 100, 300, 120]
    shares = shard_groups(costs, 2)
    assert sorted(i for share in shares for i in share) == list(range(len(costs)))
    loads = [sum(costs[i] for i in share) for share in shares]
    assert max(loads) - min(loads) <= max(costs)
    assert loads == [sum(costs[i] for i in s) for s in shard_groups(costs, 2)]  # every rank computes the same split
    assert shard_groups([7], 3) == [[0], [], []]  # more ranks than groups: the others get none


def _run(tmp_path: Path, name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--json", str(tmp_path / f"{name}.json"),
                           "--adapters", str(tmp_path / f"{name}.safetensors"), "--timeout", "300", *args],
                          capture_output=True, text=True, timeout=400)


def _adapters(path: Path) -> np.ndarray:
    loaded = mx.load(str(path))
    return np.concatenate([np.array(loaded[k]).ravel() for k in sorted(loaded)])


def test_two_and_three_ranks_equal_one(tmp_path):
    common = ["--steps", "1", "--groups", "3", "--group-size", "4", "--batch-tokens", "256", "--minibatches", "2"]
    single = _run(tmp_path, "one", "--ranks", "1", "--threads", "2", *common)
    assert single.returncode == 0, single.stderr[-2000:]
    reference = _adapters(tmp_path / "one.safetensors")
    for ranks in (2, 3):  # 3 ranks over a minibatch of 1 or 2 groups: some ranks train nothing that step
        result = _run(tmp_path, f"ranks{ranks}", "--ranks", str(ranks), *common)
        assert result.returncode == 0, result.stderr[-2000:]
        trained = _adapters(tmp_path / f"ranks{ranks}.safetensors")
        assert np.linalg.norm(trained - reference) <= 1e-5 * np.linalg.norm(reference), ranks


def test_a_lost_rank_stops_the_others_and_nothing_is_written(tmp_path):
    result = _run(tmp_path, "lost", "--ranks", "2", "--steps", "1", "--groups", "2", "--exit-rank", "1")
    assert result.returncode == 1
    assert "rank 1 exited with 3\n" in result.stdout
    codes = json.loads(result.stdout.rsplit("ranks exited with ", 1)[1].splitlines()[0])
    assert codes[1] == 3 and codes[0] != 0
    assert not (tmp_path / "lost.safetensors").exists()
