"""`artmlx plot`: reward and evaluation score against wall time and steps, one figure per call."""

from __future__ import annotations

from pathlib import Path

from .metrics import read_metrics


def plot_runs(run_dirs: list[Path], out: Path | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for run_dir in run_dirs:
        rows = read_metrics(run_dir)
        train_rows = [r for r in rows if "reward_mean" in r]
        eval_rows = [r for r in rows if "eval_score" in r]
        label = run_dir.name
        if train_rows:
            axes[0].plot([r["step"] for r in train_rows], [r["reward_mean"] for r in train_rows], label=label)
        if eval_rows:
            for ax, x_key in ((axes[1], "step"), (axes[2], "time")):
                xs = [r[x_key] for r in eval_rows]
                ax.plot(xs, [r["eval_score"] for r in eval_rows], marker="o", label=label)
                ax.fill_between(xs, [r["eval_score_ci_low"] for r in eval_rows],
                                [r["eval_score_ci_high"] for r in eval_rows], alpha=0.2)
    axes[0].set(title="training reward (mean per update)", xlabel="update", ylabel="reward")
    axes[1].set(title="eval score (95% CI)", xlabel="update", ylabel="score")
    axes[2].set(title="eval score vs wall time", xlabel="seconds", ylabel="score")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    out = out or Path(run_dirs[0]) / "plot.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
