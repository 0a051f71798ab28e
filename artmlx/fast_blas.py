"""Use an optimized BLAS under MLX's Linux CPU build when the machine has one.

The `mlx[cpu]` wheels for Linux bundle the reference (netlib) BLAS, which runs float matrix
products 10-40x slower than OpenBLAS on the same cores. If the system has OpenBLAS (Debian/Ubuntu:
`apt install libopenblas0-pthread`), the `artmlx` command re-executes itself once with it in
`LD_PRELOAD`, so MLX's `cblas_*` calls resolve there. Set `ARTMLX_FAST_BLAS=0` to keep the bundled
BLAS. Nothing changes on macOS (Accelerate) or with the CUDA build.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libblas.so.3",
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
)
MARKER = "ARTMLX_BLAS_PRELOADED"


def bundles_reference_blas() -> bool:
    spec = importlib.util.find_spec("mlx")
    if spec is None or not spec.submodule_search_locations:
        return False
    site = Path(list(spec.submodule_search_locations)[0]).parent
    return any((site / "mlx_cpu.libs").glob("libblas-*"))


def find_openblas() -> str | None:
    return next((path for path in CANDIDATES if os.path.exists(path)), None)


def reexec_with_fast_blas() -> None:
    """Re-run this command with OpenBLAS preloaded, when that applies; otherwise return."""
    if sys.platform != "linux" or os.environ.get("ARTMLX_FAST_BLAS", "1") == "0" or MARKER in os.environ:
        return
    library = find_openblas()
    if library is None or not bundles_reference_blas():
        return
    preload = os.environ.get("LD_PRELOAD", "")
    env = dict(os.environ, LD_PRELOAD=f"{library}:{preload}" if preload else library, **{MARKER: library})
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def blas_description() -> str:
    if MARKER in os.environ:
        return f"OpenBLAS ({os.environ[MARKER]})"
    if sys.platform == "linux" and bundles_reference_blas():
        return "reference BLAS bundled with mlx[cpu] (slow; `apt install libopenblas0-pthread` speeds it up)"
    return "MLX default"
