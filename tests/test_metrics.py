"""The metrics sinks: JSONL, the console, nothing, and Weights & Biases in offline mode (no network)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from artmlx.config import load_config
from artmlx.metrics import JsonlSink, MetricsLog, NullSink, check_sinks, numeric


class Collected:
    """A sink that keeps what it is given (the interface's simplest real implementation)."""

    def __init__(self):
        self.rows, self.closed = [], False

    def write(self, row):
        self.rows.append(row)

    def close(self):
        self.closed = True


def test_every_sink_gets_every_row_and_resume_truncates_the_file(tmp_path):
    collected = Collected()
    with MetricsLog([JsonlSink(tmp_path / "metrics.jsonl"), collected, NullSink()]) as log:
        for step in range(4):
            log.write({"step": step, "reward_mean": step / 4, "loss": float("nan")})
        log.truncate_after(1)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in lines] == [0, 1] and lines[0]["loss"] is None  # NaN is written as null
    assert [row["step"] for row in collected.rows] == [0, 1, 2, 3] and collected.closed


def test_numeric_keeps_finite_numbers_and_flattens_counts():
    row = {"step": 3, "reward_mean": 0.5, "final": True, "stop_reason": "done", "outcomes": {"win": 2, "loss": 1},
           "grad_norm": float("inf"), "actors_peak_memory_gb": [1.0]}
    assert numeric(row) == {"step": 3, "reward_mean": 0.5, "final": 1, "outcomes/win": 2, "outcomes/loss": 1}


def test_a_wandb_project_without_the_package_is_refused_before_the_run(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if `artmlx[wandb]` were not installed
    config = load_config(None, {"wandb_project": "p", "out": str(tmp_path / "run")})
    with pytest.raises(ValueError, match=r"pip install 'artmlx\[wandb\]'"):
        check_sinks(config)
    from artmlx.apps.train import train

    with pytest.raises(ValueError, match="wandb"):
        train(config, echo=False)
    assert not (tmp_path / "run").exists()  # refused before the run directory or the model


def wandb_records(path: Path):
    """The protobuf records of a W&B run file (`run-ID.wandb`: LevelDB's log format after a 7-byte header)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a record header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (2, 3):  # first and middle parts of a record split across blocks
            pending += chunk
            continue
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending + chunk)
            pending = b""
            yield record


def logged(path: Path):
    history, summary, runs = [], {}, []
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.append({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item})
        elif kind == "summary":
            summary.update({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.summary.update})
        elif kind == "run":
            runs.append(record.run)
    return history, summary, runs


def test_train_logs_to_weights_and_biases_offline(tmp_path):
    """`artmlx train --set wandb_project=...` under WANDB_MODE=offline: the real wandb package writes the run
    to the run directory (nothing leaves the machine); read back with wandb's own record format, every
    update's and evaluation's numbers are there at their step, as in metrics.jsonl."""
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    out = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "artmlx", "train", "--steps", "2", "--out", str(out),
                             "--set", "wandb_project=artmlx-test", "--set", "groups_per_step=2",
                             "--set", "group_size=2", "--set", "eval_episodes=4", "--set", "eval_every=1"],
                            capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    files = list((out / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1
    history, summary, runs = logged(files[0])
    run_id = (out / "wandb_run_id").read_text().strip()
    assert [(run.run_id, run.project, run.display_name) for run in runs] == [(run_id, "artmlx-test", "run")]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [entry["_step"] for entry in history] == [0, 1, 2]  # an update and its evaluation share a step
    for row in rows:
        entry = history[row["step"]]
        for key in ("reward_mean", "eval_score", "loss", "tokens"):
            if key in row:
                assert entry[key] == pytest.approx(row[key])
    assert summary["eval_score"] == pytest.approx(rows[-1]["eval_score"])
