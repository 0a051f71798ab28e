"""Checkpoints: a failed write never costs the previous good checkpoint."""

import subprocess
import sys
import textwrap

import mlx.core as mx
import numpy as np
import pytest

from artmlx.learner.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint
from artmlx.learner.settings import trainer_settings
from artmlx.learner.trainer import GRPOTrainer
from artmlx.model.policy import LoraSpec
from tests.helpers import tiny_policy

SAVE_WITH_A_FULL_DISK = textwrap.dedent("""
    import resource, signal, sys
    from artmlx.learner.checkpoint import save_checkpoint
    from artmlx.learner.settings import trainer_settings
    from artmlx.learner.trainer import GRPOTrainer
    from artmlx.model.policy import LoraSpec
    from tests.helpers import tiny_policy
    model, _ = tiny_policy(perturb=0.1, seed=2)
    trainer = GRPOTrainer(model, trainer_settings({}))
    trainer.step = int(sys.argv[2])
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # like a full disk: no file beyond 4 KB
    try:
        save_checkpoint(sys.argv[1], trainer, LoraSpec(rank=8, scale=20.0), "tiny")
    except OSError as error:
        print("failed:", error)
""")


def _trainer(step, seed):
    model, _ = tiny_policy(perturb=0.1, seed=seed)
    trainer = GRPOTrainer(model, trainer_settings({}))
    trainer.step = trainer.policy_version = step
    return trainer


def _weights(path):
    return {k: np.array(v) for k, v in mx.load(str(path / "adapters.safetensors")).items()}


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX resource limits")
def test_a_failed_save_leaves_the_previous_checkpoint_loadable(tmp_path):
    good = _trainer(step=1, seed=1)
    save_checkpoint(tmp_path, good, LoraSpec(rank=8, scale=20.0), "tiny")
    before = _weights(latest_checkpoint(tmp_path))
    for step in ("2", "1"):  # a new step, and a re-save of the same step
        result = subprocess.run([sys.executable, "-c", SAVE_WITH_A_FULL_DISK, str(tmp_path), step],
                                capture_output=True, text=True, timeout=300)
        assert "failed:" in result.stdout and "could not be written" in result.stdout, result.stdout + result.stderr
        assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000001"]
        assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".")]
        after = _weights(latest_checkpoint(tmp_path))
        assert before.keys() == after.keys() and all(np.array_equal(before[k], after[k]) for k in before)
    restored = _trainer(step=0, seed=5)
    assert load_checkpoint(latest_checkpoint(tmp_path), restored) is not None and restored.step == 1


def test_resaving_a_step_replaces_it_only_once_the_new_one_is_in(tmp_path):
    spec = LoraSpec(rank=8, scale=20.0)
    save_checkpoint(tmp_path, _trainer(step=3, seed=1), spec, "tiny")
    save_checkpoint(tmp_path, _trainer(step=3, seed=2), spec, "tiny")
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_000003"]
    # A crash between the two renames leaves only the old folder, hidden: it is found again.
    final = tmp_path / "checkpoints" / "step_000003"
    final.rename(tmp_path / "checkpoints" / ".old_step_000003")
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000003"]
