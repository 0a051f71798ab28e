"""Where a hybrid (Gated DeltaNet) model's prefill spends its time, one part at a time.

    python dev/probes/hybrid_probe.py [--arch qwen3.5-0.8b] [--layers N] [--rows 8] [--tokens 128]
                                      [--parts conv,delta,mlx_lm,engine] [--repeats 3] [--json FILE]

Each part runs `--repeats` times on fresh inputs and prints its seconds as it finishes, so a run
stopped by a timeout still says how far it got (the first repeat includes kernel compilation):
- `conv`: the layer's depthwise causal convolution alone (mlx-lm's `nn.Conv1d`, groups = channels);
- `delta`: mlx-lm's `gated_delta_update` alone (off Metal this is its per-token ops loop);
- `mlx_lm`: the model's own forward over `rows x tokens` with mlx-lm's prompt cache;
- `engine`: artmlx's engine prefill of the same rows (ragged cache, the memory plan's chunking).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def timed(label: str, fn, repeats: int) -> list[float]:
    seconds = []
    for repeat in range(repeats):
        started = time.perf_counter()
        mx.eval(fn(repeat))
        seconds.append(round(time.perf_counter() - started, 4))
        print(f"{label} repeat {repeat}: {seconds[-1]:.4f} s", flush=True)
    return seconds


def linear_layer(model):
    for layer in model.language_model.model.layers if hasattr(model, "language_model") else model.model.layers:
        if hasattr(layer, "linear_attn"):
            return layer.linear_attn
    raise SystemExit("no Gated DeltaNet layer in this model")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="qwen3.5-0.8b")
    parser.add_argument("--layers", type=int, default=0, help="keep only this many layers (0: all)")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--parts", default="conv,delta,mlx_lm,engine")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    from artmlx.engine.generate import Engine
    from artmlx.engine.loading import open_policy
    from artmlx.model.synth import synthesize
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.models.gated_delta import gated_delta_update

    out = Path(tempfile.gettempdir()) / f"artmlx-probe-{args.arch}-{args.layers}"
    if not (out / "config.json").exists():
        synthesize(args.arch, out, shape_overrides={"num_hidden_layers": args.layers} if args.layers else None)
    policy = open_policy(str(out))
    model, rows, tokens = policy.model, args.rows, args.tokens
    attn = linear_layer(model)
    rng = np.random.default_rng(0)
    report = {"command": " ".join(["dev/probes/hybrid_probe.py", *sys.argv[1:]]), "device": str(mx.default_device()),
              "rows": rows, "tokens": tokens, "model": args.arch, "layers": args.layers or "all"}
    parts = args.parts.split(",")
    print(f"model {args.arch} on {mx.default_device()}; plan prefill_tokens({tokens}) = "
          f"{policy.plan.prefill_tokens(tokens)}", flush=True)
    report["plan_prefill_tokens"] = policy.plan.prefill_tokens(tokens)

    if "conv" in parts:
        channels = attn.conv1d.weight.shape[0]
        x = lambda _: mx.random.normal((rows, tokens + attn.conv_kernel_size - 1, channels)).astype(mx.bfloat16)
        report["conv"] = timed(f"conv1d depthwise {channels} channels", lambda r: attn.conv1d(x(r)), args.repeats)
    if "delta" in parts:
        hk, hv, dk, dv = attn.num_k_heads, attn.num_v_heads, attn.head_k_dim, attn.head_v_dim

        def delta(_):
            q = mx.random.normal((rows, tokens, hk, dk)).astype(mx.bfloat16)
            k = mx.random.normal((rows, tokens, hk, dk)).astype(mx.bfloat16)
            v = mx.random.normal((rows, tokens, hv, dv)).astype(mx.bfloat16)
            a = mx.random.normal((rows, tokens, hv)).astype(mx.bfloat16)
            b = mx.random.normal((rows, tokens, hv)).astype(mx.bfloat16)
            return gated_delta_update(q, k, v, a, b, attn.A_log, attn.dt_bias)

        report["delta"] = timed(f"gated_delta_update {hv} heads", delta, args.repeats)
    if "mlx_lm" in parts:
        def forward(_):
            return model(mx.array(rng.integers(0, 1000, (rows, tokens))), cache=make_prompt_cache(model))

        report["mlx_lm"] = timed("mlx-lm forward", forward, args.repeats)
    if "engine" in parts:
        engine = Engine(model, policy.plan)

        def prefill(_):
            return engine.prefill(engine.new_cache(rows), [list(rng.integers(0, 1000, tokens)) for _ in range(rows)])

        report["engine"] = timed("engine prefill", prefill, args.repeats)
    print(json.dumps(report), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
