#!/usr/bin/env bash
# For a GPU machine that reaches no package registry: run this here, on a machine that does, from the project's root;
# then copy the working tree with its .gpuA-.gpuE folders there and use run.sh as usual (common.sh finds .gpuB).
# Downloads, for the GPU machine's Python (PY_VERSION, default 3.12, x86-64 Linux):
#   .gpuA/, .gpuB/  MLX's CUDA build (mlx-cuda-13, unpacked and split in two parts of < 40 MB, for transports with
#                   a size limit), mlx, mlx-lm and pyzmq, and .gpuB/install.sh, which installs them in /tmp/site;
#   .gpuC/          starlette, uvicorn, tomli-w, py-spy, and the peers mlx-lm-lora and inductive-mlxrl
#                   (benchmarks/peer_grpo.py; installed without their needs);
#   .gpuD/          the openai client and its needs (agent runs);
#   .gpuE/          empty: the PTX cache goes there (copy a run's $OUT/ptx.tar.xz to .gpuE/ptx.tar.xz).
# The GPU machine needs numpy, transformers, safetensors, msgpack and click already. The folders are git-ignored
# (.git/info/exclude). MLX_VERSION and MLX_LM_VERSION pin the versions.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
MLX_VERSION=${MLX_VERSION:-0.32.4} MLX_LM_VERSION=${MLX_LM_VERSION:-0.32.2} PY_VERSION=${PY_VERSION:-3.12}
for d in /.gpuA/ /.gpuB/ /.gpuC/ /.gpuD/ /.gpuE/; do grep -qxF "$d" .git/info/exclude || echo "$d" >> .git/info/exclude; done
plat="--platform manylinux_2_35_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_26_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
get() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_VERSION" --implementation cp $plat -d "$@"; }
tmp=$(mktemp -d)
get "$tmp" "mlx-cuda-13==$MLX_VERSION" "mlx==$MLX_VERSION" "mlx-lm==$MLX_LM_VERSION" pyzmq
rm -rf .gpuA .gpuB .gpuC .gpuD && mkdir -p .gpuA .gpuB .gpuC .gpuD .gpuE "$tmp/x"
(cd "$tmp/x" && python3 -m zipfile -e "$tmp"/mlx_cuda_13-*.whl . && XZ_OPT=-6 tar cJf "$tmp/cuda.tar.xz" .)
split -b 38m "$tmp/cuda.tar.xz" "$tmp/cuda.part."
mv "$tmp/cuda.part.aa" .gpuA/ && mv "$tmp"/cuda.part.a[b-z] .gpuB/
cp "$tmp"/mlx-*.whl "$tmp"/mlx_lm-*.whl "$tmp"/pyzmq-*.whl .gpuB/
rm -rf "$tmp"
cat > .gpuB/install.sh <<'INSTALL'
# Sourced by benchmarks/device/common.sh from the project's root: MLX's CUDA build, mlx-lm and pyzmq in /tmp/site,
# the project on PYTHONPATH. The CUDA build's first part is read from .gpuA/ (or /root/stage/ where it was staged
# by itself).
if [ ! -d /tmp/site/mlx/lib ]; then
  mkdir -p /tmp/site
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpuB/*.whl
  part_a=$(ls .gpuA/cuda.part.aa /root/stage/cuda.part.aa 2>/dev/null | head -1)
  cat "$part_a" .gpuB/cuda.part.a[b-z] | tar xJ -C /tmp/site
fi
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
INSTALL
get .gpuC starlette uvicorn h11 anyio sniffio tomli-w py-spy mlx-lm-lora inductive-mlxrl
get .gpuD "openai<3" httpx httpcore distro jiter pydantic pydantic-core typing-extensions typing-inspection \
  annotated-types certifi idna tqdm
du -sh .gpuA .gpuB .gpuC .gpuD
