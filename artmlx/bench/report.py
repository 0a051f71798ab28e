"""What every benchmark report carries: the machine, the versions, the exact command, and the results."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import sys
from importlib import metadata
from pathlib import Path


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def machine() -> dict:
    import mlx.core as mx

    from ..engine.memory import device_memory
    from ..fast_blas import blas_description

    info = mx.device_info() if hasattr(mx, "device_info") else {}
    gpu = mx.default_device() != mx.cpu
    return {
        "platform": platform.platform(), "processor": platform.machine(), "cpu_count": os.cpu_count(),
        "device": str(mx.default_device()), "device_name": info.get("device_name", ""),
        "device_memory_gb": round(device_memory() / 2**30, 1),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "blas": "n/a (GPU)" if gpu else blas_description(),
        "python": platform.python_version(),
        "versions": {name: _version(name) for name in ("artmlx", "mlx", "mlx-lm", "mlx-cuda-13", "pyzmq")},
    }


def _commit() -> str:
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def header() -> dict:
    return {"date": datetime.datetime.now().isoformat(timespec="seconds"), "commit": _commit(),
            "command": " ".join(shlex.quote(a) for a in ["artmlx", *sys.argv[1:]]) if sys.argv else "",
            "machine": machine()}


def write(report: dict, json_path: str | None) -> None:
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(report, indent=2, default=float))


def table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    """A plain-text table: `columns` are (key, heading) pairs; floats get sensible precision."""
    def cell(value) -> str:
        if isinstance(value, float):
            return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}" if abs(value) >= 0.01 else f"{value:.2g}"
        return "" if value is None else str(value)

    cells = [[cell(row.get(key)) for key, _ in columns] for row in rows]
    widths = [max(len(heading), *(len(r[i]) for r in cells)) if cells else len(heading)
              for i, (_, heading) in enumerate(columns)]
    lines = ["  ".join(h.rjust(w) for (_, h), w in zip(columns, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    return "\n".join(lines)
