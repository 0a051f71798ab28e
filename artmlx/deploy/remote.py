"""Running a shell command on a host of the fleet.

The remote prefix is a template (`--remote`, or ARTMLX_REMOTE) with `{ssh}` (the host's `ssh` field)
and `{command}` (the shell command, one argument). The default is the system ssh in batch mode, so a
missing key or an unknown host fails at once instead of prompting; the tests use
`ip netns exec {ssh} sh -c {command}` to reach network namespaces through the same code.
With `dry_run` every command is printed and nothing runs.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .hosts import Host

DEFAULT_REMOTE = "ssh -o BatchMode=yes -o ConnectTimeout=5 {ssh} {command}"


def quote_path(path: str) -> str:
    """A path for the remote shell: quoted, with a leading ~ left to the remote shell's $HOME."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def with_env(host: Host, command: str) -> str:
    """`command` with the host's extra environment variables set."""
    assignments = " ".join(f"{name}={shlex.quote(value)}" for name, value in host.environment().items())
    return f"export {assignments}; {command}" if assignments else command


def in_workdir(host: Host, command: str) -> str:
    """`command` run in the host's workdir (made if missing), with its environment."""
    folder = quote_path(host.folder)
    return with_env(host, f"mkdir -p {folder} && cd {folder} && {command}")


@dataclass
class Remote:
    template: str = ""
    dry_run: bool = False
    timeout_s: float = 120.0

    def __post_init__(self):
        self.template = self.template or os.environ.get("ARTMLX_REMOTE") or DEFAULT_REMOTE
        words = shlex.split(self.template)
        if "{command}" not in words:
            raise ValueError(f"the remote prefix {self.template!r} needs a {{command}} word (and usually {{ssh}})")

    def argv(self, host: Host, command: str) -> list[str]:
        words = shlex.split(self.template)
        return [command if word == "{command}" else word.replace("{ssh}", host.ssh) for word in words]

    def run(self, host: Host, command: str, input: str | None = None, timeout_s: float | None = None,
            ) -> subprocess.CompletedProcess:
        argv = self.argv(host, command)
        if self.dry_run:
            print(f"[{host.ssh}] {shlex.join(argv)}" + (f"   (with {len(input)} bytes on stdin)" if input else ""))
            return subprocess.CompletedProcess(argv, 0, "", "")
        try:
            return subprocess.run(argv, input=input, capture_output=True, text=True,
                                  timeout=timeout_s or self.timeout_s,
                                  stdin=None if input is not None else subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(argv, 124, "", f"no answer within {timeout_s or self.timeout_s:g} s")
        except FileNotFoundError as error:
            return subprocess.CompletedProcess(argv, 127, "", f"cannot run {argv[0]!r}: {error}")

    def each(self, hosts, work):
        """`work(host)` for every host in parallel (one thread each); results in the hosts' order."""
        hosts = list(hosts)
        if self.dry_run:
            return [work(host) for host in hosts]
        with ThreadPoolExecutor(max_workers=max(1, min(32, len(hosts)))) as pool:
            return list(pool.map(work, hosts))


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""
