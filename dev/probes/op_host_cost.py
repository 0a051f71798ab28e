"""Host time per MLX operation at decode shapes: what bounds a small-batch decode step on a GPU backend.

    python dev/probes/op_host_cost.py [--json FILE]   # default: $OUT/opcost.json if OUT is set, else /tmp/opcost.json

Each case builds 168 copies of one operation (the LoRA layers of the 0.5B shape) on a (rows, 1, 896)
bfloat16 input, then times the host until `mx.async_eval` returns (building and launching) and until the
results are ready. Measured on the H200 (MLX 0.32.4 CUDA): a 4-bit product ~8 us of host time, an
element-wise op ~6 us, a dense product (cuBLAS) ~23 us, one mlx-lm LoRALinear ~70 us; artmlx's fused
LoRA kernel (`artmlx/model/lora_kernel.py`) after the 4-bit product: see dev/probes/results/h200/op-host-cost.json.
"""
import argparse, time, json, os, sys, mlx.core as mx, mlx.nn as nn
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
res = {}
def bench(name, make, n=168, reps=5):
    ts_l, ts_t = [], []
    for r in range(reps + 1):
        mx.synchronize()
        t0 = time.perf_counter()
        outs = make(n)
        t1 = time.perf_counter()
        mx.async_eval(outs)
        t2 = time.perf_counter()
        mx.eval(outs)
        t3 = time.perf_counter()
        if r: ts_l.append((t2 - t0) / n * 1e6); ts_t.append((t3 - t0) / n * 1e6)
    res[name] = {"host_us_per_op": round(sorted(ts_l)[len(ts_l)//2], 1), "total_us_per_op": round(sorted(ts_t)[len(ts_t)//2], 1)}
    print(name, res[name], flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", default=os.path.join(os.environ.get("OUT", "/tmp"), "opcost.json"))
    args = parser.parse_args()
    for rows in (1, 32):
        x = mx.random.normal((rows, 1, 896)).astype(mx.bfloat16)
        A32 = mx.random.normal((896, 8)) * 0.01; B32 = mx.random.normal((8, 896)) * 0.01
        A16, B16 = A32.astype(mx.bfloat16), B32.astype(mx.bfloat16)
        lin = nn.QuantizedLinear(896, 896, bias=False); lin.set_dtype(mx.bfloat16)
        mx.eval(x, A32, B32, A16, B16, lin.parameters())
        z8 = (x @ A16); mx.eval(z8)
        bench(f"r{rows} qmm", lambda n: [lin(x) for _ in range(n)])
        bench(f"r{rows} add", lambda n: [x + x for _ in range(n)])
        bench(f"r{rows} astype", lambda n: [x.astype(mx.float32) for _ in range(n)])
        bench(f"r{rows} matmul bf16 xA", lambda n: [x @ A16 for _ in range(n)])
        bench(f"r{rows} matmul f32 xA (mixed)", lambda n: [x @ A32 for _ in range(n)])
        bench(f"r{rows} matmul bf16 zB", lambda n: [z8 @ B16 for _ in range(n)])
        bench(f"r{rows} mul-sum xA", lambda n: [(x[..., :, None] * A16).sum(axis=-2) for _ in range(n)])
        bench(f"r{rows} lora mlx_lm f32", lambda n: [lin(x) + (20.0 * ((x @ A32) @ B32)).astype(x.dtype) for _ in range(n)])
        bench(f"r{rows} lora bf16", lambda n: [lin(x) + (20.0 * ((x @ A16) @ B16)) for _ in range(n)])
        fused = mx.compile(lambda x, a, b: (20.0 * ((x @ a) @ b)).astype(x.dtype))
        bench(f"r{rows} lora f32 compiled tail", lambda n: [lin(x) + fused(x, A32, B32) for _ in range(n)])
        from artmlx.model.lora_kernel import lora_product
        bench(f"r{rows} lora fused kernel", lambda n: [lora_product(x, lin(x), A32, B32, 20.0) for _ in range(n)])
        bench(f"r{rows} addmm", lambda n: [mx.addmm(lin(x), x @ A16, B16, alpha=20.0) for _ in range(n)])
    json.dump(res, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
