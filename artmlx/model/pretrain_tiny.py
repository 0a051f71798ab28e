"""Pretrain the embedded tiny base on synthetic transcripts and write `tiny.safetensors`.

    python -m artmlx.model.pretrain_tiny [--steps 800] [--out artmlx/model/tiny.safetensors]

A user's base is pretrained; so is ours, on data this script makes up: tic-tac-toe games in
exactly the transcript format the environment produces, where X's every move is uniform over the
empty cells (so the base plays legally but no better than chance), and arithmetic prompts answered
correctly half the time. Loss is cross-entropy on the assistant tokens only; a move's label is the uniform distribution
over the empty cells (a soft label: far less noisy than the one sampled move). The result
is quantized to 4 bits (group 32) as mlx-lm would, and GRPO then improves it through LoRA.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten

from ..chat import ChatFormat
from ..envs.arithmetic import Arithmetic
from ..envs.tictactoe import TicTacToe
from .tiny import QUANT_BITS, QUANT_GROUP_SIZE, WEIGHTS_FILE, build_tokenizer, model_config


Transcript = tuple[list[int], dict[int, list[int]]]
"""Token ids, and for each position the target ids whose uniform mixture is its label."""


def tictactoe_transcript(chat: ChatFormat, eos: int, digits: list[int], rng: random.Random) -> Transcript:
    env = TicTacToe(opponent=rng.choice(["random", "perfect"]))
    ids = chat.prompt_ids(env.reset(rng.randrange(1 << 30)))
    targets: dict[int, list[int]] = {}
    while True:
        empty = [c for c, v in enumerate(env.board) if v == "."]
        move = rng.choice(empty)
        # Soft label: the move token's target is uniform over all empty cells (low-variance gradients).
        targets[len(ids)] = [digits[c] for c in empty]
        ids.append(digits[move])
        targets[len(ids)] = [eos]
        ids.append(eos)
        result = env.step(str(move + 1))
        if result.done:
            return ids, targets
        ids += chat.continuation_ids(result.messages, eos)


def arithmetic_transcript(chat: ChatFormat, eos: int, digits: list[int], rng: random.Random) -> Transcript:
    env = Arithmetic()
    ids = chat.prompt_ids(env.reset(rng.randrange(1 << 30)))
    answer = env.answer if rng.random() < 0.5 else rng.randint(-9, 18)
    reply = chat.encode(str(answer)) + [eos]
    targets = {len(ids) + i: [token] for i, token in enumerate(reply)}
    return ids + reply, targets


def make_batch(chat, eos, digits, vocab_size, rng, size):
    rows = [
        (tictactoe_transcript if rng.random() < 0.85 else arithmetic_transcript)(chat, eos, digits, rng)
        for _ in range(size)
    ]
    width = max(len(ids) for ids, _ in rows)
    tokens = np.zeros((size, width), np.int32)
    labels = np.zeros((size, width, vocab_size), np.float32)
    for i, (ids, targets) in enumerate(rows):
        tokens[i, : len(ids)] = ids
        for position, choices in targets.items():
            labels[i, position - 1, choices] = 1.0 / len(choices)  # predicted from the previous position
    return mx.array(tokens), mx.array(labels)


def legal_mass(model, chat: ChatFormat, eos: int, digits: list[int], rng: random.Random, games: int = 64) -> float:
    """Mean probability the model puts on empty cells' digits, over X's turns of random games."""
    masses = []
    for _ in range(games):
        ids, targets = tictactoe_transcript(chat, eos, digits, rng)
        move_positions = [p for p, choices in targets.items() if choices != [eos]]
        probs = mx.softmax(model(mx.array([ids]))[0].astype(mx.float32), axis=-1)
        for position in move_positions:
            masses.append(float(probs[position - 1, targets[position]].sum()))
    return float(np.mean(masses))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=WEIGHTS_FILE)
    args = parser.parse_args()

    from mlx_lm.models import qwen2
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    mx.random.seed(args.seed)
    rng = random.Random(args.seed)
    tokenizer = TokenizerWrapper(build_tokenizer())
    chat = ChatFormat(tokenizer)
    eos = tokenizer.eos_token_id
    model = qwen2.Model(qwen2.ModelArgs.from_dict(model_config(quantized=False)))
    warmup = optim.linear_schedule(args.lr * 0.1, args.lr, 50)
    schedule = optim.join_schedules([warmup, optim.cosine_decay(args.lr, args.steps, args.lr * 0.05)], [50])
    optimizer = optim.AdamW(learning_rate=schedule, weight_decay=0.0)

    def loss_fn(model, tokens, labels):
        logprobs = nn.log_softmax(model(tokens[:, :-1]), axis=-1)
        labels = labels[:, :-1]
        return -(labels * logprobs).sum() / labels.sum()

    digits = [chat.encode(str(d))[0] for d in range(1, 10)]
    vocab_size = model_config()["vocab_size"]
    step_fn = nn.value_and_grad(model, loss_fn)
    start = time.time()
    for step in range(1, args.steps + 1):
        tokens, labels = make_batch(chat, eos, digits, vocab_size, rng, args.batch)
        loss, grads = step_fn(model, tokens, labels)
        optimizer.update(model, grads)
        mx.eval(model.parameters(), optimizer.state, loss)
        if step % 50 == 0 or step == 1:
            print(f"step {step:4d}  loss {loss.item():.4f}  {time.time() - start:6.1f}s", flush=True)
        if step % 250 == 0:
            print(f"  legal move mass {legal_mass(model, chat, eos, digits, random.Random(1)):.4f}", flush=True)

    print(f"float model: legal move mass {legal_mass(model, chat, eos, digits, random.Random(1)):.4f}")
    nn.quantize(model, group_size=QUANT_GROUP_SIZE, bits=QUANT_BITS)
    print(f"4-bit model: legal move mass {legal_mass(model, chat, eos, digits, random.Random(1)):.4f}")
    weights = dict(tree_flatten(model.parameters()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(args.out), weights, metadata={"format": "mlx"})
    print(f"wrote {args.out} ({args.out.stat().st_size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
