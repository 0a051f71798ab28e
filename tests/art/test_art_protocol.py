"""MLXBackend against ART's Backend protocol as ART's own trainers use it (real openpipe-art, real server):
served names and leases, requests during training, captured exchanges, lora_config, PipelineTrainer, exit."""

import asyncio
import os
import subprocess
import sys
import textwrap

import numpy as np
import openai
import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch when art imports litellm
art = pytest.importorskip("art")

from artmlx.art import MLXBackend  # noqa: E402
from tests.art.test_backend import trainable  # noqa: E402

MESSAGES = [{"role": "user", "content": "Your move?"}]


async def ask(model, name: str, **kw):
    response = await model.openai_client().chat.completions.create(model=name, messages=MESSAGES,
                                                                   max_tokens=kw.pop("max_tokens", 6), **kw)
    return response.choices[0]


async def one_group(model, size: int = 4) -> art.TrajectoryGroup:
    async def rollout():
        choice = await ask(model, model.get_inference_name())
        return art.Trajectory(messages_and_choices=[*MESSAGES, choice],
                              reward=float(choice.model_extra["token_ids"][0] % 3))
    return art.TrajectoryGroup(await asyncio.gather(*(rollout() for _ in range(size))))


def test_names_leases_and_requests_while_training(tmp_path):
    async def main():
        async with MLXBackend(path=str(tmp_path), config={"lora_rank": 4, "seed": 3}, kept_steps=2) as backend:
            model = trainable("agent")
            await model.register(backend)
            base = await ask(model, "tiny", temperature=0)  # the base model under its own name
            assert base.model_extra["adapter_version"] is None
            # Requests keep coming while train runs: none may find its model missing.
            stop = asyncio.Event()

            async def keep_asking():
                answered = []
                while not stop.is_set():
                    answered.append((await ask(model, model.get_inference_name(), max_tokens=2)).model_extra)
                return answered
            asker = asyncio.create_task(keep_asking())
            for _ in range(3):
                await backend.train(model, [await one_group(model), await one_group(model)], learning_rate=1e-2)
            stop.set()
            answered = await asker
            assert answered and {a["adapter_version"] for a in answered} <= {0, 1, 2, 3}
            assert model.get_inference_name() == "agent@3"
            # the newest and kept_steps before it are served; older ones are gone
            assert {"agent@1", "agent@2", "agent@3", "agent", "tiny"} <= set(backend.server.model_names)
            with pytest.raises(openai.NotFoundError):
                await ask(model, "agent@0")
            # an exact lease brings step 0 back from its checkpoint and pins the inference name to it
            async with backend.exact_adapter_lease(model, 0):
                assert model.get_inference_name() == "agent@0"
                leased = await ask(model, model.get_inference_name(), temperature=0)
                assert leased.model_extra["adapter_version"] == 0
                # step 0 is the fresh adapter: exactly the base model, token for token, logprob for logprob
                assert leased.model_extra["token_ids"] == base.model_extra["token_ids"]
                np.testing.assert_allclose(leased.model_extra["token_logprobs"], base.model_extra["token_logprobs"],
                                           atol=1e-5)
            assert model.get_inference_name() == "agent@3"
            with pytest.raises(openai.NotFoundError):
                await ask(model, "agent@0")
            await backend.prune_model_adapters(model, retain_steps={3})
            assert "agent@1" not in backend.server.model_names and "agent@3" in backend.server.model_names
            with pytest.raises(ValueError, match="no checkpoint"):
                async with backend.exact_adapter_lease(model, 7):
                    pass

    asyncio.run(main())


@pytest.mark.skipif(not hasattr(art, "trajectory"), reason="openpipe-art < 0.5.23 has no captured exchanges")
def test_a_trajectory_captured_as_exchanges_trains_token_exactly(tmp_path):
    from artmlx.art import trajectory_episode

    async def main():
        async with MLXBackend(path=str(tmp_path), config={"lora_rank": 4}) as backend:
            model = trainable("agent")
            await model.register(backend)
            client = model.openai_client()

            async def play():
                messages = list(MESSAGES)
                for _ in range(2):
                    response = await client.chat.completions.create(model=model.get_inference_name(),
                                                                    messages=messages, max_tokens=5)
                    messages += [{"role": "assistant", "content": response.choices[0].message.content or ""},
                                 {"role": "user", "content": "and?"}]
                art.current_trajectory(require=True).reward = 1.0
            trajectory = await art.trajectory(play())
            exchanges = trajectory.exchanges.chat_completions
            assert len(exchanges) == 2
            episode = trajectory_episode(trajectory, backend.server.chat, 1.0, backend.server.model.args.vocab_size)
            sampled = [t for e in exchanges for t in e.response.choices[0].model_extra["token_ids"]]
            assert [t for t, m in zip(episode.tokens, episode.policy_mask) if m] == sampled
            last = exchanges[-1].response
            assert episode.tokens == last.model_extra["prompt_token_ids"] + last.choices[0].model_extra["token_ids"]

    asyncio.run(main())


def test_lora_config_and_internal_config_are_mapped_or_refused(tmp_path):
    async def main():
        kw = {"lora_config": {"rank": 2, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}} \
            if "lora_config" in art.TrainableModel.model_fields else {}
        async with MLXBackend(path=str(tmp_path)) as backend:
            model = trainable("agent", **kw)
            model._internal_config = {"init_args": {"max_seq_length": 1500}, "engine_args": {"enforce_eager": True},
                                      "chat_template_kwargs": {"enable_thinking": False}}
            await model.register(backend)
            assert backend.server.config.max_prompt_tokens == 1500
            assert backend.server.config.chat_template_kwargs == {"enable_thinking": False}
            if kw:
                names = set(backend.server.scheduler.adapters[0])
                assert names and all(".q_proj." in n or ".v_proj." in n for n in names)
                assert backend.spec.rank == 2 and backend.spec.scale == 4.0
        refused = trainable("other")
        refused._internal_config = {"engine_args": {"tensor_parallel_size": 2}}
        with pytest.raises(ValueError, match="tensor_parallel_size"):
            await refused.register(MLXBackend(path=str(tmp_path)))

    asyncio.run(main())
    for scheduled in ({"lr_schedule": "cosine"}, {"lr_schedule": "linear"}, {"warmup_steps": 2}):
        with pytest.raises(ValueError, match="'lr_schedule' and 'warmup_steps' are not supported"):
            MLXBackend(path=str(tmp_path), config=scheduled)  # ART gives each step's learning rate
    assert MLXBackend(path=str(tmp_path)).config.lr_schedule == "constant"  # "auto" is constant under ART


def test_a_script_that_never_closes_its_backend_exits_cleanly(tmp_path):
    script = textwrap.dedent(f"""
        import asyncio, os
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        import art
        from artmlx.art import MLXBackend
        from tests.art.test_backend import trainable

        async def main():
            model = trainable("agent")
            await model.register(MLXBackend(path={str(tmp_path)!r}))
            response = await model.openai_client().chat.completions.create(
                model=model.get_inference_name(), messages=[{{"role": "user", "content": "hi"}}], max_tokens=3)
            print("answered", len(response.choices))
        asyncio.run(main())
    """)
    for _ in range(2):  # the abort it replaces came in most runs, not all
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                              cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
        assert done.returncode == 0, done.stderr[-2000:]
        assert "answered 1" in done.stdout and "terminate called" not in done.stderr


def test_art_pipeline_trainer_trains_and_evaluates_on_mlx_backend(tmp_path):
    """ART's own async PipelineTrainer (rollout workers, training, eval under exact adapter leases) on
    MLXBackend; ART's art.local.backend imports without torch (artmlx.art.compat)."""
    from art.pipeline_trainer import PipelineTrainer

    evaluated = []

    async def rollout_fn(model, scenario, _config) -> art.TrajectoryGroup:
        response = await model.openai_client().chat.completions.create(
            model=model.get_inference_name(), messages=[{"role": "user", "content": scenario}], max_tokens=4, n=4)
        return art.TrajectoryGroup([
            art.Trajectory(messages_and_choices=[{"role": "user", "content": scenario}, choice],
                           reward=float(choice.model_extra["token_ids"][0] % 3)) for choice in response.choices])

    async def eval_fn(model, step, _config) -> list[art.Trajectory]:
        choice = await ask(model, model.get_inference_name(step))
        evaluated.append((step, choice.model_extra["adapter_version"]))
        return [art.Trajectory(messages_and_choices=[*MESSAGES, choice], reward=1.0)]

    async def main():
        async with MLXBackend(path=str(tmp_path), config={"lora_rank": 4, "seed": 5}) as backend:
            model = trainable("pipeline")
            await model.register(backend)
            trainer = PipelineTrainer(model=model, backend=backend, rollout_fn=rollout_fn,
                                      scenarios=[f"scenario {i}" for i in range(200)], config=None, eval_fn=eval_fn,
                                      num_rollout_workers=2, min_batch_size=2, max_batch_size=2, max_steps=3,
                                      eval_every_n_steps=1, eval_at_start=True, learning_rate=1e-3)
            await trainer.train(handle_signals=False)
            assert await model.get_step() == 3
        return backend

    asyncio.run(main())
    # every eval ran on exactly the step it names, from the start (step 0) to the end
    assert evaluated and all(step == version for step, version in evaluated)
    assert {0, 3} <= {step for step, _ in evaluated}


AWS_ON_DISK = '''#!/usr/bin/env python3
"""The part of the aws CLI that ART's S3 backup runs (s3api head-bucket, s3 sync/cp) over a folder."""
import os, shutil, sys
root = os.environ["FAKE_S3_ROOT"]
args = sys.argv[1:]
local = lambda uri: os.path.join(root, uri.removeprefix("s3://")) if uri.startswith("s3://") else uri
if args[:2] == ["s3api", "head-bucket"]:
    sys.exit(0)
if args[0] == "s3" and args[1] in ("sync", "cp"):
    source, destination = local(args[-2]), local(args[-1])
    if os.path.isdir(source):
        shutil.copytree(source, destination, dirs_exist_ok=True)
    else:
        os.makedirs(os.path.dirname(destination), exist_ok=True)
        shutil.copy(source, destination)
    sys.exit(0)
sys.exit(f"not handled: {args}")
'''


def test_s3_backup_and_restore_use_arts_own_sync(tmp_path, monkeypatch):
    """LocalBackend's _experimental_push_to_s3 / _experimental_pull_from_s3 (ART's examples call them): ART's
    own sync code runs the `aws` command; here an on-disk stand-in for S3 answers it (no network)."""
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "aws").write_text(AWS_ON_DISK)
    (tools / "aws").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_S3_ROOT", str(tmp_path / "s3"))
    monkeypatch.setenv("BACKUP_BUCKET", "bucket")

    async def main():
        async with MLXBackend(path=str(tmp_path / "a"), config={"lora_rank": 4}) as backend:
            model = trainable("agent")
            await model.register(backend)
            await backend.train(model, [await one_group(model)], learning_rate=1e-2)
            await backend._experimental_push_to_s3(model)
        async with MLXBackend(path=str(tmp_path / "b"), config={"lora_rank": 4}) as elsewhere:
            copy = trainable("agent")
            await elsewhere._experimental_pull_from_s3(copy)
            await copy.register(elsewhere)
            assert await copy.get_step() == 1  # resumed from the pulled checkpoint
        async with MLXBackend(path=str(tmp_path / "c"), config={"lora_rank": 4}) as late:
            copy = trainable("agent")
            await copy.register(late)  # ART's 2048 example registers first, then pulls
            await late._experimental_pull_from_s3(copy)
            assert await copy.get_step() == 1 and copy.get_inference_name() == "agent@1"

    asyncio.run(main())
