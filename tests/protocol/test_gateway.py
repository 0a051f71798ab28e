"""Whole-message byte limits: the gateway process takes what an actor sends before the learner does.

ZeroMQ assembles a multipart message before delivering it and bounds only frames; these tests send
what a peer speaking raw ZMTP (or a stock client) can send, over real TCP, to a real gateway process.
"""

import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import zmq

from artmlx.protocol.gateway import resident_bytes
from artmlx.protocol.messages import Hello
from artmlx.protocol.sockets import ActorSocket, LearnerSocket, Undelivered
from tests.protocol.helpers import wait_for


def hello_arrives(learner: LearnerSocket, timeout=20.0) -> bool:
    """A fresh, honest actor socket gets a Hello through (it reconnects by itself if it must)."""
    client = ActorSocket(learner.address)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            client.send(Hello(actor="honest", host="h", artmlx_version="0"))
            received = learner.receive(100)
            if received is not None and isinstance(received[1], Hello):
                return True
        return False
    finally:
        client.close()


def zmtp_null_dealer(address: str) -> socket.socket:
    """A raw TCP connection that has done the ZMTP 3.0 NULL handshake as a DEALER (RFC 23)."""
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    peer = socket.create_connection((host, int(port)))
    greeting = b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00" + b"\x00" * 31
    peer.sendall(greeting)
    name, value = b"Socket-Type", b"DEALER"
    ready = b"\x05READY" + bytes([len(name)]) + name + struct.pack(">I", len(value)) + value
    peer.sendall(b"\x04" + bytes([len(ready)]) + ready)
    return peer


def test_a_message_of_many_small_frames_over_the_limit_is_dropped_whole():
    learner = LearnerSocket("tcp://127.0.0.1:0", max_message_bytes=1 << 20)
    sender = zmq.Context().socket(zmq.DEALER)
    sender.setsockopt(zmq.LINGER, 0)
    sender.connect(learner.address)
    frame = b"x" * (64 << 10)  # each frame well under the limit, 40 of them over it
    sender.send_multipart([frame] * 40)
    assert wait_for(lambda: learner.receive(50) is None and learner.rejections.counts["oversized"] == 1)
    assert hello_arrives(learner)
    sender.close()
    learner.close()


def test_a_message_that_never_ends_resets_the_gateway_and_never_reaches_the_learner():
    learner = LearnerSocket("tcp://127.0.0.1:0", max_message_bytes=1 << 20, memory_limit=64 << 20)
    gateway = learner.process.pid
    before = resident_bytes()
    peer = zmtp_null_dealer(learner.address)
    sent = [0]

    def stream():  # frame after frame, each under the limit, the last one never sent
        chunk = b"\x03" + struct.pack(">Q", 512 << 10) + b"y" * (512 << 10)  # MORE | LONG
        try:
            while sent[0] < (1 << 30):
                peer.sendall(chunk)
                sent[0] += 512 << 10
        except OSError:  # the gateway went down with the message
            pass

    streamer = threading.Thread(target=stream, daemon=True)
    streamer.start()
    assert wait_for(lambda: learner.receive(50) is not None or learner.resets >= 1, timeout=60)
    assert learner.resets == 1 and learner.rejections.counts["gateway_reset"] == 1
    assert learner.process.pid != gateway
    assert sent[0] >= 64 << 20  # the peer got past the gateway's limit...
    assert resident_bytes() - before < 32 << 20  # ...and none of it was held by the learner
    streamer.join(timeout=10)
    peer.close()
    assert hello_arrives(learner)  # same address, new gateway
    learner.close()


def test_a_killed_gateway_is_started_again_on_the_same_address():
    learner = LearnerSocket("tcp://127.0.0.1:0")
    address, first = learner.address, learner.process.pid
    assert hello_arrives(learner)
    os.kill(first, signal.SIGKILL)
    assert hello_arrives(learner)
    assert learner.address == address and learner.process.pid != first and learner.resets == 1
    learner.close()
    assert learner.process.poll() is not None


def test_what_cannot_be_delivered_comes_back_as_undelivered():
    learner = LearnerSocket("tcp://127.0.0.1:0")
    learner.keep_adapter([b"adapter"])
    assert learner.send_adapter(b"nobody-is-here")
    assert wait_for(lambda: learner.receive(50) == (b"nobody-is-here", Undelivered()))
    learner.close()


def test_the_gateway_leaves_when_its_learner_is_killed():
    program = ("import sys, time\n"
               "from artmlx.protocol.sockets import LearnerSocket\n"
               "learner = LearnerSocket('tcp://127.0.0.1:0')\n"
               "print(learner.process.pid, learner._folder, flush=True)\n"
               "time.sleep(600)\n")
    owner = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, text=True)
    gateway, folder = owner.stdout.readline().split()
    assert os.path.isdir(folder)
    owner.kill()
    owner.wait()
    assert wait_for(lambda: not _alive(int(gateway)), timeout=10)
    assert not os.path.exists(folder)  # the control socket's folder, which the killed learner could not remove


def test_a_port_in_use_is_told_by_the_learner():
    taken = LearnerSocket("tcp://127.0.0.1:0")
    try:
        LearnerSocket(taken.address)
    except OSError as error:
        assert "cannot listen on" in str(error) and "in use" in str(error)
    else:
        raise AssertionError("a second learner bound a port in use")
    finally:
        taken.close()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False
