#!/usr/bin/env bash
# Runs measurements on a Linux machine with an NVIDIA GPU through MLX's CUDA backend, from anywhere in the checkout:
#   bash benchmarks/device/run.sh [--out DIR] [--no-install] NAME [NAME ...]
#   bash benchmarks/device/run.sh --list
# NAME is a script of this folder without `.sh` (rollout_families, serve_turns, ...; README.md says what each
# measures). Reports and log.txt go to DIR, else $RESULTS_DIR, else benchmarks/results/device/<gpu>/. Unless MLX
# already sees the GPU, the first script installs MLX's CUDA build ("mlx[cuda13]"), mlx-lm and the project's other
# dependencies into the current Python environment (use a virtual environment without mlx[cpu]); --no-install
# refuses instead. Without a package registry, see stage_offline.sh.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
origin=$PWD
cd "$here/../.."
abs() { case $1 in /*) echo "$1" ;; *) echo "$origin/$1" ;; esac; }
names=()
while [ $# -gt 0 ]; do
  case $1 in
    --out) export OUT=$(abs "$2"); shift 2 ;;
    --out=*) export OUT=$(abs "${1#--out=}"); shift ;;
    --no-install) export DEVICE_INSTALL=no; shift ;;
    --list) for f in "$here"/*.sh; do n=$(basename "$f" .sh)
              case $n in common|run|stage_offline) ;; *) echo "$n" ;; esac; done; exit 0 ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) names+=("${1%.sh}"); shift ;;
  esac
done
[ ${#names[@]} -gt 0 ] || { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
status=0
for name in "${names[@]}"; do
  case $name in common|run|stage_offline) echo "$name is not a measurement" >&2; exit 2 ;; esac
  [ -f "$here/$name.sh" ] || { echo "no script benchmarks/device/$name.sh (--list shows them)" >&2; exit 2; }
  echo "=== $name"
  bash "$here/$name.sh" || status=$?
done
exit $status
