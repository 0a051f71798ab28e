"""`artmlx run --learner-ranks 2`: a data-parallel learner of two local ranks (mx.distributed's ring) in the pipeline,
one of them lost mid-run, the run resumed with both again, then with one."""

import json
import os
import signal
import time
from pathlib import Path

import pytest

from artmlx.metrics import read_metrics
from tests.test_pipeline import SMALL, artmlx_process, assert_resumed, train_rows


def learner_rank_pids(run: Path, rank: int) -> list[int]:
    """Processes started as learner rank `rank` of this run (their environment names its ring hostfile)."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            variables = environ.read_bytes().split(b"\0")
        except OSError:
            continue
        if f"MLX_RANK={rank}".encode() in variables and f"MLX_HOSTFILE={run}/learner-ranks.json".encode() in variables:
            found.append(int(environ.parent.name))
    return found


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the rank's process through /proc")
def test_a_two_rank_learner_trains_loses_a_rank_and_resumes_with_two_then_one(tmp_path):
    run = tmp_path / "run"

    def args(ranks: int, steps: int, *extra: str) -> list[str]:
        return ["run", "--learner-ranks", str(ranks), "--actors", "1", "--out", str(run), "--steps", str(steps),
                "--set", "eval_every=0", "--set", "max_episode_tokens=512", *SMALL, *extra]

    first = artmlx_process(*args(2, 6))
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and (not (run / "metrics.jsonl").exists() or len(train_rows(run)) < 2):
            time.sleep(0.2)
        assert all(row["learner_ranks"] == 2 for row in train_rows(run))
        [rank1] = learner_rank_pids(run, 1)
        os.kill(rank1, signal.SIGKILL)
        output, _ = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 1, output
    assert f"learner rank 1 exited with {-signal.SIGKILL}: stopping the run" in output
    checkpoint = json.loads(sorted((run / "checkpoints").glob("step_*"))[-1].joinpath("trainer_state.json").read_text())
    assert 2 <= checkpoint["step"] < 4

    resumed = artmlx_process(*args(2, 4, "--resume"))
    output, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, output
    # rank 1 took rank 0's checkpoint (the two started equal, or the run would have stopped) and trained every update
    assert f"learner rank 1 of 2 done: {4 - checkpoint['step']} updates trained" in output
    assert_resumed(run, checkpoint, 4)

    # the checkpoint is one rank's state: one rank goes on from it, and says so
    at_four = json.loads(sorted((run / "checkpoints").glob("step_*"))[-1].joinpath("trainer_state.json").read_text())
    alone = artmlx_process(*args(1, 6, "--resume"))
    output, _ = alone.communicate(timeout=600)
    assert alone.returncode == 0, output
    assert "learner: resuming with 1 learner rank; the checkpoint was written by 2" in output
    final = assert_resumed(run, at_four, 6)
    assert final["groups_unaccounted"] == 0 and final["groups_in_flight"] == 0
    assert [row["learner_ranks"] for row in train_rows(run)] == [2, 2, 2, 2, 1, 1]
    assert not learner_rank_pids(run, 0) and not learner_rank_pids(run, 1)


def test_a_learner_started_for_another_backend_is_refused_by_name(monkeypatch):
    from artmlx.apps.learner_ranks import rank_link

    for name in ("MLX_HOSTFILE", "MLX_RANK", "NCCL_HOST_IP", "MLX_JACCL_COORDINATOR"):
        monkeypatch.delenv(name, raising=False)
    assert rank_link() is None  # one learner
    monkeypatch.setenv("NCCL_HOST_IP", "10.0.0.1")
    with pytest.raises(ValueError, match="mlx.launch --backend nccl.*ring backend only"):
        rank_link()
    monkeypatch.delenv("NCCL_HOST_IP")
    monkeypatch.setenv("MLX_HOSTFILE", "/tmp/ring.json")
    with pytest.raises(ValueError, match="MLX_RANK is not"):
        rank_link()
