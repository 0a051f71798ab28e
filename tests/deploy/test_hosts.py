"""The hosts file: mlx.launch's format with an artmlx block, validated with errors that name the host."""

import json

import pytest

from artmlx.deploy.hosts import DEFAULT_PORT, load_hosts, parse_hosts

MLX_LAUNCH = [{"ssh": "studio", "ips": ["192.168.1.10"]}, {"ssh": "air", "ips": ["192.168.1.11", "10.0.0.2"]}]


def test_an_mlx_launch_hostfile_with_one_learner_block_is_a_fleet():
    entries = json.loads(json.dumps(MLX_LAUNCH))
    entries[0]["artmlx"] = {"role": "learner", "port": 6000}
    fleet = parse_hosts(entries)
    assert fleet.learner.ssh == "studio" and fleet.learner.address == "tcp://192.168.1.10:6000"
    assert [h.ssh for h in fleet.actors] == ["air"] and fleet.actors[0].actors == 1
    assert fleet.actors[0].python == "python3" and fleet.actors[0].folder == "~/artmlx-up/air"


def test_the_learner_binds_the_address_it_is_given_never_a_guess():
    entries = [{"ssh": "s", "ips": ["10.0.0.1", "192.168.1.10"],
                "artmlx": {"role": "learner", "bind_ip": "192.168.1.10"}},
               {"ssh": "a", "ips": ["192.168.1.11"]}]
    assert parse_hosts(entries).learner.address == f"tcp://192.168.1.10:{DEFAULT_PORT}"
    entries[0]["artmlx"]["bind_ip"] = "172.16.0.1"
    with pytest.raises(ValueError, match="bind_ip '172.16.0.1' is not one of its ips"):
        parse_hosts(entries)
    ipv6 = [{"ssh": "s", "ips": ["fd00::1"], "artmlx": {"role": "learner"}}, {"ssh": "a", "ips": ["fd00::2"]}]
    assert parse_hosts(ipv6).learner.address == f"tcp://[fd00::1]:{DEFAULT_PORT}"


def test_further_learner_hosts_are_the_learners_ranks_in_the_order_listed():
    entries = [{"ssh": "studio", "ips": ["10.0.0.1"], "artmlx": {"role": "learner"}},
               {"ssh": "air", "ips": ["10.0.0.2"]},
               {"ssh": "mini", "ips": ["10.0.0.3"], "artmlx": {"role": "learner", "ring_port": 7000}},
               {"ssh": "pro", "ips": ["10.0.0.4", "10.0.1.4"], "artmlx": {"role": "learner", "bind_ip": "10.0.1.4"}},
               {"ssh": "max", "ips": ["10.0.0.5", "169.254.7.5"], "artmlx": {"role": "learner", "ring_ip": "169.254.7.5"}}]
    fleet = parse_hosts(entries)
    assert fleet.learner.ssh == "studio" and [h.ssh for h in fleet.ranks] == ["mini", "pro", "max"]
    assert [h.ssh for h in fleet.learners] == ["studio", "mini", "pro", "max"] and [h.ssh for h in fleet.actors] == ["air"]
    # the ring on each host's ring_ip (a Thunderbolt link), else bind_ip, else its first address
    assert fleet.ring_hostfile() == [["10.0.0.1:5560"], ["10.0.0.3:7000"], ["10.0.1.4:5560"], ["169.254.7.5:5560"]]
    assert fleet.ranks[2].address == "tcp://10.0.0.5:5555"  # its actors' address stays on the first
    assert [h.ssh for h in fleet.hosts] == ["studio", "mini", "pro", "max", "air"]


def test_model_cache_and_env_reach_the_processes():
    entries = [{"ssh": "s", "ips": ["10.0.0.1"], "artmlx": {"role": "learner"}},
               {"ssh": "a", "ips": ["10.0.0.2"], "artmlx": {"model_cache": "/Volumes/ssd/hf", "env": {"OMP": 2}}}]
    assert parse_hosts(entries).actors[0].environment() == {"OMP": "2", "HF_HOME": "/Volumes/ssd/hf"}


@pytest.mark.parametrize("entries, message", [
    ({"ssh": "x"}, "expected a JSON list"),
    ([], "expected a JSON list"),
    ([{"ssh": "a b", "ips": ["1.2.3.4"]}], "'ssh' must be a host name"),
    ([{"ssh": "a", "ips": []}], "'ips' must be a non-empty list"),
    ([{"ssh": "a", "ips": ["1.2.3.4"]}, {"ssh": "a", "ips": ["1.2.3.5"]}], "host 'a': listed twice"),
    ([{"ssh": "a", "ips": ["1.2.3.4"]}], "one host needs"),
    ([{"ssh": "a", "ips": ["1"], "artmlx": {"role": "learner"}},
      {"ssh": "b", "ips": ["1"], "artmlx": {"role": "learner"}}, {"ssh": "c", "ips": ["3"]}],
     "host 'b': ring address 1:5560 is taken by host 'a'"),
    ([{"ssh": "a", "ips": ["fd00::1"], "artmlx": {"role": "learner"}},
      {"ssh": "b", "ips": ["fd00::2"], "artmlx": {"role": "learner"}}, {"ssh": "c", "ips": ["fd00::3"]}],
     "need IPv4 addresses"),
    ([{"ssh": "a", "ips": ["1"], "artmlx": {"ring_port": 0}}], "'ring_port' must be 1..65535"),
    ([{"ssh": "a", "ips": ["1"], "artmlx": {"ring_ip": "2"}}], "ring_ip '2' is not one of its ips"),
    ([{"ssh": "a", "ips": ["1"], "artmlx": {"role": "boss"}}], "role must be one of"),
    ([{"ssh": "a", "ips": ["1"], "artmlx": {"actors": -1}}], "'actors' must be a whole number"),
    ([{"ssh": "a", "ips": ["1"], "artmlx": {"port": 70000}}], "'port' must be 1..65535"),
    ([{"ssh": "a", "ips": ["1"], "artmlx": {"env": {"1X": "v"}}}], "'env' must map variable names"),
    ([{"ssh": "a", "ips": ["1"], "artmlx": {"python": "py\nrm -rf /"}}], "'python' must be a one-line string"),
    ([{"ssh": "a", "ips": ["1"], "artmlx": {"rol": "learner"}}], "unknown artmlx field"),
    ([{"ssh": "a", "ips": ["1"], "artmlx": {"learner_address": "10.0.0.1:5555"}}], "must look like tcp://HOST:PORT"),
    ([{"ssh": "a", "ips": ["1"], "artmlx": {"role": "learner"}}], "no actor host"),
])
def test_bad_hostfiles_are_refused_with_the_host_and_field(entries, message):
    with pytest.raises(ValueError, match=message):
        parse_hosts(entries)


def test_unreadable_files_say_so(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        load_hosts(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("[{")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_hosts(tmp_path / "bad.json")
