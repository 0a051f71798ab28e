"""`artmlx plot`: reward, evaluation score (per update and per second), throughput and staleness.

Several run directories share one figure, so `artmlx train` and `artmlx run` curves compare directly.
"""

from __future__ import annotations

from pathlib import Path

from .metrics import read_metrics


def plot_runs(run_dirs: list[Path], out: Path | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(16, 8.5))
    reward, by_step, by_time, throughput, staleness, idle = axes.flat
    for run_dir in run_dirs:
        rows = read_metrics(run_dir)
        train_rows = [r for r in rows if "reward_mean" in r]
        eval_rows = [r for r in rows if "eval_score" in r]
        label = Path(run_dir).name
        steps = [r["step"] for r in train_rows]
        if train_rows:
            reward.plot(steps, [r["reward_mean"] for r in train_rows], label=label)
            throughput.plot(steps, [r.get("train_tokens_per_s", 0) for r in train_rows], label=f"{label} trained")
            throughput.plot(steps, [r.get("gen_tokens_per_s", 0) for r in train_rows], "--", label=f"{label} generated")
        if train_rows and "staleness_max" in train_rows[0]:
            staleness.plot(steps, [r["staleness_mean"] for r in train_rows], label=f"{label} mean")
            staleness.plot(steps, [r["staleness_max"] for r in train_rows], ":", label=f"{label} max")
            idle.plot(steps, [r["learner_idle_frac"] for r in train_rows], label=label)
        for ax, x_key in ((by_step, "step"), (by_time, "time")):
            if eval_rows:
                xs = [r[x_key] for r in eval_rows]
                ax.plot(xs, [r["eval_score"] for r in eval_rows], marker="o", label=label)
                ax.fill_between(xs, [r["eval_score_ci_low"] for r in eval_rows],
                                [r["eval_score_ci_high"] for r in eval_rows], alpha=0.2)
    reward.set(title="training reward (mean per update)", xlabel="update", ylabel="reward")
    by_step.set(title="eval score (95% CI)", xlabel="update", ylabel="score")
    by_time.set(title="eval score vs wall time", xlabel="seconds", ylabel="score")
    throughput.set(title="tokens per second", xlabel="update", ylabel="tokens/s")
    staleness.set(title="staleness of trained groups (pipeline)", xlabel="update", ylabel="policy versions")
    idle.set(title="learner idle fraction (pipeline)", xlabel="update", ylabel="fraction")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    fig.tight_layout()
    out = out or Path(run_dirs[0]) / "plot.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
