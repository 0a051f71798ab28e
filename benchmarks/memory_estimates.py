"""Will it train? The memory plan for real shapes on a 32 GB Mac, from the shapes alone (no weights).

    python benchmarks/memory_estimates.py [--budget-gb 24] [--episode-tokens 4096] [--json FILE]

For every `artmlx model synth` architecture (4-bit, group size 64, as mlx-community's conversions),
the parameter layout comes from mlx-lm's own model class built lazily, and the estimate from the rules
`artmlx train --dry-run` applies to a downloaded folder (`engine/estimate.py`), plain and with per-layer
gradient checkpointing, for Apple silicon
("gpu": no dense copies of 4-bit layers) at `--budget-gb` (a 32 GB Mac recommends ~21-24 GB to the GPU).
These are the plan's estimates, not measurements of a Mac.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from artmlx.engine.estimate import plan_facts, shape_from_tensors  # noqa: E402
from artmlx.engine.memory import GB  # noqa: E402
from artmlx.model.synth import ARCHITECTURES, architecture, model_config, parameter_layout  # noqa: E402

SAFETENSORS_DTYPES = {"uint32": "U32", "bfloat16": "BF16", "float16": "F16", "float32": "F32"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget-gb", type=float, default=24.0)
    parser.add_argument("--episode-tokens", type=int, default=4096)
    parser.add_argument("--reply-tokens", type=int, default=512)
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = {}
    for arch in ARCHITECTURES:
        family, shape = architecture(arch)
        config = model_config(family, shape, arch)
        tensors = {name: (SAFETENSORS_DTYPES[dtype], dims) for name, (dims, dtype) in parameter_layout(config).items()}
        facts = plan_facts(shape_from_tensors(config, tensors, "gpu"), int(args.budget_gb * GB), args.episode_tokens,
                           args.reply_tokens, 8, "gpu")
        rows[arch] = facts
        print(f"{arch:14s} weights {facts['weights_gb']:6.2f} GB  KV/row {facts['kv_mb_per_row']:7.1f} MB  "
              f"one {args.episode_tokens}-token episode: plain {facts['needed_gb_for_one_episode']:6.2f} GB "
              f"({'fits' if facts['fits_plain'] else 'no'}), checkpointed "
              f"{facts['needed_gb_for_one_episode_checkpointed']:6.2f} GB "
              f"({'fits' if facts['fits_checkpointed'] else 'no'})", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"command": shlex.join(sys.argv), "budget_gb": args.budget_gb,
                                               "episode_tokens": args.episode_tokens, "estimates": rows}, indent=1))


if __name__ == "__main__":
    main()
