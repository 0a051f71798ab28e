"""Condense a `py-spy record --native --threads --format raw` profile into where one thread's samples went:
kernel compilation (NVRTC) apart, then by the project's Python line and by MLX/CUDA's native frames.

    python dev/probes/spy_summary.py PROFILE.txt [--thread scheduler] [--top 20] [--json FILE]

The device scripts record raw profiles (`benchmarks/device/decode_host_profile.sh`); those are megabytes, so what
is kept in `dev/probes/results/` is this summary of them.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
from pathlib import Path

OURS = ("artmlx/", "benchmarks/", "dev/", "mlx_lm/")


def summarize(path: Path, thread: str, top: int, process: str = "") -> dict:
    python, native = collections.Counter(), collections.Counter()
    total = compile_samples = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        # `py-spy record --subprocesses` puts the process and its parents ("process N:...") before the thread
        at = 0
        while at < len(frames) - 1 and frames[at].startswith("process "):
            at += 1
        if process not in (frames[at - 1] if at else "") or thread not in frames[at]:
            continue
        n = int(count)
        total += n
        if any("nvrtc" in f or "JitModule" in f for f in frames):
            compile_samples += n
            continue
        ours = [f for f in frames if ".py:" in f and any(o in f for o in OURS)]
        python[ours[-1] if ours else "(other)"] += n
        named = [re.sub(r" \(.*", "", f) for f in frames if "(lib" in f and "0x" not in f]
        native[" < ".join(reversed(named[-2:])) if named else "(python)"] += n
    share = lambda counter: [(k, v, round(v / max(total, 1), 3)) for k, v in counter.most_common(top)]  # noqa: E731
    return {"profile": path.name, "process": process, "thread": thread, "samples": total, "compile_samples": compile_samples,
            "by_python_line": share(python), "by_native_frames": share(native)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("profile", type=Path)
    parser.add_argument("--thread", default="scheduler")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--process", default="", help="with --subprocesses: part of the process's command line")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    report = summarize(args.profile, args.thread, args.top, args.process)
    print(f"{report['samples']} samples of {args.thread}, {report['compile_samples']} compiling kernels")
    for key, n, frac in report["by_python_line"]:
        print(f"{n:6d} {frac:6.1%} {key[:150]}")
    for key, n, frac in report["by_native_frames"]:
        print(f"{n:6d} {frac:6.1%} {key[:150]}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
