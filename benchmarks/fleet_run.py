"""A fleet across Linux network namespaces on this machine: one learner host and 1 or 3 actor hosts.

    sudo python benchmarks/fleet_run.py [--seconds 60] [--json FILE]

Everything goes through `artmlx fleet doctor/up/down` with the remote prefix `ip netns exec {ssh} sh -c
{command}` and CURVE keys, over veth links and a bridge (tests/deploy/netns.py). Measured:
- doctor's table for a host whose cached model differs from the learner's and one that cannot reach it;
- per-host generated tokens/s and trained groups/s with 1 actor host, then with 3 (same run length);
- an actor host's link cut for longer than the learner's actor timeout: seconds from the restore to
  its first group trained again.
All namespaces share this machine's cores, so more actor hosts here split the same CPUs: the total
measures the protocol and the fleet code under contention, not the speed-up of separate Macs.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from artmlx.deploy.doctor import examine, render  # noqa: E402
from artmlx.deploy.fleet import FleetControl  # noqa: E402
from artmlx.deploy.hosts import load_hosts  # noqa: E402
from artmlx.deploy.remote import Remote  # noqa: E402
from artmlx.model.tiny import tiny_model_path  # noqa: E402
from tests.deploy.netns import REMOTE, Network, available, write_hostfile  # noqa: E402
from tests.deploy.test_fleet_netns import hub_cache, learner_final_row  # noqa: E402

TRAIN = ["--steps", "1000", "--set", "actor_timeout_s=8", "--set", "eval_every=0"]


def doctor_table(work: Path) -> str:
    repo = "artmlx-test/tiny"
    good = hub_cache(work / "good", repo, tiny_model_path())
    wrong = hub_cache(work / "wrong", repo, tiny_model_path(), {"rms_norm_eps": 1e-3})
    with Network(["L", "A1", "A2", "A3"]) as net:
        blocks = {h: {"python": sys.executable, "workdir": str(work / "doctor" / h), "model_cache": good}
                  for h in net.hosts}
        blocks["A2"]["model_cache"] = wrong
        fleet = load_hosts(write_hostfile(work / "doctor-hosts.json", net.hostfile("L", blocks)))
        net.cut("A3")
        return render(examine(fleet, Remote(REMOTE), model=repo, listen_s=20))


def snapshot(control: FleetControl) -> dict:
    state = control.status() or {"actors": []}
    return {"time": time.monotonic(), "step": state.get("step", 0),
            "actors": {a["name"]: {"host": a["host"], "trained": a["trained"],
                                   "gen_tokens_per_s": a["stats"].get("gen_tokens_per_s") or 0.0}
                       for a in state["actors"]}}


def steady_rates(control: FleetControl, seconds: float) -> dict:
    """Per host over `seconds` after warm-up: mean generated tokens/s and groups trained per second."""
    while snapshot(control)["step"] < 2:
        time.sleep(1)
    first, samples = snapshot(control), []
    while time.monotonic() - first["time"] < seconds:
        time.sleep(3)
        samples.append(snapshot(control))
    last = samples[-1]
    hosts: dict[str, dict] = {}
    for name, actor in last["actors"].items():
        row = hosts.setdefault(actor["host"], {"gen_tokens_per_s": 0.0, "trained_groups_per_s": 0.0})
        rates = [s["actors"][name]["gen_tokens_per_s"] for s in samples if name in s["actors"]]
        row["gen_tokens_per_s"] += sum(rates) / max(1, len(rates))
        before = first["actors"].get(name, {}).get("trained", 0)
        row["trained_groups_per_s"] += (actor["trained"] - before) / (last["time"] - first["time"])
    return {"hosts": hosts, "updates_per_s": (last["step"] - first["step"]) / (last["time"] - first["time"]),
            "total_gen_tokens_per_s": sum(h["gen_tokens_per_s"] for h in hosts.values()),
            "total_trained_groups_per_s": sum(h["trained_groups_per_s"] for h in hosts.values())}


def fleet_run(work: Path, actor_hosts: int, seconds: float, cut: bool) -> dict:
    names = ["L", *(f"A{i + 1}" for i in range(actor_hosts))]
    with Network(names) as net:
        blocks = {h: {"python": sys.executable, "workdir": str(work / f"run{actor_hosts}" / h)} for h in names}
        fleet = load_hosts(write_hostfile(work / f"hosts{actor_hosts}.json", net.hostfile("L", blocks)))
        control = FleetControl(fleet, Remote(REMOTE), work / f"keys{actor_hosts}")
        started = time.monotonic()
        failed = control.up(TRAIN, wait_s=300, say=print)
        assert not failed, failed
        result = {"actor_hosts": actor_hosts, "up_s": time.monotonic() - started, **steady_rates(control, seconds)}
        if cut:
            victim = net.namespace("A1")
            net.cut("A1")
            while any(a["host"] == victim for a in (control.status() or {"actors": []})["actors"]):
                time.sleep(0.5)
            time.sleep(2)
            net.restore("A1")
            restored = time.monotonic()
            while not any(a["host"] == victim and a["trained"] > 0
                          for a in (control.status() or {"actors": []})["actors"]):
                time.sleep(0.5)
            result["restore_to_trained_s"] = time.monotonic() - restored
        control.down(grace_s=30)
        result["final"] = learner_final_row(fleet)
        return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--json")
    args = parser.parse_args()
    if available():
        sys.exit(f"cannot run: {available()}")
    work = Path(tempfile.mkdtemp(prefix="artmlx-fleet-"))
    report = {"date": time.strftime("%Y-%m-%d"), "doctor": doctor_table(work)}
    print(report["doctor"])
    report["one_host"] = fleet_run(work, 1, args.seconds, cut=False)
    print(json.dumps(report["one_host"], indent=1))
    report["three_hosts"] = fleet_run(work, 3, args.seconds, cut=True)
    print(json.dumps(report["three_hosts"], indent=1))
    report["total_ratio_3_vs_1"] = (report["three_hosts"]["total_gen_tokens_per_s"]
                                    / report["one_host"]["total_gen_tokens_per_s"])
    print(f"3 actor hosts vs 1: {report['total_ratio_3_vs_1']:.2f}x generated tokens/s")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
