"""`MLXBackend`: OpenPipe ART's `Backend` protocol on MLX, so an ART script trains on a Mac.

Porting an ART script is changing its backend line (`backend = MLXBackend()` instead of
`LocalBackend()`); the rollouts, `art.TrainableModel`, `gather_trajectory_groups` and
`backend.train(model, groups, learning_rate=...)` stay as they are.

- `register(model)` records the model under `PATH/PROJECT/models/NAME` (ART's layout);
  `model.register(backend)` then calls `_prepare_backend_for_training`, which loads
  `model.base_model` (anything mlx_lm.load takes, or `tiny`) with LoRA adapters into an
  `artmlx serve` model server on a free loopback port (API key random) and returns its URL and key.
  If the model's folder has checkpoints, the newest is restored (adapters, AdamW state, step).
- The server serves `NAME` and `NAME@STEP` (`_model_inference_name`), every choice with its exact
  token ids, sampler logprobs and prompt ids, so `art.Trajectory`s carry what training needs.
- `train(model, groups, learning_rate=..., loss_fn=..., ...)` turns each trajectory into one
  token-exact episode (`tokens.py`; a trajectory that cannot be is left out and its reason
  printed and counted in `trajectories_refused`), runs one GRPO update (`learner/trainer.py`) on the
  server's own model between decode steps (one copy of the weights, generation pauses meanwhile),
  swaps the new adapter in (requests in flight finish on theirs), writes a checkpoint, and returns
  ART's `TrainResult(step, metrics)`.
- `_delete_checkpoint_files(model, steps_to_keep)` removes the other checkpoints.

ART's arguments map to artmlx's: `loss_fn` "cispo" | "ppo" (-> `objective`), `epsilon` /
`epsilon_high` (-> `eps_low` / `eps_high`), `scale_rewards` / `normalize_advantages` (-> advantages
divided by the group's reward std), `kl_penalty_coef` (-> `kl_coef`, a KL to the base model, which
is ART's reference when no step is named). Arguments artmlx does not implement are refused when set
to anything but their default. Deviations: SFT (`train_sft`) is not supported; one model per backend.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
import threading
from dataclasses import replace
from pathlib import Path

from ..config import TrainConfig, load_config
from ..launch import free_port
from ..learner.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint
from ..learner.grpo import LossSettings
from ..learner.trainer import GRPOTrainer
from ..model.policy import LoraSpec
from ..serve import run_server
from ..serve.model_server import ModelServer, ServeConfig
from ..trajectory import Group
from .tokens import TrajectoryRefused, trajectory_episode

_MAPPED = {"learning_rate", "loss_fn", "epsilon", "epsilon_high", "scale_rewards", "normalize_advantages",
           "kl_penalty_coef", "save_checkpoint", "verbose"}
# LocalBackend.train arguments artmlx does not implement, with the default under which they do nothing.
_INERT = {"loss_fn_config": None, "adam_params": None, "kl_penalty_reference_step": None,
          "kl_ref_adapter_path": None, "advantage_balance": 0.0, "importance_sampling_level": "token",
          "max_negative_advantage_importance_sampling_weight": None, "mask_prob_ratio": False,
          "kimi_k2_tau": None, "precalculate_logprobs": False, "allow_training_without_logprobs": False,
          "plot_tensors": False, "truncated_importance_sampling": None,
          "scale_learning_rate_by_reward_std_dev": False, "logprob_calculation_chunk_size": 1024,
          "packed_sequence_length": None, "num_trajectories_learning_rate_multiplier_power": 0.0}


class MLXBackend:
    def __init__(self, path: str = ".art", config: TrainConfig | dict | None = None, host: str = "127.0.0.1",
                 port: int = 0, max_rows: int = 64, max_prompt_tokens: int = 8192, max_tokens: int = 2048):
        """`config`: artmlx's training settings (a TrainConfig or a dict of its fields: LoRA layout,
        temperature, normalisation, memory budget...); `host`/`port`: where the server listens (port
        0: a free one); `max_rows`: requests decoded together."""
        self._path = str(path)
        self.config = config if isinstance(config, TrainConfig) else load_config(None, dict(config or {}))
        self.host, self.port = host, port
        self.serve_limits = {"max_rows": max_rows, "max_prompt_tokens": max_prompt_tokens, "max_tokens": max_tokens}
        self.server: ModelServer | None = None
        self.http = None
        self.trainer: GRPOTrainer | None = None
        self.spec = LoraSpec.from_config(self.config)
        self.model_name = ""
        self.api_key = secrets.token_hex(16)

    # --- ART's Backend protocol -----------------------------------------------------------------
    def _model_dir(self, model) -> Path:
        return Path(self._path) / model.project / "models" / model.name

    async def register(self, model) -> None:
        model.base_path = self._path
        folder = self._model_dir(model)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "model.json").write_text(json.dumps(model.model_dump(mode="json"), default=str))

    def _model_inference_name(self, model, step: int | None = None) -> str:
        return f"{model.name}@{self.step if step is None else step}"

    async def _get_step(self, model) -> int:
        return self.step

    @property
    def step(self) -> int:
        return self.trainer.step if self.trainer is not None else 0

    async def _prepare_backend_for_training(self, model, config=None) -> tuple[str, str]:
        if self.server is not None:
            if model.name != self.model_name:
                raise ValueError(f"this MLXBackend already serves {self.model_name!r}; use one backend per model")
            return self._base_url(), self.api_key
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._start, model)
        return self._base_url(), self.api_key

    async def train(self, model, trajectory_groups, **kwargs):
        from art.types import TrainResult

        settings = self._settings(kwargs)
        groups, refused = self._groups(trajectory_groups)
        if settings["verbose"] or refused:
            for reason in refused[:5]:
                print(f"MLXBackend: trajectory left out: {reason}", flush=True)
        loop = asyncio.get_running_loop()
        future = self.server.call(lambda: self._train_step(model, groups, settings))
        metrics = await loop.run_in_executor(None, future.result)
        metrics["trajectories_refused"] = len(refused)
        return TrainResult(step=self.step, metrics=metrics)

    async def _delete_checkpoint_files(self, model, steps_to_keep: list[int]) -> None:
        for path in list_checkpoints(self._model_dir(model)):
            if int(path.name.removeprefix("step_")) not in steps_to_keep:
                shutil.rmtree(path)

    def _train_sft(self, model, trajectories, config, dev_config, verbose: bool = False):
        raise NotImplementedError("MLXBackend trains with RL (train); supervised fine-tuning is not supported")

    async def close(self) -> None:
        if self.http is not None:
            self.http.should_exit = True
            self.http.thread.join(10)
            self.http = None
        if self.server is not None:
            self.server.close()
            self.server = None

    # --- the work --------------------------------------------------------------------------------
    def _base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def _start(self, model) -> None:
        serve = ServeConfig(model=model.base_model, name=model.name, seed=self.config.seed, **self.serve_limits)
        self.server = ModelServer(serve, train_config=self.config)
        self.model_name = model.name
        self.trainer = self.server.call(lambda: GRPOTrainer(self.server.model, self.config)).result()
        checkpoint = latest_checkpoint(self._model_dir(model))
        if checkpoint is not None:
            self.server.call(lambda: self._restore(checkpoint)).result()
        self.port = self.port or free_port()
        ready = threading.Event()
        self.http = run_server(self.server, self.host, self.port, self.api_key, ready=ready)
        if not (ready.wait(60) and self.http.started):
            raise RuntimeError(f"the inference server did not start on {self.host}:{self.port}")

    def _restore(self, checkpoint: Path) -> None:
        load_checkpoint(checkpoint, self.trainer)
        self.server.scheduler.set_adapter_version(self.trainer.step)

    def _settings(self, kwargs: dict) -> dict:
        unknown = sorted(set(kwargs) - _MAPPED - set(_INERT))
        if unknown:
            raise TypeError(f"MLXBackend.train got unexpected arguments {unknown}")
        active = sorted(name for name, default in _INERT.items() if name in kwargs and kwargs[name] != default)
        if active:
            raise ValueError(f"MLXBackend does not implement {active}; leave them at their defaults")
        loss_fn = kwargs.get("loss_fn", "cispo")
        if loss_fn not in ("cispo", "ppo"):
            raise ValueError(f"loss_fn must be 'cispo' or 'ppo', got {loss_fn!r}")
        scale = kwargs.get("scale_rewards", True) and kwargs.get("normalize_advantages", True)
        epsilon = kwargs.get("epsilon")
        epsilon_high = kwargs.get("epsilon_high", epsilon)
        return {"learning_rate": float(kwargs.get("learning_rate", 5e-6)), "objective": loss_fn,
                "eps_low": self.config.eps_low if epsilon is None else float(epsilon),
                "eps_high": self.config.eps_high if epsilon_high is None else float(epsilon_high),
                "scale_advantages": bool(scale), "kl_coef": float(kwargs.get("kl_penalty_coef", 0.0)),
                "save_checkpoint": bool(kwargs.get("save_checkpoint", True)), "verbose": bool(kwargs.get("verbose"))}

    def _groups(self, trajectory_groups) -> tuple[list[Group], list[str]]:
        vocab = self.server.model.args.vocab_size
        groups, refused = [], []
        for number, group in enumerate(trajectory_groups):
            episodes = []
            for trajectory in group.trajectories:
                try:
                    episodes.append(trajectory_episode(trajectory, self.server.chat, self.config.temperature, vocab))
                except TrajectoryRefused as error:
                    refused.append(f"group {number}: {error}")
            if episodes:
                groups.append(Group(seed=number, episodes=episodes, policy_version=self.step))
        return groups, refused

    def _train_step(self, model, groups: list[Group], settings: dict) -> dict:
        """On the scheduler's thread: one GRPO update of the served model, then the new adapter swaps in."""
        trainer = self.trainer
        trainer.config = replace(self.config, objective=settings["objective"], eps_low=settings["eps_low"],
                                 eps_high=settings["eps_high"], scale_advantages=settings["scale_advantages"],
                                 kl_coef=settings["kl_coef"], learning_rate=settings["learning_rate"])
        trainer.settings = LossSettings(settings["objective"], settings["eps_low"], settings["eps_high"],
                                        settings["kl_coef"])
        trainer.optimizer.learning_rate = settings["learning_rate"]
        self.server.scheduler.load_current()  # train from the adapter being served
        if groups:
            stats = trainer.train_step(groups)
        else:  # nothing trainable: the step still advances, as ART's LocalBackend does
            trainer.step += 1
            stats = {"groups": 0}
        self.server.scheduler.set_adapter_version(trainer.step)
        if settings["save_checkpoint"]:
            save_checkpoint(self._model_dir(model), trainer, self.spec, model.base_model,
                            {"seed": self.config.seed}, keep=1 << 30)
        return {name: float(value) for name, value in stats.items() if isinstance(value, (int, float))}
