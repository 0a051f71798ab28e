"""A slow, lossy TCP path for tests (this kernel has no `tc netem`): `python relay.py LISTEN_PORT HOST PORT`.

Every connection is forwarded to HOST:PORT with a delay per chunk, a bandwidth cap, and, now and
then, a reset of both sides (SO_LINGER 0). It prints one line per reset and counts them.
"""

import random
import socket
import struct
import sys
import threading
import time

DELAY_S = 0.03
BYTES_PER_S = 4e6
RESET_AFTER_BYTES = (256 << 10, 1 << 20)  # a connection is reset after a random amount in this range


def reset(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    except OSError:
        pass


def pump(source, sink, budget, lock, rng):
    try:
        while True:
            data = source.recv(16384)
            if not data:
                break
            time.sleep(DELAY_S + len(data) / BYTES_PER_S)
            sink.sendall(data)
            with lock:
                budget[0] -= len(data)
                if budget[0] <= 0:
                    print("reset", flush=True)
                    break
    except OSError:
        pass
    reset(source)
    reset(sink)


def main(listen_port: int, host: str, port: int) -> None:
    rng = random.Random(0)
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", listen_port))
    server.listen(16)
    print("listening", flush=True)
    while True:
        client, _ = server.accept()
        try:
            upstream = socket.create_connection((host, port), timeout=5)
            upstream.settimeout(None)
        except OSError:
            client.close()
            continue
        budget, lock = [rng.randint(*RESET_AFTER_BYTES)], threading.Lock()
        for source, sink in ((client, upstream), (upstream, client)):
            threading.Thread(target=pump, args=(source, sink, budget, lock, rng), daemon=True).start()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
