"""Run configuration: one dataclass, read from TOML, overridden from the command line.

Every field has a docstring (the text after it). `load_config(path, overrides)` builds a
`TrainConfig`, checks every value and raises `ValueError` naming the field and what to change.
The resolved config is written into each run directory as `config.toml`.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .hints import HINT_FORMS
from .learner.schedule import SCHEDULES


@dataclass
class TrainConfig:
    model: str = "tiny"
    """Base model: `tiny` (the embedded model), a packaged model's name (`artmlx model list`), a GGUF file, a
    Hugging Face id or a local mlx-lm folder."""
    env: str = "tictactoe"
    """Environment: a built-in name (`tictactoe`, `arithmetic`; for real models `math`, `word_problems`,
    `calculator`) or `module:Class`."""
    env_args: dict = field(default_factory=dict)
    """Keyword options for the environment's constructor, e.g. `{opponent = "perfect"}`."""
    rollout: str = ""
    """Agent instead of environment on actors: `module:function` or `file.py:function` naming an ART-style `async def rollout(model, scenario) -> Trajectory` (ART's signature: `model` is an `AgentModel`) or `async def rollout(client, scenario)` (an `openai.AsyncOpenAI` client); the first parameter's name or annotation decides (`rollout/agent_code.py`). `env` is then not used."""
    scenarios: str = ""
    """Scenarios for `rollout`: a JSONL file or `module:name` of a list (empty: `{"seed": seed}` per group)."""
    eval_scenarios: str = ""
    """Held-out scenarios for `rollout` (JSONL or `module:name`): the learner evaluates the agent itself on each of them once, every `eval_every` updates; empty: an agent run is not evaluated."""
    rollout_failure_limit: int = 32
    """Agent rollouts: an actor stops (exit status 3, reporting the function, its signature and the first error) after this many failed rollouts in a row (an exception in the agent's code, or a trajectory that cannot be trained token-exactly); 0 = never. `artmlx run` ends when every actor has stopped."""
    seed: int = 0
    """Seed for task selection, sampling and LoRA initialisation."""
    steps: int = 50
    """Number of training updates (each: rollouts, then one GRPO update)."""
    out: str = ""
    """Run directory; empty means `runs/<date>-<time>`."""

    lora_rank: int = 16
    """LoRA rank r."""
    lora_scale: float = 20.0
    """LoRA scale (mlx-lm's `scale`, i.e. alpha / r)."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA branch input."""
    lora_layers: int = -1
    """Number of transformer blocks (from the top) that get adapters; -1 means all."""
    lora_keys: list = field(default_factory=list)
    """Module paths inside a block to adapt (e.g. `["self_attn.q_proj"]`); empty means every linear layer."""
    dora: bool = False
    """Use DoRA instead of LoRA."""

    groups_per_step: int = 16
    """Tasks (groups) sampled per update."""
    group_size: int = 8
    """Episodes per task, G; advantages compare episodes within a group."""
    dynamic_sampling_rounds: int = 4
    """DAPO's dynamic sampling: a group whose episodes all got the same reward (no gradient) is replaced by new
    tasks, in up to this many more rounds of sampling per update (`artmlx train`); `artmlx run`'s actors do not
    send such groups and play on, up to this many in a row; 0: off, flat groups are sampled, counted and not trained
    (`rollout/dynamic_sampling.py`)."""
    min_group_size: int = 0
    """Agent rollouts: a group whose refused or failed trajectories leave at least this many still trains
    (advantages over the ones left); 0: every one of the G is needed."""
    temperature: float = 1.0
    """Sampling temperature for training rollouts (the learner scales logits by the same value)."""
    max_reply_tokens: int = 8
    """Most tokens the policy may generate in one reply."""
    max_turns: int = 10
    """Most policy replies per episode; longer episodes end as truncated."""
    max_episode_tokens: int = 1024
    """Episodes whose transcript reaches this many tokens end as truncated."""
    decode_chunk: int = 0
    """Agent rollouts: decode steps the actor's in-process server queues between two host reads of the sampled tokens (`artmlx serve --decode-chunk`; vLLM's multi-step scheduling); 0: 8, or 1 for a model with recurrent layers."""

    learning_rate: float = 1e-4
    """AdamW learning rate (the peak, with a schedule)."""
    lr_schedule: str = "auto"
    """Learning rate over the run's `steps` updates: `constant`, or after the warm-up a `linear` or `cosine` decay toward 0 (Transformers' and TRL's shapes; each row reports its `learning_rate`); `auto`: `linear` in `artmlx train` and `run` (on the embedded default it narrowed the final scores' spread over seeds: Benchmarks, "The default run over seeds"), constant under MLXBackend, which takes each step's rate from ART."""
    warmup_steps: int = 0
    """Updates at the start whose learning rate rises linearly to `learning_rate` (update k of them at k / (warmup_steps + 1) of it)."""
    adam_betas: list = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this value; 0 disables clipping."""
    objective: str = "ppo"
    """Token objective: `ppo` (clipped ratio), `cispo` (clipped, stopped IS weight) or `gspo` (sequence ratio)."""
    eps_low: float = 0.2
    """Lower clip range: ratios below 1 - eps_low are clipped."""
    eps_high: float = 0.28
    """Upper clip range: ratios above 1 + eps_high are clipped (DAPO clip-higher)."""
    normalization: str = "token_mean"
    """Loss normalisation: `token_mean` (DAPO), `seq_mean` (GRPO) or `constant` (Dr. GRPO)."""
    constant_length: int = 64
    """Tokens per episode assumed by `constant` normalisation."""
    scale_advantages: bool = False
    """Divide advantages by the group's reward std (original GRPO); off follows Dr. GRPO."""
    kl_coef: float = 0.0
    """Weight of the k3 KL penalty to the frozen base (LoRA off); 0 disables it."""
    hint_teacher: str = "base"
    """Directive hints (an environment's `info["hint"]`, an agent's `set_directive_hint`): the teacher that
    scores the sampled tokens with the hint in its context, `base` (the frozen base, LoRA off, as
    OpenClaw-RL) or `policy` (the current adapters, as SDPO). Without hints nothing changes."""
    hint_form: str = "instruction"
    """Where the teacher reads the hint: `instruction`, appended to the last user message in OpenClaw-RL's form
    (`\\n\\n[user's hint / instruction]\\n...`); `system`, in the system message, the conversation unchanged;
    `demonstration`, as the assistant's earlier answer to the last user message, which is then asked again."""
    hint_temperature: float = 0.0
    """The teacher's temperature: its logits are divided by it before the teacher's logprobs (and top-K) are taken;
    below the sampling temperature the teacher is sharper, its likeliest reply weighing more. 0: the sampling
    temperature (OpenClaw-RL)."""
    hint_weight: float = 1.0
    """Weight of a hinted token's teacher advantage, log pi_teacher - log pi_old (`learner/distill.py`)."""
    hint_baseline: str = "none"
    """`none`: a hinted token's teacher advantage as OpenClaw-RL has it; `episode`: minus its mean over the
    episode's sampled tokens, so a hint that lowers (or raises) every token alike moves none of them."""
    hint_topk: int = 0
    """0: a hinted token learns from its teacher advantage (above). K > 0: instead, the reverse KL from the policy
    to the teacher over the teacher's K likeliest tokens and the rest of the vocabulary as one bin (OpenClaw-RL's
    top-K variant, after SDFT/SDPO), weighted by `hint_weight`; at most 256."""
    reward_weight: float = 1.0
    """Weight of GRPO's reward advantage beside the hint's; 1 with no hints leaves GRPO as it is."""
    hint_group_reward_below: float = 0.0
    """0: every hint counts. r > 0: only the hints of groups whose mean reward is below r; a group the policy
    already mostly gets right learns from its rewards alone (and is not pulled back toward a weaker teacher)."""
    minibatches: int = 1
    """Optimizer steps per batch of rollouts; above 1, later steps are off-policy and clipping matters."""
    max_batch_tokens: int = 0
    """Padded tokens per learner micro-batch (gradients of micro-batches are accumulated); 0 = what the memory budget's workspace holds for the update's longest episode."""
    pad_multiple: int = 32
    """Pad sequence lengths to a multiple of this (fewer distinct shapes)."""
    compile_step: bool = False
    """Compile the loss-and-gradient step with `mx.compile` (one trace per micro-batch shape)."""
    grad_checkpoint: str = "auto"
    """Per-layer gradient checkpointing in the learner: "on", "off", or "auto" (on when one of the update's
    longest episodes would not fit the memory budget's workspace without it; off with lora_dropout > 0)."""

    memory_budget_gb: float = 0.0
    """Memory this process (the learner, or `artmlx train`) may use for model, KV cache and activations, in GB; 0 = 75 % of the device's memory (GPU / unified memory, or RAM on a CPU), divided among the processes `artmlx run` puts on one device. Actors size themselves from their own machine (`artmlx actor --memory-budget-gb`)."""

    adapter_wire_dtype: str = "auto"
    """Pipeline: dtype adapters travel in to actors: `float32`, `bfloat16`, or `auto` (bfloat16 when the base model computes in bfloat16, halving every broadcast; float32 otherwise, e.g. on the CPU). Actors cast them back to their adapters' own dtype."""

    max_staleness: int = 2
    """Pipeline: a group sampled more than this many policy versions ago is dropped (counted), not trained."""
    actor_timeout_s: float = 60.0
    """Pipeline: an actor silent this long (of the learner's listening time) is dropped and its window returns to the others; it rejoins by itself when heard again."""
    max_in_flight: int = 0
    """Pipeline: groups an actor may have sent but not had acknowledged (its window); 0 means its share of one update plus one of its batches, ceil(groups_per_step / live actors) + its groups per batch, re-sized as actors come and go, and grown while the learner waits for groups that do not come."""
    actor_groups_per_batch: int = 0
    """Pipeline: groups an actor generates in one batched rollout; 0 = as many as its memory and device allow (engine/memory.py), at most its share of one update, ceil(groups_per_step / live actors)."""
    actor_niceness: int = 10
    """`artmlx run`: actors run this much below the learner's CPU priority (Unix nice), so the learner's update, the pipeline's critical path, is never starved on shared cores; 0 = same priority."""

    eval_every: int = 10
    """Evaluate every this many updates (and before the first and after the last); 0 disables."""
    eval_episodes: int = 200
    """Episodes per evaluation, on held-out seeds (an agent run plays each of `eval_scenarios` once instead)."""
    eval_temperature: float = -1.0
    """Sampling temperature for evaluation; negative means the training temperature."""
    checkpoint_every: int = 20
    """Write a full trainer checkpoint every this many updates (and at the end)."""
    keep_checkpoints: int = 2
    """How many checkpoints to keep."""
    wandb_project: str = ""
    """Weights & Biases project to log every metrics row to (needs the extra `artmlx[wandb]`; `WANDB_MODE=offline` logs to the run directory without a network, for `wandb sync` later); empty: no W&B. The run's id is kept in the run directory, so `--resume` continues the same W&B run."""
    wandb_run_name: str = ""
    """The W&B run's display name; empty: the run directory's name."""

    def resolved_out(self) -> Path:
        if self.out:
            return Path(self.out)
        import time

        return Path("runs") / time.strftime("%Y%m%d-%H%M%S")

    def eval_due(self, step: int) -> bool:
        return bool(self.eval_every) and (step % self.eval_every == 0 or step == self.steps)

    def checkpoint_due(self, step: int) -> bool:
        return step % self.checkpoint_every == 0 or step == self.steps

    def share_of_update(self, actors: int = 1) -> int:
        """Groups of one update each of `actors` live actors is asked for."""
        return -(-self.groups_per_step // max(1, actors))

    def resolved_max_in_flight(self, actors: int = 1, groups_per_batch: int = 0) -> int:
        # Capacity-based admission: all windows together hold about one update beyond the batches being
        # generated, so actors never run far ahead of the learner and groups rarely age past 1 version.
        # (Two full shares measured worse on 2 shared cores: 50 updates with 2 actors took 244 s and
        # reached 0.785, against 220 s and 0.890 with share + batch; staleness 2 for 30 % of groups.)
        share = self.share_of_update(actors)
        return self.max_in_flight or share + (self.actor_groups_per_batch or groups_per_batch or share)

    def resolved_eval_temperature(self) -> float:
        return self.temperature if self.eval_temperature < 0 else self.eval_temperature


FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
CHOICES = {
    "adapter_wire_dtype": ("auto", "float32", "bfloat16"),
    "objective": ("ppo", "cispo", "gspo"),
    "normalization": ("token_mean", "seq_mean", "constant"),
    "grad_checkpoint": ("auto", "on", "off"),
    "hint_teacher": ("base", "policy"),
    "hint_baseline": ("none", "episode"),
    "hint_form": HINT_FORMS,
    "lr_schedule": ("auto", *SCHEDULES),
}
POSITIVE = ("actor_timeout_s", "steps", "lora_rank", "groups_per_step", "max_reply_tokens", "max_turns", "max_episode_tokens",
            "learning_rate", "minibatches", "pad_multiple", "eval_episodes",
            "checkpoint_every", "keep_checkpoints", "constant_length")
NON_NEGATIVE = ("dynamic_sampling_rounds", "decode_chunk", "rollout_failure_limit", "actor_groups_per_batch", "max_batch_tokens", "memory_budget_gb", "actor_niceness", "max_in_flight", "max_staleness", "temperature", "weight_decay", "max_grad_norm", "eps_low", "eps_high", "kl_coef",
                "eval_every", "lora_dropout", "hint_weight", "hint_temperature", "reward_weight", "hint_topk",
                "hint_group_reward_below", "warmup_steps")
MAX_HINT_TOPK = 256  # the teacher's top-K ids and logprobs travel with every policy token of a micro-batch


def _type_ok(value: Any, annotation: str) -> bool:
    expected = {"int": int, "float": (int, float), "str": str, "bool": bool, "dict": dict, "list": list}[annotation]
    if annotation in ("int", "float") and isinstance(value, bool):
        return False
    return isinstance(value, expected)


def validate(config: TrainConfig) -> TrainConfig:
    """Check types and ranges; raise ValueError naming the field."""
    for name, spec in FIELDS.items():
        value = getattr(config, name)
        annotation = spec.type if isinstance(spec.type, str) else spec.type.__name__
        if not _type_ok(value, annotation):
            raise ValueError(f"config field {name!r} must be {annotation}, got {value!r}")
        if annotation == "float" and isinstance(value, int):
            setattr(config, name, float(value))
    for name in POSITIVE:
        if getattr(config, name) <= 0:
            raise ValueError(f"config field {name!r} must be > 0, got {getattr(config, name)!r}")
    for name in NON_NEGATIVE:
        if getattr(config, name) < 0:
            raise ValueError(f"config field {name!r} must be >= 0, got {getattr(config, name)!r}")
    for name, choices in CHOICES.items():
        if getattr(config, name) not in choices:
            raise ValueError(f"config field {name!r} must be one of {choices}, got {getattr(config, name)!r}")
    if config.group_size < 2:
        raise ValueError(f"config field 'group_size' must be >= 2 (advantages compare episodes), got {config.group_size}")
    if config.min_group_size and not 2 <= config.min_group_size <= config.group_size:
        raise ValueError(f"config field 'min_group_size' must be 0 or in [2, group_size={config.group_size}], "
                         f"got {config.min_group_size}")
    if config.hint_topk > MAX_HINT_TOPK:
        raise ValueError(f"config field 'hint_topk' must be at most {MAX_HINT_TOPK}, got {config.hint_topk}")
    if config.hint_topk and config.hint_baseline != "none":
        raise ValueError("hint_baseline = \"episode\" centres the token-level teacher advantage, which hint_topk > 0 "
                         "replaces by a top-K reverse KL: use one of them")
    if config.warmup_steps >= config.steps:
        raise ValueError(f"config field 'warmup_steps' ({config.warmup_steps}) must be less than steps "
                         f"({config.steps}): the warm-up would never reach learning_rate")
    if config.eps_low >= 1:
        raise ValueError(f"config field 'eps_low' must be < 1, got {config.eps_low}")
    if not 0 <= config.lora_dropout < 1:
        raise ValueError(f"config field 'lora_dropout' must be in [0, 1), got {config.lora_dropout}")
    if len(config.adam_betas) != 2 or not all(0 <= b < 1 for b in config.adam_betas):
        raise ValueError(f"config field 'adam_betas' must be two numbers in [0, 1), got {config.adam_betas!r}")
    if config.minibatches > config.groups_per_step:
        raise ValueError(f"config field 'minibatches' ({config.minibatches}) cannot exceed groups_per_step ({config.groups_per_step})")
    if not all(isinstance(k, str) for k in config.lora_keys):
        raise ValueError(f"config field 'lora_keys' must be a list of strings, got {config.lora_keys!r}")
    if config.dora and config.kl_coef > 0:
        raise ValueError("dora = true with kl_coef > 0 is not supported: the KL reference switches LoRA off, but a "
                         "DoRA layer would still apply its trained magnitude, so the reference would not be the "
                         "base; use LoRA (dora = false) or kl_coef = 0")
    if config.rollout and ":" not in config.rollout:
        raise ValueError(f"config field 'rollout' must be module:function or file.py:function, got {config.rollout!r}")
    if config.scenarios and not config.rollout:
        raise ValueError("config field 'scenarios' needs 'rollout' (environments choose their own tasks)")
    if config.eval_scenarios and not config.rollout:
        raise ValueError("config field 'eval_scenarios' needs 'rollout' (environments are evaluated on held-out seeds)")
    if config.grad_checkpoint == "on" and config.lora_dropout > 0:
        raise ValueError("grad_checkpoint = \"on\" with lora_dropout > 0 is not supported: a recomputed layer would "
                         "draw new dropout masks, so the backward would not match the forward; set lora_dropout = 0 "
                         "or grad_checkpoint = \"off\" (\"auto\" stays off with dropout)")
    if config.compile_step and config.lora_dropout > 0:
        raise ValueError("compile_step = true with lora_dropout > 0 is not supported: a compiled step would reuse "
                         "one dropout mask for every update; set compile_step = false or lora_dropout = 0")
    return config


def parse_override(item: str) -> tuple[str, Any]:
    """`key=value` with the value in TOML syntax (bare words are strings)."""
    if "=" not in item:
        raise ValueError(f"override {item!r} must look like key=value")
    key, _, raw = item.partition("=")
    key = key.strip()
    if key not in FIELDS:
        raise ValueError(f"unknown config field {key!r}; fields are: {', '.join(FIELDS)}")
    return key, parse_value(raw)


def parse_value(raw: str) -> Any:
    """A command-line value in TOML syntax; anything that is not valid TOML is taken as a string."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def resolve_config_path(path: str | Path) -> Path:
    """A config file's path: an existing file, else a packaged recipe's name (`artmlx config --recipes`)."""
    from .recipes import recipe_names, recipe_path

    if Path(path).exists():
        return Path(path)
    recipe = recipe_path(str(path))
    if recipe is None:
        raise ValueError(f"config file {path} does not exist, and it is not a recipe's name "
                         f"(recipes: {', '.join(recipe_names())})")
    return recipe


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """A config file or recipe (`path`), then `overrides` on top (None values ignored), validated."""
    values: dict[str, Any] = {}
    if path:
        path = resolve_config_path(path)
        try:
            values = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as error:
            raise ValueError(f"config file {path} is not valid TOML: {error}") from error
    for key, value in (overrides or {}).items():
        if value is not None:
            values[key] = value
    unknown = sorted(set(values) - set(FIELDS))
    if unknown:
        raise ValueError(f"unknown config field(s) {unknown}; fields are: {', '.join(FIELDS)}")
    return validate(TrainConfig(**values))


def config_to_toml(config: TrainConfig) -> str:
    import tomli_w

    return tomli_w.dumps(dataclasses.asdict(config))


def field_docs() -> dict[str, str]:
    """Field name -> docstring, read from this module's source (used by `artmlx config`)."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(TrainConfig))
    docs, body = {}, tree.body[0].body
    for node, following in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(following, ast.Expr):
            docs[node.target.id] = following.value.value
    return docs

