"""Linux network namespaces joined by a bridge: a private test network of "hosts" on one machine.

Each host is a namespace with one veth link to a switch namespace that holds the bridge; addresses
come from a random private /24 that exists only inside these namespaces (nothing reaches the
machine's own network). Needs root and iproute2; `available()` says why not otherwise.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
from dataclasses import dataclass, field


def available() -> str:
    """'' when namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2 (`ip`) is not installed"
    probe = f"amprobe{os.getpid() % 100000}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ""


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@dataclass
class Network:
    hosts: list[str]
    prefix: str = field(default_factory=lambda: f"am{random.randrange(1 << 20):05x}")
    subnet: str = field(default_factory=lambda: f"10.{random.randrange(64, 250)}.{random.randrange(1, 250)}")
    addresses: dict = field(default_factory=dict)

    @property
    def switch(self) -> str:
        return f"{self.prefix}-sw"

    def namespace(self, host: str) -> str:
        return f"{self.prefix}-{host}"

    def port(self, host: str) -> str:
        """The switch side of a host's link (cut it to take the host off the network)."""
        return f"s{self.prefix[2:]}{self.hosts.index(host)}"

    def __enter__(self) -> "Network":
        try:
            ip("netns", "add", self.switch)
            ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            ip("-n", self.switch, "link", "set", "br0", "up")
            for index, host in enumerate(self.hosts):
                namespace, inside = self.namespace(host), f"h{self.prefix[2:]}{index}"
                ip("netns", "add", namespace)
                ip("link", "add", inside, "type", "veth", "peer", "name", self.port(host))
                ip("link", "set", inside, "netns", namespace)
                ip("link", "set", self.port(host), "netns", self.switch)
                ip("-n", self.switch, "link", "set", self.port(host), "master", "br0")
                ip("-n", self.switch, "link", "set", self.port(host), "up")
                address = f"{self.subnet}.{index + 10}"
                ip("-n", namespace, "addr", "add", f"{address}/24", "dev", inside)
                ip("-n", namespace, "link", "set", inside, "up")
                ip("-n", namespace, "link", "set", "lo", "up")
                self.addresses[host] = address
        except BaseException:
            self.__exit__()
            raise
        return self

    def cut(self, host: str) -> None:
        ip("-n", self.switch, "link", "set", self.port(host), "down")

    def restore(self, host: str) -> None:
        ip("-n", self.switch, "link", "set", self.port(host), "up")

    def hostfile(self, learner: str, blocks: dict[str, dict] | None = None) -> list[dict]:
        """An mlx.launch-style hosts file whose `ssh` fields are the namespaces."""
        blocks = blocks or {}
        return [{"ssh": self.namespace(h), "ips": [self.addresses[h]],
                 "artmlx": {"role": "learner" if h == learner else "actor", **blocks.get(h, {})}} for h in self.hosts]

    def run(self, host: str, *argv: str, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.namespace(host), *argv], **kwargs)

    def kill_everything(self) -> None:
        """Every process still inside the namespaces (a failed test's leftovers)."""
        for namespace in [self.namespace(h) for h in self.hosts]:
            pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), 9)
                except (ProcessLookupError, ValueError):
                    pass

    def __exit__(self, *exc) -> None:
        self.kill_everything()
        for namespace in [self.switch, *(self.namespace(h) for h in self.hosts)]:
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


REMOTE = "ip netns exec {ssh} sh -c {command}"


def write_hostfile(path, entries) -> str:
    with open(path, "w") as out:
        json.dump(entries, out, indent=1)
    return str(path)
