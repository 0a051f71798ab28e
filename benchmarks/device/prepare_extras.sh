#!/usr/bin/env bash
# Here (not on the device), from the project's root, after ../shared/gpu/prepare.sh: the extra wheels the device
# scripts install from .gpuC/ (serving and profiling: starlette, uvicorn, tomli-w, py-spy; the single-device peers
# mlx-lm-lora and inductive-mlxrl for benchmarks/peer_grpo.py, without their needs: its trainers import none beyond
# mlx, mlx-lm, numpy and tqdm) and .gpuD/ (the openai
# client and its needs, for agent runs; openai < 3 as pyproject.toml pins it), for the device's Python 3.12. Both git-ignored (.git/info/exclude), as is
# .gpuE/ (the PTX cache `save_ptx` returns; absent in a new checkout, so its first device call compiles kernels).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
for d in /.gpuC/ /.gpuD/ /.gpuE/; do grep -qxF "$d" .git/info/exclude || echo "$d" >> .git/info/exclude; done
plat="--platform manylinux_2_35_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
get() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $plat -d "$@"; }
rm -rf .gpuC .gpuD && mkdir -p .gpuC .gpuD .gpuE
get .gpuC starlette uvicorn h11 anyio sniffio tomli-w py-spy mlx-lm-lora inductive-mlxrl
get .gpuD "openai<3" httpx httpcore distro jiter pydantic pydantic-core typing-extensions typing-inspection \
  annotated-types certifi idna tqdm
du -sh .gpuC .gpuD
