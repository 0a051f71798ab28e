"""The learner on several ranks: rank 0 is the learner service, ranks 1..N-1 train beside it.

Every rank runs `artmlx learner` with the same configuration, started the way `mlx.launch` starts a
program: `MLX_RANK` and `MLX_HOSTFILE` (the ring backend's hostfile, one `["host:port"]` list per rank;
`artmlx run --learner-ranks N` writes one of loopback ports). Rank 0 owns everything the protocol touches
(hub, admission, ledger, evaluation, checkpoints, the adapter broadcast). Before each update it hands that
update's groups to the other ranks over the same `mx.distributed` group, as the wire's own messages
(`protocol/codec`: no pickle); every rank then trains its share of them and all apply the same AdamW step
(`learner/data_parallel.py`), so their adapters stay equal without a broadcast. A resumed run's state goes
from rank 0 to the others the same way (its checkpoint's files), so the ranks need not share a disk, and
every rank checks that all start from the same adapters.

A rank that dies makes the others' next collective fail (they exit with `EXIT_RANK_LOST`; rank 0 without telling
its actors to leave), or wait for good in a large one (seen with mlx 0.32.4's ring on the CPU). `artmlx run`
then restarts the ranks from the last checkpoint (rank 0 asked first, by SIGUSR1, to checkpoint between updates)
while the actors stay and reconnect; by hand, `--resume` does the same.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import mlx.core as mx
import msgpack
import numpy as np

from ..config import TrainConfig

RANK_ENV, HOSTFILE_ENV = "MLX_RANK", "MLX_HOSTFILE"
EXIT_RANK_LOST = 4  # a learner rank's exit status when a collective failed because another rank was gone


class RankLost(RuntimeError):
    """Another learner rank is gone (mx.distributed's ring lost its connection); the supervisor restarts the ranks."""


def peer_lost(error: BaseException) -> bool:
    """Whether `error` is the ring backend's word that a peer is gone (mlx 0.32: "[ring] connection to a peer was
    lost")."""
    return isinstance(error, RuntimeError) and str(error).startswith("[ring]")


class RankLink:
    """Rank 0's word to the other ranks: one payload (a msgpack map) to all, through two `all_sum`s."""

    def __init__(self, group: mx.distributed.Group):
        self.group = group

    @property
    def rank(self) -> int:
        return self.group.rank()

    @property
    def size(self) -> int:
        return self.group.size()

    def broadcast(self, payload: dict | None = None) -> dict:
        """Rank 0's `payload` on every rank (the others pass None): its size, then its bytes, each summed with
        the others' zeros."""
        data = msgpack.packb(payload, use_bin_type=True) if self.rank == 0 else b""
        size = int(mx.distributed.all_sum(mx.array([len(data)], mx.int64), group=self.group).item())
        buffer = np.frombuffer(data, np.uint8) if self.rank == 0 else np.zeros((size,), np.uint8)
        received = np.array(mx.distributed.all_sum(mx.array(buffer), group=self.group))
        return msgpack.unpackb(received.tobytes(), raw=False)

    def send_state(self, checkpoint: Path | None) -> None:
        """Rank 0: a resumed run's checkpoint files (none for a fresh run, whose ranks start alike by seed)."""
        files = {p.name: p.read_bytes() for p in sorted(checkpoint.iterdir()) if p.is_file()} if checkpoint else {}
        self.broadcast({"op": "state", "files": files})

    def send_update(self, messages: list) -> None:
        """Rank 0: the groups of the update it is about to train (wire messages)."""
        from ..protocol.codec import encode

        self.broadcast({"op": "update", "groups": [[bytes(f) for f in encode(m)] for m in messages]})

    def send_stop(self) -> None:
        self.broadcast({"op": "stop"})


def rank_link() -> RankLink | None:
    """The learner's ranks when this process was started as one of several (`MLX_HOSTFILE` set), else None."""
    if not os.environ.get(HOSTFILE_ENV):
        for variable, backend in (("NCCL_HOST_IP", "nccl"), ("MLX_JACCL_COORDINATOR", "jaccl")):
            if os.environ.get(variable):  # mlx.launch --backend nccl|jaccl: not tried here, so not taken
                raise ValueError(f"{variable} is set (mlx.launch --backend {backend}): the learner's ranks run on "
                                 "mx.distributed's ring backend only so far; launch them with --backend ring")
        return None
    if RANK_ENV not in os.environ:
        raise ValueError(f"{HOSTFILE_ENV} is set but {RANK_ENV} is not: start the learner's ranks with mlx.launch "
                         "or `artmlx run --learner-ranks N`")
    group = mx.distributed.init(backend="ring", strict=True)
    return RankLink(group) if group.size() > 1 else None


def as_rank(config: TrainConfig, serve) -> str:
    """This process's part of the learner, as its environment says: the service (`serve(ranks)`, returning the run
    directory) for rank 0 or a lone learner, else `follow`. Returns its last line; exits with `EXIT_RANK_LOST` when
    another rank was lost (its supervisor restarts the ranks)."""
    ranks = rank_link()
    try:
        if ranks is not None and ranks.rank > 0:
            return f"learner rank {ranks.rank} of {ranks.size} done: {follow(config, ranks)} updates trained"
        return f"learner done: {serve(ranks)}"
    except RankLost as lost:
        print(f"{lost}; stopping (the ranks resume from the last checkpoint)", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_RANK_LOST) from None


def check_same_start(link: RankLink, trainer) -> None:
    """Every rank must hold the same adapters and step before the first update (all ranks call this)."""
    from ..learner.data_parallel import same_everywhere

    state = {"adapters": trainer.model.trainable_parameters(), "step": mx.array([trainer.step], mx.float32)}
    if not same_everywhere(state, link.group):
        raise ValueError(f"learner rank {link.rank}: the ranks start from different adapters or steps "
                         "(the same --model, seed and configuration on every rank?)")


def follow(config: TrainConfig, link: RankLink) -> int:
    """A rank above 0: load the policy, take rank 0's state, then train its share of every update it is handed
    until told to stop. Returns the number of updates trained."""
    from ..engine.loading import open_policy
    from ..learner.checkpoint import load_checkpoint
    from ..learner.settings import TrainerSettings
    from ..learner.trainer import GRPOTrainer
    from ..model.policy import LoraSpec
    from ..protocol.codec import decode
    from ..protocol.convert import message_to_group

    opened = open_policy(config.model, LoraSpec.from_config(config), config.memory_budget_gb, training=True,
                         seed=config.seed)
    trainer = GRPOTrainer(opened.model, TrainerSettings.of(config), opened.plan, group=link.group)
    files = link.broadcast()["files"]
    if files:
        with tempfile.TemporaryDirectory(prefix="artmlx-rank-state-") as folder:
            for name, data in files.items():
                (Path(folder) / Path(name).name).write_bytes(data)
            load_checkpoint(Path(folder), trainer)
    check_same_start(link, trainer)
    updates = 0
    try:
        while True:
            payload = link.broadcast()
            if payload["op"] == "stop":
                return updates
            trainer.train_step([message_to_group(decode(frames)) for frames in payload["groups"]])
            updates += 1
    except RuntimeError as error:
        if peer_lost(error):
            raise RankLost(f"learner rank {link.rank}: {error}") from error
        raise
