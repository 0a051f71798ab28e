"""A reduced soak (benchmarks/soak.py): 60 updates with two actor restarts, nothing grows beyond a bound."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_process_stats_count_what_this_process_opens(tmp_path):
    import socket

    from artmlx.procstats import descriptors, process_stats

    before = process_stats()
    assert before["rss_mb"] > 0 and before["mlx_active_mb"] >= 0
    with open(tmp_path / "f", "w"), socket.socket() as _:
        files, sockets = descriptors()
        assert (files, sockets) == (before["open_files"] + 2, before["open_sockets"] + 1)
    assert descriptors() == (before["open_files"], before["open_sockets"])


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="the benchmark reads the actors through /proc")
def test_sixty_updates_with_two_actor_restarts_grow_nothing_and_keep_the_ledger(tmp_path):
    report_path = tmp_path / "soak.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--updates", "60", "--restart-every", "20",
                    "--warmup", "10", "--out", str(tmp_path / "soak"), "--json", str(report_path),
                    "--set", "groups_per_step=4", "--set", "group_size=4", "--set", "actor_groups_per_batch=2"],
                   check=True, timeout=900, capture_output=True)
    report = json.loads(report_path.read_text())
    assert report["actor_restarts"] == 2
    learner = report["learner"]
    # a leak of 0.5 MB an update would be about 20 % per 100 updates of the learner's ~220 MB
    rows = [json.loads(line) for line in (tmp_path / "soak" / "run" / "metrics.jsonl").read_text().splitlines()]
    series = [(row["step"], row["rss_mb"], row["mlx_cache_mb"], row["actors"]) for row in rows if "rss_mb" in row]
    # MLX's buffer cache may step up once for a batch of a new size (capped at a quarter of the budget): the
    # rest of the process's memory must stay flat
    assert abs(report["learner_outside_cache_mb"]["per_100_updates_pct"]) < 5, series
    assert learner["mlx_cache_mb"]["max"] < 1024, series
    assert learner["mlx_active_mb"]["max"] - learner["mlx_active_mb"]["min"] < 1, learner["mlx_active_mb"]
    for key in ("open_files", "open_sockets"):  # actors came and went: the learner holds what it held
        assert learner[key]["max"] - learner[key]["min"] <= 1, (key, learner[key])
    for actor in report["actors"]:
        assert actor["open_files"]["max"] - actor["open_files"]["min"] <= 1, actor
    ledger = report["ledger"]
    assert ledger["groups_unaccounted"] == 0 and ledger["groups_in_flight"] == 0, ledger
    assert ledger["run_groups_trained"] == ledger["groups_trained"] == 60 * 4, ledger
