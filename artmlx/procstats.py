"""What a long run watches for growth: this process's resident memory, MLX's memory, open files and sockets.

Read from `/proc` on Linux and `/dev/fd` elsewhere (macOS lists a process's descriptors there but has no
`/proc`: its resident size comes from `ps`, once per call). Every value is a plain number; one that cannot be
read on this system is left out, never guessed.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

MB = 1 << 20


def resident_mb(pid: int | None = None) -> float | None:
    """Resident set size of a process (this one by default) in MiB."""
    status = Path(f"/proc/{pid or 'self'}/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024  # kB
        return None
    try:
        out = subprocess.run(["ps", "-o", "rss=", "-p", str(pid or os.getpid())], capture_output=True, text=True,
                             timeout=5, check=False).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return int(out) / 1024 if out.isdigit() else None


def descriptors(pid: int | None = None) -> tuple[int, int] | None:
    """(open descriptors, of which sockets) of a process (this one by default); None where they cannot be
    listed (another process's, off Linux)."""
    if pid is None:  # this process: fstat each descriptor, on any system
        folder = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"
        counts = [0, 0]
        for name in os.listdir(folder):
            try:
                mode = os.fstat(int(name)).st_mode
            except (OSError, ValueError):  # the listing's own descriptor, closed by now
                continue
            counts[0] += 1
            counts[1] += stat.S_ISSOCK(mode)
        return counts[0], counts[1]
    folder = Path(f"/proc/{pid}/fd")
    try:
        names = os.listdir(folder)
    except OSError:
        return None
    sockets = 0
    for name in names:
        try:
            sockets += os.readlink(folder / name).startswith("socket:")
        except OSError:  # closed while listing
            continue
    return len(names), sockets


def process_stats() -> dict:
    """This process's resident memory, MLX's active and cached memory, and its open files and sockets."""
    import mlx.core as mx

    stats = {"mlx_active_mb": round(mx.get_active_memory() / MB, 1), "mlx_cache_mb": round(mx.get_cache_memory() / MB, 1)}
    rss = resident_mb()
    if rss is not None:
        stats["rss_mb"] = round(rss, 1)
    fds = descriptors()
    if fds is not None:
        stats["open_files"], stats["open_sockets"] = fds
    return stats
