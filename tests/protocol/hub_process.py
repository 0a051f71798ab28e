"""A learner-side process for restart tests: the real LearnerHub on a real port.

    python -m tests.protocol.hub_process ADDRESS STATE.json [--hold-after N]

It consumes each arriving group as `trained` (after the first N it holds them instead) and
rewrites STATE.json atomically after every event: consumed ids (what a learner checkpoints),
received ids and counters. On start it reloads the consumed ids, as a resumed learner would.
"""

import json
import os
import sys
from pathlib import Path

from artmlx.protocol.hub import LearnerHub
from artmlx.protocol.sockets import LearnerSocket


def main() -> None:
    address, state_path = sys.argv[1], Path(sys.argv[2])
    hold_after = int(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[3] == "--hold-after" else 1 << 30
    consumed = set(json.loads(state_path.read_text())["consumed"]) if state_path.exists() else set()
    hub = LearnerHub(LearnerSocket(address), {"env": "tictactoe"}, "fp", max_in_flight=4, consumed=consumed)
    received: list[str] = []

    def save():
        tmp = state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"consumed": sorted(hub.consumed), "received": received,
                                   "counts": dict(hub.counts), "session": hub.session}))
        os.replace(tmp, state_path)

    save()
    trained_here = 0
    while True:
        for _, group in hub.poll(50):
            received.append(group.group_id)
            if trained_here < hold_after:
                hub.consume(group.group_id, "trained")
                trained_here += 1
        save()


if __name__ == "__main__":
    main()
