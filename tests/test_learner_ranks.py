"""`artmlx run --learner-ranks 2`: a data-parallel learner of two local ranks (mx.distributed's ring) in the pipeline;
one of them lost mid-run, the ranks restarted from the checkpoint by themselves, then the run resumed with one."""

import os
import re
import signal
import time
from pathlib import Path

import pytest

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
def test_a_lost_rank_restarts_the_ranks_from_the_checkpoint_and_one_rank_can_resume_it(tmp_path):
    run = tmp_path / "run"

    def args(ranks: int, steps: int, *extra: str) -> list[str]:
        return ["run", "--learner-ranks", str(ranks), "--actors", "1", "--out", str(run), "--steps", str(steps),
                "--set", "eval_every=0", "--set", "max_episode_tokens=512", *SMALL, *extra]

    first = artmlx_process(*args(2, 6))
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and (not (run / "metrics.jsonl").exists() or len(train_rows(run)) < 2):
            time.sleep(0.2)
        [rank1] = learner_rank_pids(run, 1)
        os.kill(rank1, signal.SIGKILL)
        output, _ = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, output
    # the run went on by itself: the ranks restarted from the last checkpoint, the actor stayed
    said = re.search(rf"learner rank 1 exited with {-signal.SIGKILL}: the learner goes on from step_(\d+) with 2 ranks",
                     output)
    assert said, output
    step = int(said.group(1))
    assert step >= 2 and "learner rank 1 of 2 done" in output and "actors exited with [0]" in output
    rows = train_rows(run)
    checkpoint = {"step": step, "policy_version": next(r["policy_version"] for r in rows if r["step"] == step)}
    final = assert_resumed(run, checkpoint, 6)
    # the actor stayed across the restart: the restarted learner's ledger counts its groups from the new Welcome
    assert final["groups_unaccounted"] == 0 and final["groups_in_flight"] == 0, final
    assert final["run_groups_trained"] == 4 * 6 and final["run_learner_starts"] == 2, final
    assert all(row["learner_ranks"] == 2 for row in rows)

    # the checkpoint is one rank's state: one rank goes on from it, and says so
    alone = artmlx_process(*args(1, 8, "--resume"))
    output, _ = alone.communicate(timeout=600)
    assert alone.returncode == 0, output
    assert "learner: resuming with 1 learner rank; the checkpoint was written by 2" in output
    final = assert_resumed(run, {"step": 6, "policy_version": train_rows(run)[5]["policy_version"]}, 8)
    assert final["groups_unaccounted"] == 0 and final["groups_in_flight"] == 0
    assert final["run_groups_trained"] == 4 * 8 and final["run_learner_starts"] == 3, final
    assert [row["learner_ranks"] for row in train_rows(run)] == [2] * 6 + [1] * 2
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
