"""A learner of two ranks on two hosts (network namespaces): the doctor checks the ring apart from the actors' link,
and `artmlx fleet up` trains with both ranks over it."""

import json
import sys
from pathlib import Path

import pytest

from artmlx.deploy.doctor import examine, render
from artmlx.deploy.fleet import FleetControl
from artmlx.deploy.hosts import load_hosts
from artmlx.deploy.remote import Remote
from tests.deploy.netns import REMOTE, Network, available, write_hostfile
from tests.deploy.test_fleet_netns import wait_state

REASON = available()
pytestmark = pytest.mark.skipif(bool(REASON), reason=REASON or "namespaces available")


def two_rank_fleet(net: Network, tmp_path: Path):
    blocks = {h: {"python": sys.executable, "workdir": str(tmp_path / h)} for h in net.hosts}
    blocks["L2"]["role"] = "learner"  # the second learner host: rank 1
    return load_hosts(write_hostfile(tmp_path / "hosts.json", net.hostfile("L1", blocks)))


def test_the_doctor_tells_a_broken_ring_link_from_the_actors_link(tmp_path):
    with Network(["L1", "L2", "A1"]) as net:
        fleet = two_rank_fleet(net, tmp_path)
        assert [h.ssh for h in fleet.ranks] == [net.namespace("L2")]
        findings = examine(fleet, Remote(REMOTE), listen_s=20)
        print(render(findings))
        ring = {f.host: f for f in findings if f.check == "ring"}
        assert set(ring) == {net.namespace("L1"), net.namespace("L2")} and all(f.ok for f in ring.values())
        assert "reached learner rank 1" in ring[net.namespace("L1")].detail
        assert not [f for f in findings if f.ok is False]

        net.cut("L2")  # rank 1's host off the network: the ring is broken, the actors still reach rank 0
        findings = examine(fleet, Remote(REMOTE), listen_s=20)
        table = render(findings)
        print(table)
        by = {(f.host.rsplit("-", 1)[-1], f.check): f for f in findings}
        assert by["L1", "ring"].ok is False and "cannot reach learner rank 1" in by["L1", "ring"].detail
        assert by["L2", "ring"].ok is False and "cannot reach learner rank 0" in by["L2", "ring"].detail
        assert "ring_port" in by["L1", "ring"].fix
        assert by["A1", "connect"].ok and by["L2", "ssh"].ok and by["L2", "model"].ok
        assert table.endswith("2 problem(s)")


def test_up_trains_with_a_learner_rank_on_another_host(tmp_path):
    with Network(["L1", "L2", "A1"]) as net:
        fleet = two_rank_fleet(net, tmp_path)
        control = FleetControl(fleet, Remote(REMOTE), tmp_path / "keys")
        try:
            failed = control.up(["--steps", "200", "--set", "groups_per_step=4", "--set", "group_size=4",
                                 "--set", "eval_every=0"], wait_s=240, say=print)
            assert failed == [], failed
            wait_state(control, lambda s: s.get("step", 0) >= 3)
        finally:
            results = control.down(grace_s=30)
        assert [r.host for r in results][:2] == [net.namespace("L1"), net.namespace("L2")]
        ring = json.loads((Path(fleet.ranks[0].folder) / "ring.json").read_text())
        assert ring == [[f"{net.addresses['L1']}:5560"], [f"{net.addresses['L2']}:5560"]]
        rows = [json.loads(line) for line in (Path(fleet.learner.folder) / "run" / "metrics.jsonl").read_text().splitlines()]
        trained = [row for row in rows if "reward_mean" in row]
        assert len(trained) >= 3 and all(row["learner_ranks"] == 2 for row in trained)
        final = rows[-1]
        assert final["final"] and final["groups_unaccounted"] == 0
        assert not (Path(fleet.ranks[0].folder) / "learner.pid").exists()
