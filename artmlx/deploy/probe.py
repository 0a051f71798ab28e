"""What `artmlx fleet doctor` asks each host, run there: `python -m artmlx.deploy.probe facts|listen ...`.

`facts` prints one JSON object: Python, mlx, mlx-lm and artmlx versions, memory, the model (found in
the local cache only, never downloaded) and its fingerprint, the keys and their permissions, and a
real TCP connect to the learner from this process's context (and, on a learner rank, to its
neighbours' ring ports). `listen` holds a TCP port open for a
while so actor hosts can test the path to a learner that is not running yet.
"""

from __future__ import annotations

import argparse
import errno
import importlib.metadata
import ipaddress
import json
import os
import platform
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path


def versions() -> dict:
    found = {"python": platform.python_version(), "system": f"{platform.system()} {platform.machine()}"}
    for package in ("artmlx", "mlx", "mlx-lm"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found


def memory() -> dict:
    """Total and available bytes of this machine's memory (unified memory on a Mac)."""
    if sys.platform == "darwin":
        total = int(subprocess.run(["sysctl", "-n", "hw.memsize"], capture_output=True, text=True).stdout or 0)
        pages = {}
        for line in subprocess.run(["vm_stat"], capture_output=True, text=True).stdout.splitlines():
            name, _, value = line.partition(":")
            if value.strip().rstrip(".").isdigit():
                pages[name.strip()] = int(value.strip().rstrip("."))
        free = sum(pages.get(k, 0) for k in ("Pages free", "Pages inactive", "Pages speculative", "Pages purgeable"))
        return {"total": total, "available": free * os.sysconf("SC_PAGE_SIZE")}
    info = {}
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            name, _, value = line.partition(":")
            info[name] = int(value.split()[0]) * 1024
    return {"total": info.get("MemTotal", 0), "available": info.get("MemAvailable", 0)}


def model_facts(model: str, settings: list[str]) -> dict:
    os.environ["HF_HUB_OFFLINE"] = "1"  # look, never download
    from ..config import load_config, parse_override
    from ..model.policy import LoraSpec, fingerprint, local_model_folder

    config = load_config(None, {"model": model, **dict(parse_override(item) for item in settings)})
    folder = local_model_folder(model)
    if folder is None:
        return {"present": False, "hf_home": os.environ.get("HF_HOME", "")}
    weights = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    return {"present": True, "folder": str(folder), "weight_bytes": weights,
            "fingerprint": fingerprint(model, LoraSpec.from_config(config))}


def key_facts(folder: Path, role: str, key_name: str) -> dict:
    needed = ["learner.key_secret"] if role == "learner" else ["learner.key", f"{key_name}.key_secret"]
    facts = {"folder": str(folder), "missing": [], "exposed": []}
    for name in needed:
        path = folder / name
        if not path.exists():
            facts["missing"].append(name)
        elif name.endswith("_secret") and path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            facts["exposed"].append(name)
    if role == "learner" and not (folder / "allowed").is_dir():
        facts["missing"].append("allowed/")
    return facts


def connect_facts(target: str) -> dict:
    host, _, port = target.rpartition(":")
    host = host.strip("[]")
    started = time.monotonic()
    try:
        with socket.create_connection((host, int(port)), timeout=3):
            return {"ok": True, "ms": round((time.monotonic() - started) * 1000, 1)}
    except OSError as error:
        facts = {"ok": False, "errno": error.errno, "error": str(error) or type(error).__name__}
        if sys.platform == "darwin" and error.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EPERM):
            try:
                private = ipaddress.ip_address(host).is_private and not ipaddress.ip_address(host).is_loopback
            except ValueError:
                private = True
            # macOS 15+ Local Network Privacy fails LAN connects of processes started outside a terminal
            # session (launchd agents, some remote shells) with "No route to host".
            facts["local_network_privacy_suspected"] = private
            facts["terminal_session"] = _has_terminal()
        return facts


def _has_terminal() -> bool:
    try:
        with open("/dev/tty"):
            return True
    except OSError:
        return False


def listen(ip: str, port: int, seconds: float) -> int:
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            server.bind((ip, port))
        except OSError as error:
            print(json.dumps({"listening": False, "errno": error.errno, "error": str(error)}), flush=True)
            return 1
        server.listen(64)
        server.settimeout(0.2)
        print(json.dumps({"listening": True}), flush=True)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                connection, _ = server.accept()
                connection.close()
            except OSError:
                pass
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m artmlx.deploy.probe")
    commands = parser.add_subparsers(dest="command", required=True)
    facts = commands.add_parser("facts")
    facts.add_argument("--model", default="tiny")
    facts.add_argument("--set", dest="settings", action="append", default=[])
    facts.add_argument("--keys", default="")
    facts.add_argument("--role", default="actor")
    facts.add_argument("--key-name", default="actor")
    facts.add_argument("--connect", default="")
    facts.add_argument("--ring", default="", help="ip:port of learner ranks to reach, comma-separated")
    listener = commands.add_parser("listen")
    listener.add_argument("ip")
    listener.add_argument("port", type=int)
    listener.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args(argv)
    if args.command == "listen":
        return listen(args.ip, args.port, args.seconds)
    report = {"versions": versions(), "memory": memory()}
    if args.connect:
        report["connect"] = connect_facts(args.connect)
    if args.ring:
        report["ring"] = [{"target": target, **connect_facts(target)} for target in args.ring.split(",")]
    if args.keys:
        report["keys"] = key_facts(Path(args.keys).expanduser(), args.role, args.key_name)
    try:
        report["model"] = model_facts(args.model, args.settings)
    except (ValueError, OSError) as error:
        report["model"] = {"present": False, "error": str(error)}
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
