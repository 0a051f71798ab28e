"""Protocol benchmark: codec throughput, loopback group throughput and adapter fan-out latency,
plain and with CURVE, measured side by side in one run.

    python benchmarks/protocol_bench.py [--json OUT.json]

- codec: encode + strict decode of a tic-tac-toe-sized group (8 episodes x 200 tokens) and a long
  one (8 x 4,096 tokens); groups/s and MB/s.
- groups over loopback: an actor streams 2,000 small groups through the window to a hub that
  acknowledges each at once; groups/s, plain vs CURVE.
- fan-out: the hub publishes a 1.5 M-parameter float32 adapter (6 MB) to 1, 2 and 4 actor
  processes; latency = publish until the last actor has decoded it (median of 15).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from artmlx.protocol.client import ActorClient  # noqa: E402
from artmlx.protocol.codec import decode, encode  # noqa: E402
from artmlx.protocol.hub import LearnerHub  # noqa: E402
from artmlx.protocol.security import make_keys  # noqa: E402
from artmlx.protocol.sockets import ActorSocket, LearnerSocket  # noqa: E402
from tests.protocol.helpers import make_group  # noqa: E402

ADAPTER_PARAMS = 1_500_000


def bench_codec(episodes: int, length: int, seconds: float = 1.5) -> dict:
    group = make_group(episodes=episodes, length=length)
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
    groups = [make_group(episodes=8, length=200) for _ in range(n)]
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
    queue = mp.Queue()
    process = mp.Process(target=_stream_groups, args=(learner.address, keys, n, queue))
    process.start()
    received = 0
    while received < n:
        for _, group in hub.poll(10):
            hub.consume(group.group_id, "trained")
            received += 1
    elapsed = queue.get(timeout=60)
    process.join(10)
    hub.shutdown("done")
    learner.close()
    size = sum(len(memoryview(f)) for f in encode(make_group(episodes=8, length=200)))
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


def bench_fanout(keys, subscribers: int, rounds: int = 15) -> dict:
    learner = LearnerSocket("tcp://127.0.0.1:0", keys=keys)
    hub = LearnerHub(learner, {}, "fp")
    queue = mp.Queue()
    processes = [mp.Process(target=_subscriber, args=(learner.address, keys, f"s{i}", rounds, queue))
                 for i in range(subscribers)]
    for process in processes:
        process.start()
    ready = 0
    while ready < subscribers:
        hub.poll(10)
        while not queue.empty():
            ready += queue.get()[0] == "ready"
    tensors = {"lora": np.random.default_rng(0).standard_normal(ADAPTER_PARAMS).astype(np.float32)}
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
    return {"subscribers": subscribers, "adapter_MB": ADAPTER_PARAMS * 4 / 1e6,
            "latency_ms_median": statistics.median(latencies), "latency_ms_max": max(latencies)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    keys = Path(tempfile.mkdtemp()) / "keys"
    make_keys(keys)
    results = {"codec": [bench_codec(8, 200), bench_codec(8, 4096)]}
    for label, key_dir in (("plain", None), ("curve", keys)):
        results[f"groups_{label}"] = bench_groups(key_dir)
        results[f"fanout_{label}"] = [bench_fanout(key_dir, n) for n in (1, 2, 4)]
    results["curve_cost"] = {
        "groups_throughput_ratio": results["groups_curve"]["groups_per_s"] / results["groups_plain"]["groups_per_s"],
        "fanout4_latency_ratio": results["fanout_curve"][2]["latency_ms_median"]
        / results["fanout_plain"][2]["latency_ms_median"],
    }
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)


if __name__ == "__main__":
    main()
