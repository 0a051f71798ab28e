"""`MLXBackend`: OpenPipe ART's `Backend` protocol on MLX, so an ART script trains on a Mac.

Porting an ART script is changing its backend line (`backend = MLXBackend()` instead of
`LocalBackend()`); rollouts, `art.TrainableModel`, `gather_trajectory_groups`, `backend.train(model,
groups, ...)` and ART's `PipelineTrainer` stay as they are (openpipe-art 0.5.18 to 0.5.23).

- `register(model)` records the model under ART's layout, `PATH/PROJECT/models/RUN_NAME` (0.5.23's
  `run_name`; `name` on 0.5.18); `path=None` is ART's default (`.art` at the repository root).
  `model.register(backend)` then calls `_prepare_backend_for_training`, which loads
  `model.base_model` (anything mlx_lm.load takes, or `tiny`) with LoRA adapters (`lora_config`
  mapped by `arguments.lora_spec`) into an `artmlx serve` model server on a free loopback port (API
  key random) and returns its URL and key. The newest checkpoint there is restored (adapters, AdamW
  state, step); a new model gets a step-0 checkpoint, as ART writes one.
- Served names, as LocalBackend serves them: `NAME@STEP` for the newest step and the `kept_steps`
  before it (until ART prunes them with `prune_model_adapters`), `NAME` (the newest) and the base
  model's own name (LoRA off). The inference name moves to a new step only once that step's adapter
  is served, so requests made while `train` runs never find their model missing.
- `exact_adapter_lease(model, step)` (and `adapter_lease`) serve exactly that step's adapter while
  held, loaded from its checkpoint if it is no longer in memory, and pin `model.get_inference_name()`
  to it, as ART's LocalBackend does; `adapter_retention_lease` keeps it without pinning.
- `train(model, groups, ...)` turns each trajectory into one token-exact episode (`rollout/choices.py`; a
  trajectory that cannot be one is left out and its reason counted in `trajectories_refused`), runs
  one GRPO update (`learner/trainer.py`) on the server's own model between decode steps (one copy of
  the weights; generation pauses meanwhile), swaps the new adapter in (requests in flight finish on
  theirs), writes `checkpoints/NNNN` and returns ART's `LocalTrainResult(step, metrics,
  checkpoint_path)`. Its keyword arguments are mapped, noted or refused by `arguments.py`.
- `close()`, `async with MLXBackend() as backend`, or interpreter exit stop the server.

Deviations: SFT (`train_sft`) is not supported; one model per backend; ART's own KL-shaped
advantages are artmlx's KL term in the loss (see `arguments.py`).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import contextvars
import json
import secrets
import shutil
import threading
from dataclasses import replace
from pathlib import Path

import mlx.core as mx

from ..config import TrainConfig, load_config
from ..learner.checkpoint import (ART_LAYOUT, checkpoint_dir, checkpoint_step, latest_checkpoint, list_checkpoints,
                                  load_checkpoint, save_checkpoint)
from ..learner.settings import TrainerSettings
from ..learner.trainer import GRPOTrainer
from ..model.families import vocab_size
from ..model.policy import ADAPTER_WEIGHTS, LoraSpec
from ..netutil import free_port
from ..serve import run_server
from ..serve.model_server import ModelServer, ServeConfig
from ..trajectory import Group
from .arguments import internal_settings, lora_spec, server_settings, train_settings
from ..rollout.choices import TrajectoryRefused, trajectory_episode

# Steps pinned by leases in this task (model name -> step): what get_inference_name() returns inside one.
_pinned: contextvars.ContextVar[dict[str, int]] = contextvars.ContextVar("artmlx_pinned_steps", default={})


def _default_art_path() -> str:
    from art.utils.output_dirs import get_default_art_path

    return get_default_art_path()


class MLXBackend:
    def __init__(self, path: str | None = None, config: TrainConfig | dict | None = None, host: str = "127.0.0.1",
                 port: int = 0, max_rows: int = 64, max_prompt_tokens: int = 8192, max_tokens: int = 2048,
                 kept_steps: int = 8):
        """`path`: ART's folder (None: ART's default); `config`: artmlx's training settings (a TrainConfig or a
        dict of its fields: temperature, normalisation, memory budget...); `host`/`port`: where the server
        listens (port 0: a free one); `max_rows`: requests decoded together; `max_tokens`: the largest
        max_tokens a request may ask for; `kept_steps`: earlier steps' adapters kept servable."""
        self._path = str(path) if path is not None else _default_art_path()
        self.config = config if isinstance(config, TrainConfig) else load_config(None, dict(config or {}))
        if self.config.lr_schedule not in ("auto", "constant") or self.config.warmup_steps:
            raise ValueError("MLXBackend takes each step's learning rate from ART (`art.TrainConfig(learning_rate=...)` "
                             "in `model.train`), so config fields 'lr_schedule' and 'warmup_steps' are not supported "
                             "here: change the rate from step to step in your training loop")
        self.config = replace(self.config, lr_schedule="constant")
        self.host, self.port = host, port
        self.serve_limits = {"max_rows": max_rows, "max_prompt_tokens": max_prompt_tokens, "max_tokens": max_tokens}
        self.kept_steps = kept_steps
        self.server: ModelServer | None = None
        self.http = None
        self.trainer: GRPOTrainer | None = None
        self.spec = LoraSpec.from_config(self.config)
        self.model_name = ""
        self.api_key = secrets.token_hex(16)

    async def __aenter__(self) -> "MLXBackend":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def __enter__(self) -> "MLXBackend":
        return self

    def __exit__(self, *exc) -> None:
        self._close()

    # --- ART's Backend protocol -----------------------------------------------------------------
    def _model_dir(self, model) -> Path:
        storage = model._storage_name() if hasattr(model, "_storage_name") else model.name  # run_name on 0.5.23
        return Path(self._path) / model.project / "models" / storage

    async def register(self, model) -> None:
        self._settings_of(model)  # refuse what cannot be honoured before anything loads
        model.base_path = self._path
        folder = self._model_dir(model)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "model.json").write_text(json.dumps(model.model_dump(mode="json"), default=str))

    def _model_inference_name(self, model, step: int | None = None) -> str:
        if step is None:
            step = _pinned.get().get(model.name)
        return f"{model.name}@{self.step if step is None else step}"

    async def _get_step(self, model) -> int:
        if self.server is not None:
            return self.step
        newest = latest_checkpoint(self._model_dir(model), ART_LAYOUT)
        return 0 if newest is None else checkpoint_step(newest, ART_LAYOUT)

    @property
    def step(self) -> int:
        """The newest step served (a step's adapter is served before its name is handed out)."""
        return self.server.step if self.server is not None else 0

    async def _prepare_backend_for_training(self, model, config=None) -> tuple[str, str]:
        if self.server is not None:
            if model.name != self.model_name:
                raise ValueError(f"this MLXBackend already serves {self.model_name!r}; use one backend per model")
            return self._base_url(), self.api_key
        server_args = server_settings(config)
        self.host = server_args.get("host", self.host)
        self.port = int(server_args.get("port", self.port))
        self.api_key = server_args.get("api_key", self.api_key)
        await asyncio.get_running_loop().run_in_executor(None, self._start, model)
        return self._base_url(), self.api_key

    @contextlib.asynccontextmanager
    async def exact_adapter_lease(self, model, step: int):
        """While held, `NAME@step` is served with exactly that step's adapter and `model.get_inference_name()`
        names it."""
        await self._hold(model, step)
        token = _pinned.set({**_pinned.get(), model.name: step})
        try:
            yield
        finally:
            _pinned.reset(token)
            await self._release(step)

    adapter_lease = exact_adapter_lease  # LocalBackend's non-exact lease pins a step too; ours is always exact

    @contextlib.asynccontextmanager
    async def adapter_retention_lease(self, model, step: int):
        """While held, `NAME@step` stays servable."""
        await self._hold(model, step)
        try:
            yield
        finally:
            await self._release(step)

    async def prune_model_adapters(self, model, *, retain_steps: set[int]) -> None:
        """Forget the served adapters of steps outside `retain_steps` (the newest and leased ones stay)."""
        if self.server is not None:
            await asyncio.wrap_future(self.server.keep_steps(retain_steps))

    async def train(self, model, trajectory_groups, **kwargs):
        from art.types import LocalTrainResult

        settings = train_settings(kwargs, self.config.eps_low, self.config.eps_high)
        groups, refused = self._groups(trajectory_groups)
        if settings["verbose"] or refused:
            for reason in refused[:5]:
                print(f"MLXBackend: trajectory left out: {reason}", flush=True)
        metrics, saved = await asyncio.wrap_future(
            self.server.call(lambda: self._train_step(model, groups, settings)))
        metrics["trajectories_refused"] = len(refused)
        return LocalTrainResult(step=self.step, metrics=metrics, checkpoint_path=saved)

    async def _delete_checkpoint_files(self, model, steps_to_keep: list[int]) -> None:
        for path in list_checkpoints(self._model_dir(model), ART_LAYOUT):
            if checkpoint_step(path, ART_LAYOUT) not in steps_to_keep:
                shutil.rmtree(path)

    async def _experimental_push_to_s3(self, model, *, s3_bucket: str | None = None, prefix: str | None = None,
                                       verbose: bool = False, delete: bool = False) -> None:
        """LocalBackend's S3 backup (ART's own `aws s3 sync` of the model folder, the same layout here)."""
        from art.utils.s3 import push_model_to_s3

        await push_model_to_s3(model_name=self._model_dir(model).name, project=model.project, s3_bucket=s3_bucket,
                               prefix=prefix, verbose=verbose, delete=delete, art_path=self._path)

    async def _experimental_pull_from_s3(self, model, *, s3_bucket: str | None = None, prefix: str | None = None,
                                         verbose: bool = False, delete: bool = False, step: int | None = None,
                                         exclude: list | None = None, **unsupported) -> None:
        """LocalBackend's S3 restore of the model folder; a newer step pulled after `register` is restored at once."""
        from art.utils.s3 import pull_model_from_s3

        if unsupported:
            raise ValueError(f"_experimental_pull_from_s3: {sorted(unsupported)} are not implemented by MLXBackend "
                             "(step=N pulls one step)")
        await pull_model_from_s3(model_name=self._model_dir(model).name, project=model.project, step=step,
                                 s3_bucket=s3_bucket, prefix=prefix, verbose=verbose, delete=delete,
                                 art_path=self._path, exclude=exclude)
        newest = latest_checkpoint(self._model_dir(model), ART_LAYOUT)
        if self.server is not None and newest is not None and checkpoint_step(newest, ART_LAYOUT) > self.step:
            # pulled after register (as ART's 2048 example does): serve and train from the pulled step
            await asyncio.wrap_future(self.server.call(lambda: self._restore(newest)))

    def _train_sft(self, model, trajectories, config, dev_config, verbose: bool = False):
        raise NotImplementedError("MLXBackend trains with RL (train); supervised fine-tuning is not supported")

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self._close)

    # --- the work --------------------------------------------------------------------------------
    def _close(self) -> None:
        atexit.unregister(self._close)
        if self.http is not None:
            self.http.should_exit = True
            self.http.thread.join(10)
            self.http = None
        if self.server is not None:
            self.server.close()
            self.server = None

    def _base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def _settings_of(self, model) -> tuple[LoraSpec, dict]:
        """The LoRA layout and server limits this model asks for, or the error naming what is refused."""
        spec, max_seq = lora_spec(getattr(model, "lora_config", None), LoraSpec.from_config(self.config))
        internal = internal_settings(getattr(model, "_internal_config", None))
        limits = dict(self.serve_limits)
        if internal.get("max_prompt_tokens") or max_seq:
            limits["max_prompt_tokens"] = int(internal.get("max_prompt_tokens") or max_seq)
        if internal.get("chat_template_kwargs"):
            limits["chat_template_kwargs"] = internal["chat_template_kwargs"]
        return spec, limits

    def _start(self, model) -> None:
        self.spec, limits = self._settings_of(model)
        self.config = replace(self.config, lora_rank=self.spec.rank, lora_scale=self.spec.scale,
                              lora_dropout=self.spec.dropout, lora_keys=list(self.spec.keys or []))
        base_name = model.base_model if model.base_model != model.name else ""
        serve = ServeConfig(model=model.base_model, name=model.name, base_name=base_name, seed=self.config.seed,
                            **limits)
        self.server = ModelServer(serve, LoraSpec.from_config(self.config))
        atexit.register(self._close)  # after the server's own: runs first, so HTTP stops before the engine
        self.model_name = model.name
        settings = TrainerSettings.of(self.config)
        self.trainer = self.server.call(lambda: GRPOTrainer(self.server.model, settings)).result()
        checkpoint = latest_checkpoint(self._model_dir(model), ART_LAYOUT)
        if checkpoint is not None:
            self.server.call(lambda: self._restore(checkpoint)).result()
        else:  # ART's step 0: the fresh adapter, what an eval at the start and a KL reference of step 0 name
            self.server.call(lambda: self._save(model)).result()
        self.port = self.port or free_port()
        ready = threading.Event()
        self.http = run_server(self.server, self.host, self.port, self.api_key, ready=ready)
        if not (ready.wait(60) and self.http.started):
            raise RuntimeError(f"the inference server did not start on {self.host}:{self.port}")

    def _restore(self, checkpoint: Path) -> None:
        load_checkpoint(checkpoint, self.trainer)
        self.server.serve_current(self.trainer.step)

    def _save(self, model) -> str:
        return str(save_checkpoint(self._model_dir(model), self.trainer, self.spec, model.base_model,
                                   {"seed": self.config.seed}, keep=1 << 30, layout=ART_LAYOUT))

    async def _hold(self, model, step: int) -> None:
        if self.server is None:
            raise RuntimeError("register the model with this backend before leasing a step")
        folder = checkpoint_dir(self._model_dir(model)) / ART_LAYOUT.name(step)

        def load() -> dict:
            if not (folder / ADAPTER_WEIGHTS).exists():
                raise ValueError(f"step {step} is not served any more and has no checkpoint at {folder}")
            return dict(mx.load(str(folder / ADAPTER_WEIGHTS)))
        await asyncio.wrap_future(self.server.hold_step(step, load))

    async def _release(self, step: int) -> None:
        if self.server is not None:
            await asyncio.wrap_future(self.server.release_step(step))

    def _groups(self, trajectory_groups) -> tuple[list[Group], list[str]]:
        vocab = vocab_size(self.server.model)
        groups, refused = [], []
        for number, group in enumerate(trajectory_groups):
            episodes = []
            for trajectory in group.trajectories:
                try:
                    episodes.append(trajectory_episode(trajectory, self.server.chat, self.config.temperature, vocab,
                                                      self.config.hint_form))
                except TrajectoryRefused as error:
                    refused.append(f"group {number}: {error}")
            if episodes:
                groups.append(Group(seed=number, episodes=episodes, policy_version=self.step))
        return groups, refused

    def _train_step(self, model, groups: list[Group], settings: dict) -> tuple[dict, str | None]:
        """On the scheduler's thread: one GRPO update of the served model, then the new adapter swaps in."""
        trainer = self.trainer
        trainer.apply(replace(TrainerSettings.of(self.config), objective=settings["objective"],
                              eps_low=settings["eps_low"], eps_high=settings["eps_high"],
                              scale_advantages=settings["scale_advantages"],
                              kl_coef=settings["kl_coef"], learning_rate=settings["learning_rate"]))
        self.server.train_from_served()
        if groups:
            stats = trainer.train_step(groups)
        else:  # nothing trainable: the step still advances, as ART's LocalBackend does
            trainer.step += 1
            stats = {"groups": 0}
        self.server.serve_current(trainer.step, keep=self.kept_steps)
        saved = self._save(model) if settings["save_checkpoint"] else None
        return {name: float(value) for name, value in stats.items() if isinstance(value, (int, float))}, saved
