"""The `artmlx` command. Heavy imports (mlx, mlx-lm) happen inside commands, so `--help` is instant."""

from __future__ import annotations

import copy
import json
import os
import signal
import sys
from pathlib import Path

import click

from .cli_help import SectionedGroup
from .cli_options import train_config as _train_config, train_options


def _fail(error: Exception) -> None:
    """Exit with the error's message: status 2 when the run's agent code or scenarios cannot be loaded."""
    from .apps.launch import EXIT_UNUSABLE
    from .rollout.agent_code import RolloutLoadError

    failure = click.ClickException(str(error))
    if isinstance(error, RolloutLoadError):
        failure.exit_code = EXIT_UNUSABLE
    raise failure


def _entry(command, prog_name: str | None = None) -> None:
    """Console entry: pick the fast BLAS on Linux CPU, then run the click command."""
    from .fast_blas import reexec_with_fast_blas

    reexec_with_fast_blas()
    if os.environ.get("ARTMLX_DEVICE") == "cpu":  # `artmlx run --actor-devices cpu` places a process on the CPU
        import mlx.core as mx

        mx.set_default_device(mx.cpu)
    command(prog_name=prog_name)


def main() -> None:
    _entry(cli, "artmlx")


@click.group(cls=SectionedGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="artmlx")
def cli() -> None:
    """Reinforcement learning (GRPO) for LLM agents on MLX."""


@cli.command()
@train_options
@click.option("--dry-run", is_flag=True, help="Estimate memory from the model's config.json and safetensors headers "
                                              "(nothing loaded): weights, KV per row, batches, micro-batches, and "
                                              "whether one episode fits the budget; exit 1 if it does not.")
def train(config_file, model, env, rollout, scenarios, eval_scenarios, steps, seed, out, resume, settings, dry_run):
    """Train synchronously in one process: rollouts -> GRPO update -> eval.

    An environment (`--env`) or an agent (`--rollout`, played against an in-process server of the policy)."""
    from .apps.launch import EXIT_ROLLOUTS_FAILING

    try:
        config = _train_config(config_file, model, env, rollout, scenarios, eval_scenarios, steps, seed, out, resume,
                               settings)
        if dry_run:
            from .engine.estimate import estimate_for, estimate_lines

            facts = estimate_for(config)
            click.echo("\n".join([*estimate_lines(facts, config), json.dumps(facts)]))
            raise SystemExit(0 if facts["fits"] else 1)
        from .apps.train import train as run_training
        from .rollout.agents import RolloutsFailing

        try:
            run_dir = run_training(config, resume=resume)
        except RolloutsFailing as error:
            click.echo(f"error: {error}", err=True)
            sys.exit(EXIT_ROLLOUTS_FAILING)
    except (ValueError, FileNotFoundError) as error:
        _fail(error)
    click.echo(f"done: {run_dir} (adapters in {run_dir / 'adapters'}; `artmlx plot {run_dir}` draws the curves)")


def learner_main() -> None:
    """`artmlx-learner`: the same as `artmlx learner`."""
    _entry(learner, "artmlx-learner")


def actor_main() -> None:
    """`artmlx-actor`: the same as `artmlx actor`."""
    _entry(actor, "artmlx-actor")


@cli.command()
@click.option("--bind", default="tcp://127.0.0.1:5555", show_default=True, help="Address actors connect to.")
@click.option("--keys", type=click.Path(file_okay=False), help="CURVE keys folder (`artmlx keygen`).")
@click.option("--insecure", is_flag=True, help="Allow binding a network address without keys.")
@click.option("--plain", is_flag=True, help="Plain log lines even on a terminal (no live view).")
@click.option("--colocated-actors", type=click.IntRange(min=0), default=0, help="Actor threads in this process, "
              "sharing its base weights (one device; `artmlx run --placement colocated`).")
@train_options
def learner(bind, keys, insecure, plain, colocated_actors, config_file, model, env, rollout, scenarios, eval_scenarios,
            steps, seed, out, resume, settings):
    """The learner process: serves actors, trains on their groups, broadcasts adapters. Started as several ranks
    (mlx.launch's MLX_RANK and MLX_HOSTFILE), rank 0 does that and the others train their share of each update."""
    from .apps.launch import watch_parent

    watch_parent()  # under `artmlx run`: stop (checkpointing) if the supervisor is gone
    try:
        config = _train_config(config_file, model, env, rollout, scenarios, eval_scenarios, steps, seed, out, resume,
                               settings)
        from .apps.learner import LearnerService
        from .apps.learner_ranks import as_rank

        said = as_rank(config, lambda ranks: LearnerService(config, bind, Path(keys) if keys else None, insecure, resume,
                                                            ranks=ranks, live=False if plain else None,
                                                            colocated_actors=colocated_actors).run())
    except (ValueError, FileNotFoundError) as error:
        _fail(error)
    click.echo(said)


@cli.command()
@click.option("--connect", default="tcp://127.0.0.1:5555", show_default=True, help="The learner's address.")
@click.option("--name", help="Actor name shown by the learner (default: host name + random suffix).")
@click.option("--keys", type=click.Path(file_okay=False), help="CURVE keys folder with learner.key and the actor pair.")
@click.option("--actor-key", default="actor", show_default=True, help="Name of this actor's key pair in --keys.")
@click.option("--memory-budget-gb", type=float, default=0.0,
              help="Memory this actor may use; 0 = 75 % of this machine's device (shared by the processes on it).")
@click.option("--host-label", default="", help="Host name the learner shows and sums by (default: the machine's).")
def actor(connect, name, keys, actor_key, memory_budget_gb, host_label):
    """An actor process: samples groups with the learner's current adapter and streams them to it."""
    from .apps.launch import EXIT_ROLLOUTS_FAILING, watch_parent
    from .protocol.client import ActorRefused

    watch_parent()

    try:
        from .apps.actor import ActorService
        from .rollout.agents import RolloutsFailing

        if memory_budget_gb < 0:
            raise ValueError(f"--memory-budget-gb must be >= 0, got {memory_budget_gb}")
        try:
            ActorService(connect, name, Path(keys) if keys else None, actor_key, memory_budget_gb=memory_budget_gb,
                         host=host_label).run()
        except RolloutsFailing:  # the actor said why
            sys.exit(EXIT_ROLLOUTS_FAILING)
    except ActorRefused as refused:
        raise click.ClickException(f"the learner refused this actor: {refused}")
    except (ValueError, FileNotFoundError) as error:
        _fail(error)


def _devices(text: str | None) -> list[str]:
    return [d.strip() for d in text.split(",") if d.strip()] if text else []


@cli.command()
@click.option("--actors", type=int, help="Actors (default: one per two spare cores, at least 2; colocated: 1).")
@click.option("--plain", is_flag=True, help="Plain log lines even on a terminal (no live view).")
@click.option("--actor-devices", metavar="D0,D1,...",
              help="Actor i runs on entry i (cycling): a GPU index (CUDA_VISIBLE_DEVICES) or cpu.")
@click.option("--learner-device", metavar="D", default="", help="The learner's device: a GPU index or cpu.")
@click.option("--learner-ranks", type=click.IntRange(min=1), default=1, show_default=True,
              help="Learner processes training each update together (data-parallel, mx.distributed's ring).")
@click.option("--placement", type=click.Choice(["auto", "processes", "colocated"]), default="auto", show_default=True,
              help="colocated: actors as threads of the learner's process, one base copy (one GPU or Mac); "
                   "processes: actor processes; auto: processes (colocated measured slower on 2 CPU cores and for a "
                   "1.5B model on an H200, faster for a 0.5B one; it holds the base once, for when memory is short).")
@train_options
def run(actors, plain, actor_devices, learner_device, learner_ranks, placement, config_file, model, env, rollout,
        scenarios, eval_scenarios, steps, seed, out, resume, settings):
    """Learner + N actors on this machine, supervised; the single-machine pipeline."""
    try:
        config = _train_config(config_file, model, env, rollout, scenarios, eval_scenarios, steps, seed, out, resume,
                               settings)
        from .apps.launch import choose_placement, default_actor_count, run_pipeline
        from .rollout.agent_code import check_agent

        if actors is not None and actors < 1:
            raise ValueError(f"--actors must be >= 1, got {actors}")
        check_agent(config)  # the user's code, once, before any process starts
        devices = _devices(actor_devices)
        placement, why = choose_placement(placement, devices, learner_device, config.rollout)
        click.echo(f"[run] placement: {placement} ({why}; --placement overrides)")
        if placement == "colocated":
            code = run_pipeline(config, 0, resume, plain, colocated=actors or 1, learner_ranks=learner_ranks)
        else:
            code = run_pipeline(config, actors or (len(devices) if devices else default_actor_count()), resume, plain,
                                devices, learner_device, learner_ranks=learner_ranks)
    except (ValueError, FileNotFoundError) as error:
        _fail(error)
    sys.exit(code)


@cli.command(name="config")
@click.option("--recipes", is_flag=True, help="List the packaged recipes (`--config NAME`) instead.")
def show_config(recipes):
    """List every config field with its default and meaning."""
    import dataclasses

    from .config import TrainConfig, field_docs

    if recipes:
        from .recipes import recipe_names, recipe_path, recipe_summary

        width = max(map(len, recipe_names())) + 2
        for name in recipe_names():
            click.echo(f"{name:<{width}}{recipe_summary(name)}\n{'':<{width}}{recipe_path(name)}")
        return

    docs = field_docs()
    for f in dataclasses.fields(TrainConfig):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        click.echo(f"{f.name} = {default!r}\n    {docs.get(f.name, '')}")


@cli.command(name="eval")
@click.option("--adapters", type=click.Path(file_okay=False), help="Adapter folder (mlx-lm format); omit for the base.")
@click.option("--model", help="Base model; defaults to the one recorded with the adapters, else tiny.")
@click.option("--env", help="Environment; defaults to the run's (config.toml next to the adapters), else tictactoe.")
@click.option("--env-arg", "env_args", multiple=True, metavar="KEY=VALUE", help="Environment option (TOML value).")
@click.option("--episodes", type=int, default=200, show_default=True, help="Held-out episodes.")
@click.option("--temperature", type=float, help="Sampling temperature (default: the run's, else 1.0).")
@click.option("--seed", type=int, default=0, show_default=True, help="Sampling seed.")
@click.option("--config", "config_path", help="Config file or recipe whose settings to use (reply length, model, "
              "env); default: the run's config.toml next to the adapters, else the defaults.")
@click.option("--max-reply-tokens", type=int, help="Tokens per reply (default: the config's).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def eval_command(adapters, model, env, env_args, episodes, temperature, seed, config_path, max_reply_tokens,
                 as_json):
    """Evaluate adapters on held-out seeds; prints the score with a 95% confidence interval."""
    try:
        from .apps.evaluate import describe, run_eval

        result = run_eval(adapters, model, env, env_args, episodes, temperature, seed,
                          config_path=config_path, max_reply_tokens=max_reply_tokens)
    except (ValueError, FileNotFoundError) as error:
        _fail(error)
    click.echo(json.dumps(result, indent=2) if as_json else describe(result))


@cli.command()
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False, exists=True))
@click.option("--out", type=click.Path(dir_okay=False), help="PNG path (default RUN_DIR/plot.png).")
def plot(run_dirs, out):
    """Plot reward and eval score of one or more runs (several runs share one figure)."""
    from .plot import plot_runs

    try:
        path = plot_runs([Path(d) for d in run_dirs], Path(out) if out else None)
    except (ValueError, FileNotFoundError) as error:
        _fail(error)
    click.echo(str(path))


@cli.command()
@click.argument("folder", type=click.Path(file_okay=False))
@click.option("--actor", default="actor", show_default=True, help="Name of the actor key pair to create and allow.")
def keygen(folder, actor):
    """Create CURVE keys: the learner's pair, an actor pair, and the learner's allowed list."""
    from .protocol.security import keys_usage, make_keys

    for path in make_keys(Path(folder), actor):
        click.echo(f"wrote {path}")
    click.echo(keys_usage(folder, actor))


@cli.command()
@click.argument("address")
@click.option("--keys", type=click.Path(file_okay=False), help="CURVE keys folder, if the learner uses keys.")
@click.option("--actor-key", default="actor", show_default=True, help="Key pair name in --keys.")
@click.option("--json", "as_json", is_flag=True, help="Print the raw state as JSON.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
              help="Seconds to wait for the learner's answer.")
def status(address, keys, actor_key, as_json, timeout_s):
    """Print a running learner's state and its connected actors (ADDRESS like tcp://host:5555)."""
    from .protocol.status import format_status, query_status

    try:
        state = query_status(address, Path(keys) if keys else None, actor_key, timeout_s)
    except (TimeoutError, FileNotFoundError) as error:
        _fail(error)
    click.echo(json.dumps(state, indent=2) if as_json else format_status(state))


@cli.command()
@click.option("--model", default="tiny", show_default=True,
              help="Base model: tiny, a packaged model, a GGUF file, a Hugging Face id or a folder.")
@click.option("--adapters", type=click.Path(file_okay=False), help="Adapter folder (RUN_DIR/adapters).")
@click.option("--name", default="", help="Model name clients ask for (default: --model).")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8000, show_default=True)
@click.option("--api-key", default="", envvar="ARTMLX_API_KEY", help="Required bearer key (env ARTMLX_API_KEY).")
@click.option("--max-rows", type=int, default=32, show_default=True, help="Requests decoded together at most.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=1024, show_default=True,
              help="Largest max_tokens a request may ask for (and the default).")
@click.option("--prefix-cache-mb", type=click.IntRange(min=0), default=1024, show_default=True,
              help="KV of finished sequences kept for requests that extend them (0: no prefix cache).")
@click.option("--decode-chunk", type=click.IntRange(min=0), default=0, show_default=True,
              help="Decode steps queued between two host reads of the sampled tokens (vLLM's multi-step); "
                   "0: 8, or 1 for a model with recurrent layers.")
def serve(model, adapters, name, host, port, api_key, max_rows, max_tokens, prefix_cache_mb, decode_chunk):
    """OpenAI-compatible server (chat and completions, exact token ids and logprobs, continuous batching)."""
    from .serve import run_server
    from .serve.model_server import ModelServer, ServeConfig

    if host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        _fail(ValueError(f"refusing to serve on {host} without --api-key (anyone on the network could use it)"))
    try:
        server = ModelServer(ServeConfig(model=model, adapters=adapters or "", name=name, max_rows=max_rows,
                                         max_tokens=max_tokens, prefix_cache_mb=prefix_cache_mb,
                                         decode_chunk=decode_chunk))
    except (ValueError, FileNotFoundError) as error:
        _fail(error)
    click.echo(f"serving {server.model_names} on http://{host}:{port}/v1", err=True)
    # uvicorn shuts down on SIGINT/SIGTERM and then raises the signal again: end here, after the engine stops.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        run_server(server, host, port, api_key)
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
        click.echo("server stopped", err=True)


def _register_subgroups() -> None:
    from .bench.cli import bench
    from .deploy.cli import register
    from .model.cli import model_group, model_path_command

    cli.add_command(bench)
    cli.add_command(model_group)
    model_path_alias = copy.copy(model_path_command)  # the first spelling, kept working, listed as `model path`
    model_path_alias.hidden = True
    cli.add_command(model_path_alias, name="model-path")
    register(cli)


_register_subgroups()


if __name__ == "__main__":
    sys.exit(main())
