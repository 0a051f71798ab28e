"""`artmlx fleet doctor HOSTS`: what is wrong on each host of a fleet, and how to fix it.

Per host, in parallel: ssh in batch mode (no prompt); the Python there has artmlx, with the same
Python (major.minor), mlx, mlx-lm and artmlx versions as the learner's host; the model is in its
local cache (never downloaded) with the learner's fingerprint; enough free memory for its processes;
keys present and private (after `artmlx fleet up`); and a real TCP connect from each actor host to the
learner's address, made by a process started the way `artmlx fleet up` starts actors. When no learner runs,
the doctor holds the learner's port open for the test (`probe listen`). A learner of several ranks (several
learner hosts) is checked the same way on its ring: each learner host holds its `ring_port` open and connects
to its neighbours' (`ring`), apart from the actors' link to rank 0 (`connect`), so a broken ring link is
told apart from a broken actor link. On macOS 15+ a LAN connect
that fails with "No route to host" from a process outside a terminal session is Local Network
Privacy: the finding says so and how to allow it.
"""

from __future__ import annotations

import errno
import json
import shlex
from dataclasses import dataclass

from .hosts import Fleet, Host
from .remote import Remote, in_workdir, last_line

COMPARED = ("artmlx", "mlx", "mlx-lm")
PROCESS_OVERHEAD = 0.5e9  # bytes an artmlx process needs besides the weights (runtime, a small batch)


@dataclass
class Finding:
    host: str
    check: str
    ok: bool | None  # None: a note, not a problem
    detail: str
    fix: str = ""


def ring_neighbours(fleet: Fleet, host: Host) -> list[Host]:
    """The learner ranks a learner host's rank talks to on the ring (the next and the previous)."""
    learners = list(fleet.learners)
    if len(learners) < 2 or host not in learners:
        return []
    rank = learners.index(host)
    after, before = learners[(rank + 1) % len(learners)], learners[rank - 1]
    return [after] if after is before else [after, before]


def _facts_command(host: Host, fleet: Fleet, model: str, settings: list[str]) -> str:
    learner = fleet.learner
    role = "learner" if host is learner else "actor"
    target = host.learner_address.removeprefix("tcp://") or f"{learner.bind_ip or learner.ips[0]}:{learner.port}"
    connect = "" if host.role == "learner" else f" --connect {shlex.quote(target)}"
    keys = "" if host in fleet.ranks else f" --keys keys --role {role} --key-name {host.key_name}"  # ranks hold none
    ring = ",".join(h.ring_address for h in ring_neighbours(fleet, host))
    sets = "".join(f" --set {shlex.quote(item)}" for item in settings)
    return (f"{shlex.quote(host.python)} -m artmlx.deploy.probe facts --model {shlex.quote(model)}{sets}"
            f"{keys}{connect}" + (f" --ring {shlex.quote(ring)}" if ring else ""))


def _listen_command(host: Host, ip: str, port: int, seconds: float) -> str:
    log, pid = f"probe-listen-{port}.log", f"probe-listen-{port}.pid"
    return (f"rm -f {log}; nohup {shlex.quote(host.python)} -m artmlx.deploy.probe listen "
            f"{shlex.quote(ip)} {port} --seconds {seconds:.0f} > {log} 2>&1 < /dev/null & "
            f"echo $! > {pid}; "
            f"for i in $(seq 40); do grep -q listening {log} 2>/dev/null && break; sleep 0.25; done; "
            f"cat {log}")


def examine(fleet: Fleet, remote: Remote, model: str = "tiny", settings: list[str] | None = None,
            listen_s: float = 30.0) -> list[Finding]:
    settings = list(settings or [])
    findings: list[Finding] = []
    reached = remote.each(fleet.hosts, lambda host: remote.run(host, "true", timeout_s=30))
    reachable = {}
    for host, done in zip(fleet.hosts, reached):
        if done.returncode == 0:
            reachable[host.ssh] = host
            findings.append(Finding(host.ssh, "ssh", True, "commands run without a prompt"))
        else:
            findings.append(Finding(host.ssh, "ssh", False, last_line(done.stderr) or f"exit status {done.returncode}",
                                    f"make key login work: ssh-copy-id {host.ssh}; test: ssh -o BatchMode=yes "
                                    f"{host.ssh} true"))
    learner = fleet.learner
    if learner.ssh in reachable:
        findings.extend(_listen(fleet, remote, listen_s))
    for host in [h for h in fleet.learners if h.ssh in reachable and ring_neighbours(fleet, h)]:
        findings.extend(_listen_ring(host, remote, listen_s))
    work = lambda host: remote.run(host, in_workdir(host, _facts_command(host, fleet, model, settings)),  # noqa: E731
                                   timeout_s=180)
    hosts = [h for h in fleet.hosts if h.ssh in reachable]
    facts = {}
    for host, done in zip(hosts, remote.each(hosts, work)):
        try:
            facts[host.ssh] = json.loads(done.stdout.strip().splitlines()[-1])
        except (json.JSONDecodeError, IndexError):
            why = last_line(done.stderr) or f"exit status {done.returncode}"
            findings.append(Finding(host.ssh, "artmlx", False, why,
                                    f"install artmlx for {host.python} on {host.ssh} (pip install artmlx in its venv), "
                                    "or point artmlx.python in the hosts file at the Python that has it"))
    for host in [h for h in fleet.learners if h.ssh in reachable]:  # free the ports for the learner
        remote.run(host, in_workdir(host, "for f in probe-listen-*.pid; do [ -f \"$f\" ] && kill \"$(cat \"$f\")\" "
                                          "2>/dev/null; rm -f \"$f\"; done; true"), timeout_s=30)
    reference = facts.get(learner.ssh)
    for host in hosts:
        if host.ssh in facts:
            findings.extend(_judge(host, fleet, facts[host.ssh], reference, model))
    order = {h.ssh: i for i, h in enumerate(fleet.hosts)}
    return sorted(findings, key=lambda f: order.get(f.host, 0))


def _listen_answer(host: Host, ip: str, port: int, seconds: float, remote: Remote) -> tuple[dict, str]:
    done = remote.run(host, in_workdir(host, _listen_command(host, ip, port, seconds)), timeout_s=60)
    try:
        return json.loads(last_line(done.stdout) or "{}"), done.stderr
    except json.JSONDecodeError:
        return {}, done.stderr


def _listen_ring(host: Host, remote: Remote, seconds: float) -> list[Finding]:
    """Hold a learner host's ring port open for its neighbours' connects (or find it held by a running rank)."""
    ip, port = host.ring_address.rsplit(":", 1)
    answer, stderr = _listen_answer(host, ip, int(port), seconds, remote)
    if answer.get("listening"):
        return []
    if answer.get("errno") == errno.EADDRINUSE:
        return [Finding(host.ssh, "ring", None, f"ring port {host.ring_address} is in use (a running learner rank?): "
                        "its neighbours test against it", f"if no learner runs there, set artmlx.ring_port")]
    return [Finding(host.ssh, "ring", False, answer.get("error") or last_line(stderr) or "cannot listen",
                    f"check that {ip} is an address of {host.ssh} (`ips` in the hosts file)")]


def _listen(fleet: Fleet, remote: Remote, seconds: float) -> list[Finding]:
    learner = fleet.learner
    ip = learner.bind_ip or learner.ips[0]
    answer, stderr = _listen_answer(learner, ip, learner.port, seconds, remote)
    if answer.get("listening"):
        return [Finding(learner.ssh, "port", True,
                        f"{learner.address} is free; held open {seconds:.0f} s for the test")]
    if answer.get("errno") == errno.EADDRINUSE:
        return [Finding(learner.ssh, "port", None, f"{learner.address} is in use (a running learner?): actors test "
                        "against it", "if no learner runs there: find the process with `lsof -i :"
                        f"{learner.port}` and stop it, or set artmlx.port")]
    return [Finding(learner.ssh, "port", False, answer.get("error") or last_line(stderr) or "cannot listen",
                    f"check that {learner.bind_ip or learner.ips[0]} is an address of {learner.ssh} "
                    "(`ips` in the hosts file)")]


def _judge(host: Host, fleet: Fleet, facts: dict, reference: dict | None, model: str) -> list[Finding]:
    out = []
    mine = facts["versions"]
    if reference is not None and host is not fleet.learner:
        theirs = reference["versions"]
        differ = [f"{name} {mine.get(name)} here, {theirs.get(name)} on the learner" for name in COMPARED
                  if mine.get(name) != theirs.get(name)]
        if mine["python"].rsplit(".", 1)[0] != theirs["python"].rsplit(".", 1)[0]:
            differ.insert(0, f"Python {mine['python']} here, {theirs['python']} on the learner")
        pins = " ".join(f"{name}=={theirs.get(name)}" for name in COMPARED if mine.get(name) != theirs.get(name))
        out.append(Finding(host.ssh, "versions", not differ, "; ".join(differ) or
                           ", ".join(f"{k} {mine.get(k)}" for k in ("python", *COMPARED)),
                           f"{host.python} -m pip install {pins}" if pins else ""))
    out.extend(_judge_model(host, fleet, facts, reference, model))
    need = (host.actors if host.role == "actor" else 1) * (
        1.3 * facts.get("model", {}).get("weight_bytes", 0) + PROCESS_OVERHEAD)
    available = facts["memory"]["available"]
    out.append(Finding(host.ssh, "memory", available >= need,
                       f"{available / 1e9:.1f} GB free of {facts['memory']['total'] / 1e9:.1f} GB, "
                       f"{need / 1e9:.1f} GB needed", "" if available >= need else
                       "close other programs, lower artmlx.actors, or set artmlx.memory_budget_gb"))
    keys = facts.get("keys", {})
    if "keys" not in facts:  # the learner's further ranks hold none
        pass
    elif keys.get("exposed"):
        out.append(Finding(host.ssh, "keys", False, f"readable by others: {', '.join(keys['exposed'])}",
                           f"chmod 600 {keys['folder']}/*.key_secret, and consider them exposed: remove the "
                           "keys folder here and run `artmlx fleet up` again"))
    elif keys.get("missing"):
        out.append(Finding(host.ssh, "keys", None, f"none yet ({', '.join(keys['missing'])})",
                           "`artmlx fleet up` makes and copies them"))
    else:
        out.append(Finding(host.ssh, "keys", True, f"present and private in {keys.get('folder')}"))
    if "connect" in facts:
        out.append(_judge_connect(host, fleet, facts["connect"]))
    for link in facts.get("ring", []):
        out.append(_judge_ring(host, fleet, link))
    return out


def _judge_ring(host: Host, fleet: Fleet, link: dict) -> Finding:
    """A learner rank's link to a neighbouring rank (the ring backend's TCP), apart from the actors' links."""
    other = next((f"rank {i} ({h.ssh})" for i, h in enumerate(fleet.learners) if h.ring_address == link["target"]),
                 link["target"])
    if link.get("ok"):
        return Finding(host.ssh, "ring", True, f"reached learner {other} at {link['target']} in {link['ms']} ms")
    return Finding(host.ssh, "ring", False, f"cannot reach learner {other} at {link['target']}: {link.get('error')}",
                   "the learner's ranks talk over their ring ports (artmlx.ring_port): same network? a firewall "
                   "dropping the port? (actors reach rank 0 on another link, checked as `connect`)")


def _judge_model(host: Host, fleet: Fleet, facts: dict, reference: dict | None, model: str) -> list[Finding]:
    found = facts.get("model", {})
    learner_model = (reference or {}).get("model", {})
    source = f"{fleet.learner.ssh}:{learner_model.get('folder', '<the model folder>')}/"
    if not found.get("present"):
        where = f" (HF_HOME={found['hf_home']})" if found.get("hf_home") else ""
        return [Finding(host.ssh, "model", False, f"{model} is not on this host{where}" +
                        (f": {found['error']}" if found.get("error") else ""),
                        f"copy it: rsync -a {source} {host.ssh}:<its cache folder>/ (or set artmlx.model_cache)")]
    if host is not fleet.learner and learner_model.get("fingerprint") not in (None, found["fingerprint"]):
        return [Finding(host.ssh, "model", False,
                        f"{model} here is not the learner's (fingerprint {found['fingerprint']}, learner "
                        f"{learner_model['fingerprint']})", f"copy the learner's: rsync -a --delete {source} "
                        f"{host.ssh}:{found['folder']}/")]
    return [Finding(host.ssh, "model", True, f"{model} found, fingerprint {found['fingerprint']}")]


def _judge_connect(host: Host, fleet: Fleet, connect: dict) -> Finding:
    target = (host.learner_address.removeprefix("tcp://")
              or f"{fleet.learner.bind_ip or fleet.learner.ips[0]}:{fleet.learner.port}")
    if connect.get("ok"):
        return Finding(host.ssh, "connect", True, f"reached the learner's {target} in {connect['ms']} ms")
    detail = f"cannot reach {target}: {connect.get('error')}"
    if connect.get("local_network_privacy_suspected"):
        return Finding(host.ssh, "connect", False, detail + " (macOS Local Network Privacy blocks LAN connections of "
                       "processes started outside a terminal session)",
                       "on this Mac: System Settings > Privacy & Security > Local Network: allow the terminal app / "
                       f"python ({host.python}); run the actor from a Terminal session once to get the prompt")
    code = connect.get("errno")
    if code == errno.ECONNREFUSED:
        fix = (f"nothing listens on {target}: start the learner (artmlx fleet up), check artmlx.port, and on a Mac "
               "learner allow incoming connections for python (System Settings > Network > Firewall)")
    elif code in (errno.EHOSTUNREACH, errno.ENETUNREACH, None) or "timed out" in str(connect.get("error")):
        fix = (f"no path from {host.ssh} to {target}: same network? is {target.rsplit(':', 1)[0]} the learner's "
               "address on it (`ips` in the hosts file)? a firewall dropping the port?")
    else:
        fix = "check the network between the two hosts"
    return Finding(host.ssh, "connect", False, detail, fix)


def render(findings: list[Finding]) -> str:
    mark = {True: "ok", False: "FAIL", None: "note"}
    width = max([len(f.host) for f in findings] + [4])
    lines = [f"{'host':<{width}}  {'check':<9} {'':<4}  detail / fix"]
    for f in findings:
        lines.append(f"{f.host:<{width}}  {f.check:<9} {mark[f.ok]:<4}  {f.detail}")
        if f.fix and f.ok is not True:
            lines.append(f"{'':<{width}}  {'':<9} {'':<4}  -> {f.fix}")
    problems = sum(1 for f in findings if f.ok is False)
    lines.append(f"{problems} problem(s)" if problems else "no problems found")
    return "\n".join(lines)
