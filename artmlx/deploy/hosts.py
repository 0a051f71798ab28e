"""The hosts file: `mlx.launch`'s JSON list of `{"ssh": host, "ips": [...]}`, with an `artmlx` block per host.

    [{"ssh": "studio", "ips": ["192.168.1.10"], "artmlx": {"role": "learner", "port": 5555}},
     {"ssh": "air", "ips": ["192.168.1.11"], "artmlx": {"role": "actor", "actors": 1,
      "python": "~/artmlx/.venv/bin/python", "model_cache": "~/.cache/huggingface", "env": {"K": "V"}}}]

A host without an `artmlx` block is an actor host with the defaults (`mlx.launch` files work as they
are, given one learner). The first learner host is the learner actors know (rank 0); it binds its first IP
(or `bind_ip`), never a guessed interface, and actors connect to that address. Further learner hosts are
its data-parallel ranks 1, 2, ... in the order listed (`apps/learner_ranks.py`): every learner host then
listens on `ring_port` at that address (or at `ring_ip`, another of its `ips`: a Thunderbolt link's, say)
for mx.distributed's ring backend. Every error names the host and
the field.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

ROLES = ("learner", "actor")
DEFAULT_PORT = 5555
DEFAULT_RING_PORT = 5560
NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,128}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
BLOCK_FIELDS = {"role", "actors", "python", "workdir", "model_cache", "env", "port", "bind_ip", "memory_budget_gb",
                "learner_address", "ring_port", "ring_ip"}


@dataclass(frozen=True)
class Host:
    """One machine of the fleet."""

    ssh: str
    """How to reach it: an ssh destination (user@host or a ~/.ssh/config alias); with another remote
    prefix (`--remote`), whatever that prefix takes (a network namespace's name in the tests)."""
    ips: tuple[str, ...]
    """Its addresses on the network the fleet shares; the learner binds the first (or `bind_ip`)."""
    role: str = "actor"
    """learner or actor."""
    actors: int = 1
    """Actor processes on this host (an actor host)."""
    python: str = "python3"
    """The Python that has artmlx installed there (a venv's bin/python)."""
    workdir: str = ""
    """Folder for keys, logs, pid files and the run there (default ~/artmlx-up/SSH)."""
    model_cache: str = ""
    """Hugging Face cache to find the model in (HF_HOME); empty: the host's default."""
    env: dict = field(default_factory=dict)
    """Extra environment variables for artmlx processes there."""
    port: int = DEFAULT_PORT
    """The learner's port."""
    bind_ip: str = ""
    """The learner's address to bind, when not the first of `ips`."""
    memory_budget_gb: float = 0.0
    """Per actor process; 0: its share of 75 % of the host's device."""
    learner_address: str = ""
    """How this actor host reaches the learner when not at the learner's own address (a port
    forward, a tunnel, a relay): tcp://HOST:PORT."""
    ring_port: int = DEFAULT_RING_PORT
    """A learner host's port for the ring between the learner's ranks (when there are several)."""
    ring_ip: str = ""
    """A learner host's address for that ring when not its actors' one: its Thunderbolt bridge's IP, say."""

    @property
    def name(self) -> str:
        return self.ssh

    @property
    def folder(self) -> str:
        return self.workdir or f"~/artmlx-up/{self.ssh}"

    @property
    def address(self) -> str:
        """The learner's ZeroMQ address (learner hosts)."""
        ip = self.bind_ip or self.ips[0]
        return f"tcp://[{ip}]:{self.port}" if ":" in ip else f"tcp://{ip}:{self.port}"

    @property
    def ring_address(self) -> str:
        """Where the learner's other ranks reach this learner host's rank (the ring backend's `ip:port`)."""
        return f"{self.ring_ip or self.bind_ip or self.ips[0]}:{self.ring_port}"

    @property
    def key_name(self) -> str:
        """Its actors' CURVE key pair name."""
        return "host-" + re.sub(r"[^A-Za-z0-9_.-]", "_", self.ssh)

    def environment(self) -> dict[str, str]:
        env = {str(k): str(v) for k, v in self.env.items()}
        if self.model_cache:
            env.setdefault("HF_HOME", self.model_cache)
        return env


@dataclass(frozen=True)
class Fleet:
    learner: Host
    actors: tuple[Host, ...]
    ranks: tuple[Host, ...] = ()
    """The learner's further ranks (1, 2, ...), each a learner host of its own."""

    @property
    def hosts(self) -> tuple[Host, ...]:
        return (self.learner, *self.ranks, *self.actors)

    @property
    def learners(self) -> tuple[Host, ...]:
        """Every learner host, rank 0 first."""
        return (self.learner, *self.ranks)

    def ring_hostfile(self) -> list[list[str]]:
        """The ring backend's hostfile for the learner's ranks (MLX_HOSTFILE): one `["ip:port"]` per rank."""
        return [[host.ring_address] for host in self.learners]

    def host(self, name: str) -> Host:
        for host in self.hosts:
            if host.ssh == name:
                return host
        raise ValueError(f"no host {name!r} in the hosts file (hosts: {', '.join(h.ssh for h in self.hosts)})")


def parse_hosts(entries, source: str = "hosts file") -> Fleet:
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{source}: expected a JSON list of hosts like "
                         '[{"ssh": "host", "ips": ["192.168.1.10"], "artmlx": {"role": "learner"}}]')
    hosts, seen = [], set()
    for index, entry in enumerate(entries):
        where = f"{source}, host {index + 1}"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: expected an object with 'ssh' and 'ips'")
        ssh = entry.get("ssh")
        if not isinstance(ssh, str) or not NAME.match(ssh):
            raise ValueError(f"{where}: 'ssh' must be a host name or alias (letters, digits, . _ - @), got {ssh!r}")
        where = f"{source}, host {ssh!r}"
        if ssh in seen:
            raise ValueError(f"{where}: listed twice")
        seen.add(ssh)
        ips = entry.get("ips")
        if not isinstance(ips, list) or not ips or not all(isinstance(ip, str) and ip for ip in ips):
            raise ValueError(f"{where}: 'ips' must be a non-empty list of addresses")
        block = entry.get("artmlx", {})
        if not isinstance(block, dict):
            raise ValueError(f"{where}: 'artmlx' must be an object")
        unknown = set(block) - BLOCK_FIELDS
        if unknown:
            raise ValueError(f"{where}: unknown artmlx field(s) {sorted(unknown)}; known: {sorted(BLOCK_FIELDS)}")
        hosts.append(_host(ssh, tuple(ips), block, where))
    learners = [h for h in hosts if h.role == "learner"]
    if not learners:
        raise ValueError(f"{source}: one host needs \"artmlx\": {{\"role\": \"learner\"}} (the first learner host "
                         "is the one actors connect to; more are the learner's data-parallel ranks)")
    actors = tuple(h for h in hosts if h.role == "actor")
    if not actors:
        raise ValueError(f"{source}: no actor host (every host but the learners' is one by default)")
    if len(learners) > 1:
        if any(":" in h.ring_address.rsplit(":", 1)[0] for h in learners):
            raise ValueError(f"{source}: the learner's ranks need IPv4 addresses for mx.distributed's ring "
                             f"(learner hosts: {', '.join(h.ssh for h in learners)})")
        seen: dict[str, str] = {}
        for h in learners:
            if h.ring_address in seen:
                raise ValueError(f"{source}, host {h.ssh!r}: ring address {h.ring_address} is taken by host "
                                 f"{seen[h.ring_address]!r}: give one of them another ring_port")
            seen[h.ring_address] = h.ssh
    return Fleet(learners[0], actors, tuple(learners[1:]))


def _host(ssh: str, ips: tuple, block: dict, where: str) -> Host:
    role = block.get("role", "actor")
    if role not in ROLES:
        raise ValueError(f"{where}: role must be one of {ROLES}, got {role!r}")
    actors = block.get("actors", 1)
    if not isinstance(actors, int) or isinstance(actors, bool) or not 0 <= actors <= 64:
        raise ValueError(f"{where}: 'actors' must be a whole number from 0 to 64, got {actors!r}")
    for name in ("python", "workdir", "model_cache", "bind_ip", "ring_ip"):
        if not isinstance(block.get(name, ""), str) or "\n" in block.get(name, ""):
            raise ValueError(f"{where}: {name!r} must be a one-line string")
    env = block.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and ENV_NAME.match(k) for k in env):
        raise ValueError(f"{where}: 'env' must map variable names to values")
    if not all(isinstance(v, (str, int, float)) and "\n" not in str(v) for v in env.values()):
        raise ValueError(f"{where}: 'env' values must be one-line strings or numbers")
    port = block.get("port", DEFAULT_PORT)
    ring_port = block.get("ring_port", DEFAULT_RING_PORT)
    for name, value in (("port", port), ("ring_port", ring_port)):
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 65535:
            raise ValueError(f"{where}: {name!r} must be 1..65535, got {value!r}")
    bind_ip, ring_ip = block.get("bind_ip", ""), block.get("ring_ip", "")
    for name, value in (("bind_ip", bind_ip), ("ring_ip", ring_ip)):
        if value and value not in ips:
            raise ValueError(f"{where}: {name} {value!r} is not one of its ips {list(ips)}")
    learner_address = block.get("learner_address", "")
    if learner_address and not re.match(r"^tcp://[A-Za-z0-9_.:\[\]-]+:[0-9]{1,5}$", str(learner_address)):
        raise ValueError(f"{where}: 'learner_address' must look like tcp://HOST:PORT, got {learner_address!r}")
    budget = block.get("memory_budget_gb", 0.0)
    if not isinstance(budget, (int, float)) or budget < 0:
        raise ValueError(f"{where}: 'memory_budget_gb' must be a number >= 0")
    return Host(ssh=ssh, ips=ips, role=role, actors=actors, python=block.get("python") or "python3",
                workdir=block.get("workdir", ""), model_cache=block.get("model_cache", ""), env=dict(env),
                port=port, bind_ip=bind_ip, memory_budget_gb=float(budget), learner_address=learner_address,
                ring_port=ring_port, ring_ip=ring_ip)


def load_hosts(path: str | Path) -> Fleet:
    path = Path(path)
    try:
        entries = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"hosts file {path} not found") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from None
    return parse_hosts(entries, str(path))
