"""CURVE keys: `artmlx keygen DIR` and the socket options that use them.

Layout of a keys directory (made by `make_keys`):
    DIR/learner.key, DIR/learner.key_secret    the learner's pair (actors need learner.key)
    DIR/actor.key,   DIR/actor.key_secret      a pair actors use (copy to each actor machine)
    DIR/allowed/actor.key                       public keys the learner accepts
A learner with keys accepts only clients whose public key is in `DIR/allowed/`; traffic is then
encrypted. More actor identities: `artmlx keygen DIR --actor NAME` adds NAME.key(_secret) and
allows it.

Secret keys are created readable by their owner only (umask 077 while writing) and refused when
group or world can read them. Authentication runs in ZeroMQ's ZAP domain `ZAP_DOMAIN` with
`ZAP_ENFORCE_DOMAIN`, and every message carries its sender's public key (ZAP user id), which the
learner binds to the sender's connection identity (sockets.py). `allowed_keys()` re-reads
`DIR/allowed/`: the learner does that on SIGHUP, so removing a key file revokes it without a restart.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import stat
from pathlib import Path
from urllib.parse import urlparse

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

ZAP_DOMAIN = "artmlx"


def make_keys(folder: Path, actor: str = "actor") -> list[Path]:
    folder = Path(folder)
    (folder / "allowed").mkdir(parents=True, exist_ok=True)
    made = []
    previous = os.umask(0o077)  # secret files are never readable by others, not even for a moment
    try:
        if not (folder / "learner.key_secret").exists():
            made += zmq.auth.create_certificates(str(folder), "learner")
        if not (folder / f"{actor}.key_secret").exists():
            made += zmq.auth.create_certificates(str(folder), actor)
    finally:
        os.umask(previous)
    shutil.copyfile(folder / f"{actor}.key", folder / "allowed" / f"{actor}.key")
    for secret in folder.glob("*.key_secret"):
        secret.chmod(0o600)
    return [Path(p) for p in made]


def _load(path: Path):
    if not path.exists():
        raise FileNotFoundError(f"{path} not found; create keys with `artmlx keygen {path.parent}`")
    if path.name.endswith("_secret") and os.name == "posix" and path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise PermissionError(f"{path} is readable by other users; run `chmod 600 {path}` (and consider the key "
                              "exposed: make a new one with `artmlx keygen`)")
    return zmq.auth.load_certificate(str(path))


def allowed_keys(folder: Path) -> set[str]:
    """The public keys (z85 text) in `folder/allowed/`, read now."""
    return {key.decode("ascii") for key in zmq.auth.load_certificates(str(Path(folder) / "allowed"))}


def server_keys(folder: Path) -> tuple[bytes, bytes]:
    """The learner's key pair from `folder`, after checking it is private and `allowed/` exists."""
    folder = Path(folder)
    public, secret = _load(folder / "learner.key_secret")
    if not (folder / "allowed").is_dir():
        raise FileNotFoundError(f"{folder}/allowed/ not found; create keys with `artmlx keygen {folder}`")
    return public, secret


def secure_server(context: zmq.Context, socket: zmq.Socket, folder: Path) -> ThreadAuthenticator:
    """Make `socket` a CURVE server that admits only keys in `folder/allowed`."""
    folder = Path(folder)
    public, secret = server_keys(folder)
    authenticator = ThreadAuthenticator(context)
    authenticator.start()
    authenticator.configure_curve(domain=ZAP_DOMAIN, location=str(folder / "allowed"))
    socket.zap_domain = ZAP_DOMAIN.encode()
    socket.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
    socket.curve_secretkey = secret
    socket.curve_publickey = public
    socket.curve_server = True
    return authenticator


def secure_client(socket: zmq.Socket, folder: Path, actor: str = "actor") -> None:
    folder = Path(folder)
    public, secret = _load(folder / f"{actor}.key_secret")
    server_public, _ = _load(folder / "learner.key")
    socket.curve_secretkey = secret
    socket.curve_publickey = public
    socket.curve_serverkey = server_public


def is_loopback(address: str) -> bool:
    """True for tcp://127.x, tcp://[::1], tcp://localhost and ipc:// or inproc:// addresses."""
    parsed = urlparse(address)
    if parsed.scheme in ("ipc", "inproc"):
        return True
    host = parsed.hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def keys_usage(folder, actor: str) -> str:
    """What `artmlx keygen` tells the user to do with the keys it wrote."""
    return (f"learner: --keys {folder} (uses learner.key_secret and {folder}/allowed/)\n"
            f"actors:  copy {folder}/learner.key, {folder}/{actor}.key and {folder}/{actor}.key_secret "
            f"to each actor machine and pass --keys there")
