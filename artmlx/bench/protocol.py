"""`artmlx bench protocol`: codec, loopback throughput and adapter fan-out, plain and with CURVE.

- codec: encode + strict decode of a tic-tac-toe-sized group (8 episodes x 200 tokens) and a long
  one (8 x 4,096 tokens); groups/s and MB/s.
- groups over loopback: an actor process streams 2,000 small groups through the window to a hub
  that acknowledges each at once; groups/s, plain vs CURVE.
- fan-out: the hub publishes a 1.5 M-parameter adapter (6 MB in float32, 3 MB in bfloat16) to 1, 2
  and 4 actor processes, with one ZeroMQ I/O thread and with the learner's default; latency =
  publish until the last actor has decoded it (median of 15).
- adapter sizes: LoRA parameters on every linear layer of every block, at ranks 8, 16 and 64, for the
  benchmark architectures (counted from mlx-lm's own layer shapes), in float32 and bfloat16.
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

from ..protocol.client import ActorClient
from ..protocol.codec import decode, encode
from ..protocol.hub import LearnerHub
from ..protocol.messages import TrajectoryGroup
from ..protocol.security import make_keys
from ..protocol.sockets import ActorSocket, LearnerSocket, default_io_threads

ADAPTER_PARAMS = 1_500_000
SIZE_ARCHITECTURES = ("qwen2.5-0.5b", "llama-3.2-1b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b")


def sample_group(episodes: int = 8, length: int = 200) -> TrajectoryGroup:
    """A group with realistic sizes: token ids, a policy mask on the second half, logprobs there."""
    rng = np.random.default_rng(0)
    lengths = np.full(episodes, length, np.int32)
    n = episodes * length
    mask = np.tile(np.arange(length) >= length // 2, episodes)
    return TrajectoryGroup(
        group_id=uuid.uuid4().hex, actor="bench", env="synthetic", fingerprint="fp", seed=1, policy_version=0,
        tokens=rng.integers(0, 150_000, n).astype(np.int32), policy_mask=mask,
        logprobs=np.where(mask, -1.0, 0.0).astype(np.float32), lengths=lengths,
        rewards=rng.random(episodes).astype(np.float32), scores=np.ones(episodes, np.float32),
        turns=np.ones(episodes, np.int32), truncated=np.zeros(episodes, bool), outcomes=[""] * episodes)


def bench_codec(episodes: int, length: int, seconds: float = 1.5) -> dict:
    group = sample_group(episodes, length)
    size = sum(len(memoryview(f)) for f in encode(group))
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        decode(encode(group))
        count += 1
    elapsed = time.perf_counter() - start
    return {"episodes": episodes, "tokens_per_episode": length, "bytes": size,
            "groups_per_s": count / elapsed, "MB_per_s": count * size / elapsed / 1e6}


def _stream_groups(address: str, keys, n: int, queue) -> None:
    client = ActorClient(ActorSocket(address, keys=keys), "bench")
    client.hello("fp")
    groups = [sample_group() for _ in range(n)]
    for group in groups:
        group.group_id = uuid.uuid4().hex
    start = time.perf_counter()
    for group in groups:
        client.submit(group)
    while client.outbox:
        client.pump(5)
    queue.put(time.perf_counter() - start)
    client.socket.close()


def bench_groups(keys, n: int = 2000) -> dict:
    learner = LearnerSocket("tcp://127.0.0.1:0", keys=keys)
    hub = LearnerHub(learner, {}, "fp", max_in_flight=16)
    queue = mp.get_context("spawn").Queue()
    process = mp.get_context("spawn").Process(target=_stream_groups, args=(learner.address, keys, n, queue))
    process.start()
    received = 0
    while received < n:
        for _, group in hub.poll(10):
            hub.consume(group.group_id, "trained")
            received += 1
    elapsed = queue.get(timeout=120)
    process.join(10)
    hub.shutdown("done")
    learner.close()
    size = sum(len(memoryview(f)) for f in encode(sample_group()))
    return {"groups": n, "groups_per_s": n / elapsed, "MB_per_s": n * size / elapsed / 1e6}


def _subscriber(address: str, keys, name: str, rounds: int, queue) -> None:
    client = ActorClient(ActorSocket(address, keys=keys), name, heartbeat_s=0.5)
    client.hello("fp")
    queue.put(("ready", name, 0.0))
    seen = -1
    while seen < rounds:
        client.pump(1)
        adapter = client.take_adapter()
        if adapter is not None and adapter.policy_version > seen:
            seen = adapter.policy_version
            assert adapter.tensors["lora"].size == ADAPTER_PARAMS
            queue.put(("got", name, time.time(), seen))
    client.socket.close()


def bench_fanout(keys, subscribers: int, dtype: str = "float32", rounds: int = 15, io_threads: int = 0) -> dict:
    import mlx.core as mx

    learner = LearnerSocket("tcp://127.0.0.1:0", keys=keys, io_threads=io_threads)
    threads = learner.settings.io_threads
    hub = LearnerHub(learner, {}, "fp")
    context = mp.get_context("spawn")
    queue = context.Queue()
    processes = [context.Process(target=_subscriber, args=(learner.address, keys, f"s{i}", rounds, queue))
                 for i in range(subscribers)]
    for process in processes:
        process.start()
    ready = 0
    while ready < subscribers:
        hub.poll(10)
        while not queue.empty():
            ready += queue.get()[0] == "ready"
    values = np.random.default_rng(0).standard_normal(ADAPTER_PARAMS).astype(np.float32)
    tensors = {"lora": mx.array(values).astype(getattr(mx, dtype))}
    latencies = []
    for version in range(1, rounds + 1):
        hub.poll(20)
        sent_at = time.time()
        hub.publish(version, tensors)
        arrivals = []
        while len(arrivals) < subscribers:
            hub.poll(1)
            while not queue.empty():
                item = queue.get()
                if item[0] == "got" and item[3] == version:
                    arrivals.append(item[2])
        latencies.append((max(arrivals) - sent_at) * 1000)
        time.sleep(0.05)
    for process in processes:
        process.join(10)
    learner.close()
    return {"subscribers": subscribers, "dtype": dtype, "io_threads": threads,
            "adapter_MB": ADAPTER_PARAMS * tensors["lora"].itemsize / 1e6,
            "latency_ms_median": statistics.median(latencies), "latency_ms_max": max(latencies)}


def adapter_sizes(ranks=(8, 16, 64)) -> list[dict]:
    """LoRA parameters and bytes for every linear layer of every block, from mlx-lm's layer shapes."""
    from ..model.synth import architecture, model_config, parameter_layout

    rows = []
    for arch in SIZE_ARCHITECTURES:
        family, shape = architecture(arch)
        layout = parameter_layout(model_config(family, shape, arch))
        pairs = 0  # sum over adapted layers of (inputs + outputs)
        for name, (dims, dtype) in layout.items():
            if name.startswith("model.layers.") and name.endswith(".weight") and dtype == "uint32":
                outputs, packed = dims
                pairs += outputs + packed * 8  # 4-bit: 8 codes per uint32
        for rank in ranks:
            params = pairs * rank
            rows.append({"architecture": arch, "rank": rank, "parameters": params,
                         "MB_float32": params * 4 / 1e6, "MB_bfloat16": params * 2 / 1e6})
    return rows


def run(quick: bool = False, echo=print) -> dict:
    keys = Path(tempfile.mkdtemp()) / "keys"
    make_keys(keys)
    results: dict = {"codec": [bench_codec(8, 200), bench_codec(8, 4096)]}
    for row in results["codec"]:
        echo(f"codec {row['episodes']} x {row['tokens_per_episode']} tokens: {row['groups_per_s']:,.0f} groups/s, "
             f"{row['MB_per_s']:,.0f} MB/s")
    counts = (1, 4) if quick else (1, 2, 4)
    for label, key_dir in (("plain", None), ("curve", keys)):
        results[f"groups_{label}"] = bench_groups(key_dir, 500 if quick else 2000)
        echo(f"groups over loopback, {label}: {results[f'groups_{label}']['groups_per_s']:,.0f} groups/s")
        for dtype in ("float32", "bfloat16"):
            for io_threads in sorted({1, default_io_threads()}):
                rows = [bench_fanout(key_dir, n, dtype, 7 if quick else 15, io_threads) for n in counts]
                results[f"fanout_{label}_{dtype}_io{io_threads}"] = rows
                echo(f"fan-out {label}, {rows[0]['adapter_MB']:.0f} MB {dtype}, {io_threads} I/O thread(s): " + ", ".join(
                    f"{r['subscribers']} actors {r['latency_ms_median']:.1f} ms" for r in rows))
    results["adapter_sizes"] = adapter_sizes()
    for row in results["adapter_sizes"]:
        echo(f"adapter {row['architecture']:<13} rank {row['rank']:>2}: {row['parameters'] / 1e6:6.1f} M parameters, "
             f"{row['MB_float32']:6.1f} MB float32, {row['MB_bfloat16']:6.1f} MB bfloat16")
    return results
