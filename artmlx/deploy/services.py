"""Service files for permanent actors: a launchd LaunchAgent (macOS) and a systemd user unit (Linux).

Both run `artmlx actor` for one host of a hosts file, with the learner's address, that host's keys
(copied there by `artmlx fleet up`), its workdir and environment, and restart it when it exits (an actor
waits for a silent or absent learner by itself, so a permanent actor simply outlives runs).

macOS: a LaunchAgent runs outside a terminal session, so macOS 15+ Local Network Privacy applies to
it: the first LAN connection needs the user's permission for that Python, granted in a prompt or in
System Settings > Privacy & Security > Local Network. Load it from the logged-in user's session
(`launchctl bootstrap gui/$(id -u) FILE`); `artmlx fleet doctor` reports the block as "No route to host".
"""

from __future__ import annotations

import plistlib

from .fleet import actor_command
from .hosts import Fleet, Host
from .remote import quote_path

RESTART_S = 10


def _shell(fleet: Fleet, host: Host, index: int) -> str:
    """The command line both service managers run through /bin/sh (which expands ~ there)."""
    return f"cd {quote_path(host.folder)} && exec {actor_command(fleet, host, index)}"


def label(host: Host, index: int) -> str:
    return f"com.artmlx.actor.{host.key_name}.{index}"


def launchd_plist(fleet: Fleet, host: Host, index: int = 0) -> str:
    agent = {
        "Label": label(host, index),
        "ProgramArguments": ["/bin/sh", "-c", _shell(fleet, host, index)],
        "EnvironmentVariables": host.environment(),
        "RunAtLoad": True,
        "KeepAlive": True,
        "ThrottleInterval": RESTART_S,
        "ProcessType": "Interactive",  # not throttled like a background job: it drives the GPU
        "StandardOutPath": f"/tmp/{label(host, index)}.log",
        "StandardErrorPath": f"/tmp/{label(host, index)}.log",
    }
    if not agent["EnvironmentVariables"]:
        del agent["EnvironmentVariables"]
    return plistlib.dumps(agent).decode()


def systemd_unit(fleet: Fleet, host: Host, index: int = 0) -> str:
    environment = "".join(f'Environment="{name}={value}"\n' for name, value in host.environment().items())
    command = _shell(fleet, host, index).replace("%", "%%").replace("\\", "\\\\").replace('"', '\\"')
    return (f"[Unit]\nDescription=artmlx actor {host.ssh}-{index} for the learner at {fleet.learner.address}\n"
            "After=network-online.target\nWants=network-online.target\n\n"
            f"[Service]\n{environment}ExecStart=/bin/sh -c \"{command}\"\nRestart=always\nRestartSec={RESTART_S}\n\n"
            "[Install]\nWantedBy=default.target\n")


def install_hint(kind: str, host: Host, index: int) -> str:
    if kind == "launchd":
        path = f"~/Library/LaunchAgents/{label(host, index)}.plist"
        return f"save as {path} on {host.ssh}, then: launchctl bootstrap gui/$(id -u) {path}"
    path = f"~/.config/systemd/user/artmlx-actor-{index}.service"
    return (f"save as {path} on {host.ssh}, then: systemctl --user daemon-reload && systemctl --user enable --now "
            f"artmlx-actor-{index} (and `loginctl enable-linger` to keep it without a login)")
