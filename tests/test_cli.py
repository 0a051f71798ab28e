"""The real `artmlx` program, run as a subprocess on a tiny budget."""

import json
import os
import subprocess
import sys

import pytest

from artmlx.metrics import read_metrics


def artmlx(*args, timeout=600):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "artmlx", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_help_and_model_path():
    result = artmlx("--help")
    assert result.returncode == 0 and "train" in result.stdout
    path = artmlx("model-path", "tiny").stdout.strip()
    assert os.path.exists(os.path.join(path, "config.json"))
    assert os.path.exists(os.path.join(path, "model.safetensors"))
    config = json.load(open(os.path.join(path, "config.json")))
    assert config["quantization"]["bits"] == 4 and config["model_type"] == "qwen2"


def test_bad_config_is_a_clear_error(tmp_path):
    result = artmlx("train", "--out", str(tmp_path / "run"), "--set", "group_size=1")
    assert result.returncode != 0
    assert "group_size" in result.stderr and "Traceback" not in result.stderr
    result = artmlx("train", "--out", str(tmp_path / "run"), "--env", "chess")
    assert result.returncode != 0 and "chess" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_train_eval_plot_end_to_end(tmp_path):
    run = tmp_path / "run"
    result = artmlx("train", "--out", str(run), "--steps", "2", "--set", "eval_every=2", "--set", "eval_episodes=20",
                    "--set", "groups_per_step=4", "--set", "group_size=4")
    assert result.returncode == 0, result.stderr
    rows = read_metrics(run)
    train_rows = [r for r in rows if "reward_mean" in r]
    eval_rows = [r for r in rows if "eval_score" in r]
    assert [r["step"] for r in train_rows] == [1, 2]
    assert [r["step"] for r in eval_rows] == [0, 2]
    for key in ("step", "policy_version", "reward_mean", "groups", "tokens", "time"):
        assert key in train_rows[0]
    for key in ("eval_score", "eval_episodes", "eval_win_rate", "eval_draw_rate", "eval_loss_rate",
                "eval_illegal_rate"):
        assert key in eval_rows[0]
    assert (run / "config.toml").exists() and (run / "adapters" / "adapters.safetensors").exists()
    assert list((run / "checkpoints").iterdir())

    again = artmlx("train", "--out", str(run), "--steps", "2")
    assert again.returncode != 0 and "--resume" in again.stderr

    evaluated = artmlx("eval", "--adapters", str(run / "adapters"), "--episodes", "30", "--json")
    assert evaluated.returncode == 0, evaluated.stderr
    result_json = json.loads(evaluated.stdout)
    assert result_json["eval_episodes"] == 30 and 0 <= result_json["eval_score"] <= 1
    assert result_json["eval_score_ci_low"] <= result_json["eval_score"] <= result_json["eval_score_ci_high"]
    assert result_json["max_reply_tokens"] == 8  # the run's own

    shorter = artmlx("eval", "--adapters", str(run / "adapters"), "--episodes", "10", "--max-reply-tokens", "2",
                     "--json")
    assert shorter.returncode == 0, shorter.stderr
    assert json.loads(shorter.stdout)["max_reply_tokens"] == 2 and json.loads(shorter.stdout)["env"] == "tictactoe"

    plotted = artmlx("plot", str(run))
    assert plotted.returncode == 0, plotted.stderr
    assert (run / "plot.png").stat().st_size > 10_000


def test_keygen_writes_a_usable_key_layout(tmp_path):
    result = artmlx("keygen", str(tmp_path / "keys"), "--actor", "mac-mini")
    assert result.returncode == 0, result.stderr
    for name in ("learner.key", "learner.key_secret", "mac-mini.key", "mac-mini.key_secret", "allowed/mac-mini.key"):
        assert (tmp_path / "keys" / name).exists(), name
    assert oct((tmp_path / "keys" / "learner.key_secret").stat().st_mode & 0o777) == "0o600"


def test_eval_takes_its_settings_from_a_recipe_or_the_flag():
    from artmlx.apps.evaluate import run_config_for

    assert run_config_for(None).max_reply_tokens == 8  # the defaults, tuned for the tiny model
    recipe = run_config_for(None, "smollm2-math")
    assert (recipe.model, recipe.env, recipe.max_reply_tokens) == ("smollm2-135m-instruct", "math", 16)
    assert run_config_for(None, "smollm2-math", 40).max_reply_tokens == 40
    assert run_config_for(None, None, 40).max_reply_tokens == 40
    with pytest.raises(ValueError, match="max_reply_tokens"):
        run_config_for(None, None, 0)
    result = artmlx("eval", "--config", "no-such-recipe", "--episodes", "1")
    assert result.returncode != 0 and "no-such-recipe" in result.stderr and "Traceback" not in result.stderr


def test_every_recipe_is_a_valid_config():
    from artmlx.config import load_config
    from artmlx.recipes import recipe_names, recipe_summary

    assert {"smollm2-math", "smollm2-word-problems", "smollm2-tictactoe", "smollm2-calculator"} <= set(recipe_names())
    for name in recipe_names():
        config = load_config(name)
        assert config.model == "smollm2-135m-instruct" and recipe_summary(name), name


def test_help_lists_every_command_once_under_a_section():
    import click

    from artmlx.cli import cli
    from artmlx.cli_help import SECTIONS

    ctx = click.Context(cli)
    visible = {n for n in cli.list_commands(ctx) if not cli.get_command(ctx, n).hidden}
    placed = [name for _, rows in SECTIONS for name, _ in rows]
    assert sorted(placed) == sorted(visible)  # none left under "Other", none stale
    text = artmlx("--help").stdout
    for title, rows in SECTIONS:
        assert f"{title}:" in text
        for name, summary in rows:
            assert f"{name}  " in text and summary in text
    assert "model-path" not in text and "Other:" not in text
    assert artmlx("model-path", "tiny").returncode == 0  # the first spelling still works


def test_train_and_run_both_offer_the_agent_options():
    train_help, run_help = artmlx("train", "--help").stdout, artmlx("run", "--help").stdout
    for option in ("--rollout TEXT", "--scenarios TEXT", "--eval-scenarios TEXT"):
        assert option in train_help and option in run_help
    unloadable = artmlx("train", "--rollout", "no_such_agent.py:rollout")
    assert unloadable.returncode == 2 and "no_such_agent.py" in unloadable.stderr


@pytest.mark.slow
def test_train_stops_on_sigterm_after_the_update_checkpointed_and_resumes_exactly(tmp_path):
    """SIGTERM lets the update in progress finish, checkpoints it and exits 0; `--resume` then ends where an
    uninterrupted run of the same steps ends, bit for bit (the synchronous loop is reproducible)."""
    import signal
    import time

    from artmlx.learner.checkpoint import checkpoint_step, latest_checkpoint

    # a constant rate: the stopped run is told 200 steps and the straight one fewer, and a decaying rate follows
    # `steps` (a resumed scheduled run is pinned by tests/learner/test_trainer.py)
    small = ["--set", "groups_per_step=2", "--set", "group_size=4", "--set", "eval_every=0",
             "--set", "checkpoint_every=100", "--set", "lr_schedule='constant'"]
    run = tmp_path / "stopped"
    process = subprocess.Popen([sys.executable, "-m", "artmlx", "train", "--out", str(run), "--steps", "200", *small],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=dict(os.environ, PYTHONUNBUFFERED="1"))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not ((run / "metrics.jsonl").exists()
                                               and [r for r in read_metrics(run) if "reward_mean" in r]):
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr[-2000:]
    done = max(r["step"] for r in read_metrics(run) if "reward_mean" in r)
    assert 1 <= done < 200 and f"stopped by signal SIGTERM after update {done}: checkpointed" in stdout
    assert checkpoint_step(latest_checkpoint(run)) == done  # not a multiple of checkpoint_every: saved on stop

    resumed = artmlx("train", "--out", str(run), "--resume", "--steps", str(done + 2))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert [r["step"] for r in read_metrics(run) if "reward_mean" in r] == list(range(1, done + 3))
    straight = artmlx("train", "--out", str(tmp_path / "straight"), "--steps", str(done + 2), *small)
    assert straight.returncode == 0, straight.stderr[-2000:]
    import mlx.core as mx

    a = mx.load(str(run / "adapters" / "adapters.safetensors"))
    b = mx.load(str(tmp_path / "straight" / "adapters" / "adapters.safetensors"))
    assert sorted(a) == sorted(b) and all(mx.array_equal(a[k], b[k]).item() for k in a)
