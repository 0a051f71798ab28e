"""Remote commands, dry runs and service files, without any host."""

import plistlib
import shlex
import subprocess

import pytest
from click.testing import CliRunner

from artmlx.cli import cli
from artmlx.deploy.fleet import key_files, make_fleet_keys, write_files_command
from artmlx.deploy.hosts import parse_hosts
from artmlx.deploy.remote import Remote, quote_path
from artmlx.deploy.services import launchd_plist, systemd_unit

ENTRIES = [{"ssh": "studio", "ips": ["192.168.1.10"], "artmlx": {"role": "learner"}},
           {"ssh": "me@air", "ips": ["192.168.1.11"], "artmlx": {"actors": 2, "python": "~/venv/bin/python",
                                                                 "env": {"MLX_X": "a b"}}}]


def test_the_remote_template_gets_the_host_and_the_command_as_one_word():
    fleet = parse_hosts(ENTRIES)
    ssh = Remote()
    argv = ssh.argv(fleet.actors[0], "echo 'hi there'")
    assert argv == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "me@air", "echo 'hi there'"]
    netns = Remote("ip netns exec {ssh} sh -c {command}")
    assert netns.argv(fleet.learner, "true") == ["ip", "netns", "exec", "studio", "sh", "-c", "true"]
    with pytest.raises(ValueError, match="needs a {command} word"):
        Remote("ssh {ssh}")


def test_a_tilde_is_left_to_the_remote_shell_and_the_rest_is_quoted():
    assert quote_path("~/a b") == '"$HOME"/\'a b\''
    assert subprocess.run(["sh", "-c", f"HOME=/h; echo {quote_path('~/a b')}"], capture_output=True,
                          text=True).stdout.strip() == "/h/a b"
    assert quote_path("/x;rm -rf /") == shlex.quote("/x;rm -rf /")


def test_key_files_are_written_private_and_only_where_needed(tmp_path):
    fleet = parse_hosts(ENTRIES)
    keys = tmp_path / "keys"
    make_fleet_keys(fleet, keys)
    actor = key_files(keys, fleet.actors[0], learner=False)
    assert sorted(actor) == ["host-me_air.key", "host-me_air.key_secret", "learner.key"]
    learner = key_files(keys, fleet.learner, learner=True)
    assert "learner.key_secret" in learner and "allowed/host-me_air.key" in learner
    assert not any(name.endswith("_secret") and "me_air" in name for name in learner)
    target = tmp_path / "host"
    target.mkdir()
    subprocess.run(["sh", "-c", write_files_command(actor)], cwd=target, check=True)
    for name, text in actor.items():
        assert (target / "keys" / name).read_text().strip() == text.strip()
    assert (target / "keys" / "host-me_air.key_secret").stat().st_mode & 0o077 == 0


def test_up_and_down_dry_runs_print_every_command_and_run_none(tmp_path):
    hosts = tmp_path / "hosts.json"
    hosts.write_text(__import__("json").dumps(ENTRIES))
    runner = CliRunner()
    up = runner.invoke(cli, ["up", str(hosts), "--dry-run", "--keys-dir", str(tmp_path / "k"), "--steps", "3",
                             "--set", "lora_rank=4"])
    assert up.exit_code == 0, up.output
    assert not (tmp_path / "k").exists()  # nothing made
    lines = up.output.splitlines()
    assert any(line.startswith("[studio] ssh -o BatchMode=yes") and "artmlx learner --bind tcp://192.168.1.10:5555"
               in line and "--steps 3 --set lora_rank=4" in line for line in lines)
    actors = [line for line in lines if line.startswith("[me@air]") and "artmlx actor" in line]
    assert len(actors) == 1 and "actor-0" in actors[0] and "actor-1" in actors[0]
    assert "--connect tcp://192.168.1.10:5555" in actors[0] and "MLX_X=" in actors[0]
    down = runner.invoke(cli, ["down", str(hosts), "--dry-run"])
    assert down.exit_code == 0 and "kill -TERM" in down.output


def test_fleet_commands_live_under_fleet_and_their_first_names_stay_as_hidden_aliases(tmp_path):
    hosts = tmp_path / "hosts.json"
    hosts.write_text(__import__("json").dumps(ENTRIES))
    runner = CliRunner()
    listed = runner.invoke(cli, ["fleet", "--help"]).output
    assert all(f"  {name} " in listed for name in ("doctor", "up", "down", "logs", "status", "service"))
    top = runner.invoke(cli, ["--help"]).output
    assert "  fleet " in top and not any(f"  {name} " in top for name in ("up", "down", "doctor", "fleet-status"))
    for new, old in ((["fleet", "down"], ["down"]), (["fleet", "status"], ["fleet-status"])):
        assert runner.invoke(cli, [*new, "--help"]).output.split("\n", 1)[1] == \
            runner.invoke(cli, [*old, "--help"]).output.split("\n", 1)[1]
    same = [runner.invoke(cli, [*command, str(hosts), "--dry-run"]) for command in (["fleet", "down"], ["down"])]
    assert all(result.exit_code == 0 for result in same) and same[0].output == same[1].output
    assert "kill -TERM" in same[0].output


def test_service_files_run_the_actor_and_restart_it(tmp_path):
    fleet = parse_hosts(ENTRIES)
    agent = plistlib.loads(launchd_plist(fleet, fleet.actors[0], 1).encode())
    assert agent["KeepAlive"] is True and agent["EnvironmentVariables"] == {"MLX_X": "a b"}
    command = agent["ProgramArguments"][2]
    assert agent["ProgramArguments"][:2] == ["/bin/sh", "-c"]
    assert "artmlx actor --connect tcp://192.168.1.10:5555" in command and "--name me@air-1" in command
    unit = systemd_unit(fleet, fleet.actors[0], 0)
    assert "Restart=always" in unit and 'Environment="MLX_X=a b"' in unit
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    assert '\\"$HOME\\"' in exec_start
