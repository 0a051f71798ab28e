"""`artmlx fleet up`, `down`, `logs` and per-host status: the learner and actors of a hosts file, over ssh.

up:   CURVE keys are made here (KEYS_DIR: the learner's pair, one pair per actor host, a `status` pair
      for queries) and copied to each host's `WORKDIR/keys` (secrets 0600, written under umask 077);
      the learner starts on its host bound to the hosts file's address, then every actor process
      (`nohup`, pid files and logs in WORKDIR); `up` waits until every actor has loaded the model and
      prints a table per host. A host that already runs a learner or actor is refused ("down first").
      With several learner hosts, each gets the ring's hostfile (`ring.json`) and runs the same learner
      command as one rank (MLX_RANK, MLX_HOSTFILE, as `mlx.launch` starts them); rank 0 is the first.
down: SIGTERM to the learner (it checkpoints and tells its actors to stop), then to its other ranks and
      any actor still running; SIGKILL after a grace period; pid files removed.
logs: the last lines of every log of every host.
Every remote command goes through `Remote` (ssh by default), so `--dry-run` prints them all.
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

from ..protocol.security import make_keys
from .hosts import Fleet, Host
from .remote import Remote, in_workdir, last_line

STATUS_KEY = "status"


def learner_command(fleet: Fleet, train_args: list[str], rank: int = 0) -> str:
    """Learner rank `rank`'s command on its host (every rank runs the same one; rank 0 binds the actors' address)."""
    host = fleet.learners[rank]
    ranks = f"env MLX_RANK={rank} MLX_HOSTFILE=ring.json " if fleet.ranks else ""
    return (f"{ranks}{shlex.quote(host.python)} -m artmlx learner --bind {shlex.quote(fleet.learner.address)} "
            f"--keys keys --plain --out run {shlex.join(train_args)}").rstrip()


def actor_command(fleet: Fleet, host: Host, index: int) -> str:
    budget = f" --memory-budget-gb {host.memory_budget_gb}" if host.memory_budget_gb else ""
    learner = host.learner_address or fleet.learner.address
    return (f"{shlex.quote(host.python)} -m artmlx actor --connect {shlex.quote(learner)} --keys keys "
            f"--actor-key {host.key_name} --name {shlex.quote(f'{host.ssh}-{index}')} "
            f"--host-label {shlex.quote(host.ssh)}{budget}")


def _start(process: str, command: str) -> str:
    """Start `command` detached, its pid in PROCESS.pid and output in PROCESS.log; refuse if one runs."""
    return (f"if [ -f {process}.pid ] && kill -0 \"$(cat {process}.pid)\" 2>/dev/null; then "
            f"echo '{process} is already running (pid '\"$(cat {process}.pid)\"'): artmlx fleet down first' >&2; "
            "exit 3; fi; "
            f"nohup {command} > {process}.log 2>&1 < /dev/null & echo $! > {process}.pid")


def key_files(keys: Path, host: Host, learner: bool) -> dict[str, str]:
    """The key files a host gets, by name under its keys folder."""
    if learner:
        files = {name: (keys / name).read_text() for name in
                 ("learner.key", "learner.key_secret", f"{STATUS_KEY}.key", f"{STATUS_KEY}.key_secret")}
        files.update({f"allowed/{p.name}": p.read_text() for p in sorted((keys / "allowed").glob("*.key"))})
        return files
    return {name: (keys / name).read_text() for name in
            ("learner.key", f"{host.key_name}.key", f"{host.key_name}.key_secret")}


def write_files_command(files: dict[str, str]) -> str:
    """A shell command that writes `files` under ./keys with owner-only permissions."""
    lines = ["umask 077", "rm -rf keys/allowed", "mkdir -p keys/allowed"]
    for name, text in files.items():
        marker = "ARTMLX_KEY_END"
        assert marker not in text and all(part not in ("", "..") for part in name.split("/"))
        lines.append(f"cat > keys/{shlex.quote(name)} <<'{marker}'\n{text.rstrip()}\n{marker}")
    lines.append("chmod 600 keys/*.key_secret")
    return "\n".join(lines)


def ring_file_command(fleet: Fleet) -> str:
    """A shell command that writes the learner ranks' ring hostfile as ./ring.json."""
    return f"cat > ring.json <<'ARTMLX_RING_END'\n{json.dumps(fleet.ring_hostfile())}\nARTMLX_RING_END"


def make_fleet_keys(fleet: Fleet, keys: Path) -> None:
    """Key pairs for the learner, each actor host and status queries, all allowed; kept if present."""
    for name in [STATUS_KEY, *(host.key_name for host in fleet.actors)]:
        make_keys(keys, name)


@dataclass
class HostResult:
    host: str
    ok: bool
    detail: str


class FleetControl:
    def __init__(self, fleet: Fleet, remote: Remote, keys: Path):
        self.fleet, self.remote, self.keys = fleet, remote, Path(keys)

    def _run(self, host: Host, command: str, timeout_s: float | None = None) -> HostResult:
        done = self.remote.run(host, in_workdir(host, command), timeout_s=timeout_s)
        return HostResult(host.ssh, done.returncode == 0,
                          done.stdout.strip() if done.returncode == 0 else last_line(done.stderr or done.stdout)
                          or f"exit status {done.returncode}")

    def distribute_keys(self) -> list[HostResult]:
        if not self.remote.dry_run:
            make_fleet_keys(self.fleet, self.keys)

        def work(host: Host) -> HostResult:
            if self.remote.dry_run:
                return self._run(host, f"# write keys for {host.ssh} from {self.keys}")
            if host in self.fleet.ranks:  # the learner's other ranks talk to rank 0 alone, over the ring
                return self._run(host, ring_file_command(self.fleet))
            files = write_files_command(key_files(self.keys, host, host is self.fleet.learner))
            return self._run(host, files + ("\n" + ring_file_command(self.fleet) if self.fleet.ranks and
                                            host is self.fleet.learner else ""))

        return self.remote.each(self.fleet.hosts, work)

    def up(self, train_args: list[str], wait_s: float = 300.0, say=print) -> list[HostResult]:
        results = self.distribute_keys()
        failed = [r for r in results if not r.ok]
        if failed:
            return failed
        ranks = f" and its {ranks_text(self.fleet)}" if self.fleet.ranks else ""
        say(f"keys copied to {len(results)} hosts; starting the learner on {self.fleet.learner.ssh} "
            f"({self.fleet.learner.address}){ranks}")
        results = [self._run(host, _start("learner", learner_command(self.fleet, train_args, rank)))
                   for rank, host in enumerate(self.fleet.learners)]
        failed = [r for r in results if not r.ok]
        if failed:
            return failed

        def start_actors(host: Host) -> HostResult:
            commands = [_start(f"actor-{i}", actor_command(self.fleet, host, i)) for i in range(host.actors)]
            return self._run(host, " && ".join(commands) or "true")

        results = self.remote.each(self.fleet.actors, start_actors)
        failed = [r for r in results if not r.ok]
        if failed or self.remote.dry_run:
            return failed
        expected = {f"{h.ssh}-{i}" for h in self.fleet.actors for i in range(h.actors)}
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            state = self.status()
            loaded = {a["name"] for a in (state or {}).get("actors", []) if a.get("loaded")}
            if expected <= loaded:
                say(per_host_table(state, self.fleet))
                return []
            ended = self._learner_ended(5) if state is None else None
            if ended is not None:
                return [HostResult(self.fleet.learner.ssh, False, f"the learner exited; its log ends:\n{ended}")]
            time.sleep(2.0)
        missing = sorted(expected - {a["name"] for a in ((self.status() or {}).get("actors", []))})
        return [HostResult(name.rsplit("-", 1)[0], False, f"actor {name} did not join within {wait_s:.0f} s "
                           "(artmlx fleet logs HOSTS shows why)") for name in missing]

    def follow(self, every_s: float = 15.0, say=print) -> None:
        """Print the per-host table every `every_s` until the learner is gone."""
        while True:
            state = self.status()
            ended = self._learner_ended(3) if state is None else None
            if ended is not None:
                say(f"the learner on {self.fleet.learner.ssh} has stopped; its log ends:\n{ended}")
                return
            if state is not None:
                say(per_host_table(state, self.fleet))
            time.sleep(every_s)

    def _learner_ended(self, lines: int) -> str | None:
        """The end of the learner's log once its process is gone; None while it runs."""
        if self._run(self.fleet.learner, 'kill -0 "$(cat learner.pid)"').ok:
            return None
        return self._run(self.fleet.learner, f"tail -n {lines} learner.log").detail

    def status(self) -> dict | None:
        """The learner's state, asked on the learner's host (so it works wherever this runs)."""
        host = self.fleet.learner
        result = self._run(host, f"{shlex.quote(host.python)} -m artmlx status {shlex.quote(host.address)} "
                                 f"--keys keys --actor-key {STATUS_KEY} --json", timeout_s=30)
        if not result.ok:
            return None
        try:
            return json.loads(result.detail)
        except json.JSONDecodeError:
            return None

    def down(self, grace_s: float = 60.0) -> list[HostResult]:
        stop = ("for f in {pattern}; do [ -f \"$f\" ] || continue; kill -TERM \"$(cat \"$f\")\" 2>/dev/null; done; "
                "for i in $(seq {ticks}); do alive=0; for f in {pattern}; do [ -f \"$f\" ] && "
                "kill -0 \"$(cat \"$f\")\" 2>/dev/null && alive=1; done; [ $alive = 0 ] && break; sleep 0.5; done; "
                "for f in {pattern}; do [ -f \"$f\" ] || continue; kill -KILL \"$(cat \"$f\")\" 2>/dev/null "
                "&& echo \"killed $f\"; rm -f \"$f\"; done; true")
        ticks = max(1, int(grace_s * 2))
        learner = self._run(self.fleet.learner, stop.format(pattern="learner.pid", ticks=ticks), timeout_s=grace_s + 30)
        ranks = self.remote.each(self.fleet.ranks, lambda host: self._run(  # after rank 0: they wait in its ring
            host, stop.format(pattern="learner.pid", ticks=min(ticks, 20)), timeout_s=grace_s + 30))
        actors = self.remote.each(self.fleet.actors, lambda host: self._run(
            host, stop.format(pattern="actor-*.pid", ticks=min(ticks, 40)), timeout_s=grace_s + 30))
        return [learner, *ranks, *actors]

    def logs(self, lines: int = 20) -> list[HostResult]:
        return self.remote.each(self.fleet.hosts, lambda host: self._run(
            host, f"for f in *.log; do [ -f \"$f\" ] && echo \"== $f\" && tail -n {int(lines)} \"$f\"; done; true"))


def ranks_text(fleet: Fleet) -> str:
    """The learner's further ranks and their hosts, e.g. "rank 1 on mini" or "ranks 1-2 on mini, pro"."""
    n = len(fleet.ranks)
    return f"rank{'s 1-' + str(n) if n > 1 else ' 1'} on {', '.join(h.ssh for h in fleet.ranks)}"


def per_host_table(state: dict, fleet: Fleet) -> str:
    """Actors, generated tokens/s and groups sent per host, from the learner's status."""
    rows = {host.ssh: {"actors": 0, "tok_s": 0.0, "sent": 0} for host in fleet.actors}
    for actor in state.get("actors", []):
        row = rows.setdefault(actor.get("host", "?"), {"actors": 0, "tok_s": 0.0, "sent": 0})
        row["actors"] += 1
        stats = actor.get("stats", {})
        row["tok_s"] += float(stats.get("gen_tokens_per_s") or 0)
        row["sent"] += int(stats.get("groups_sent") or 0)
    ranks = f", {ranks_text(fleet)}" if fleet.ranks else ""
    lines = [f"learner {fleet.learner.ssh} ({fleet.learner.address}{ranks}): step {state.get('step', '?')}"
             f"/{state.get('steps', '?')}, policy v{state.get('policy_version', '?')}",
             f"  {'host':<20} {'actors':>6} {'gen tok/s':>10} {'groups sent':>12}"]
    for name, row in rows.items():
        lines.append(f"  {name:<20} {row['actors']:>6} {row['tok_s']:>10,.0f} {row['sent']:>12}")
    total = sum(r["tok_s"] for r in rows.values())
    lines.append(f"  {'total':<20} {sum(r['actors'] for r in rows.values()):>6} {total:>10,.0f} "
                 f"{sum(r['sent'] for r in rows.values()):>12}")
    return "\n".join(lines)
