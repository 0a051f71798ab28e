"""`artmlx fleet doctor | up | down | logs | status | service HOSTS`: a fleet from a hosts file (deploy/hosts.py).

The first spellings (`artmlx doctor`, `up`, `down`, `logs`, `fleet-status`, `service`) keep working as hidden
aliases of the same commands."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import click

REMOTE_HELP = ("Remote command template with {ssh} and {command} (default: ssh in batch mode; "
               "env ARTMLX_REMOTE). Tests use 'ip netns exec {ssh} sh -c {command}'.")


def _fleet(hosts):
    from .hosts import load_hosts

    try:
        return load_hosts(hosts)
    except ValueError as error:
        raise click.ClickException(str(error))


def _remote(template, dry_run=False):
    from .remote import Remote

    try:
        return Remote(template or "", dry_run=dry_run)
    except ValueError as error:
        raise click.ClickException(str(error))


def _report(results) -> None:
    failed = [r for r in results if not r.ok]
    for result in results:
        if result.detail:
            click.echo(f"[{result.host}] {'ok' if result.ok else 'FAILED'}: {result.detail}")
    if failed:
        raise click.ClickException(f"{len(failed)} host(s) failed: {', '.join(r.host for r in failed)}")


def _train_args(model, env, steps, seed, settings) -> list[str]:
    args = []
    for flag, value in (("--model", model), ("--env", env), ("--steps", steps), ("--seed", seed)):
        if value is not None:
            args += [flag, str(value)]
    for item in settings:
        args += ["--set", item]
    return args


# the fleet's commands under their first, top-level names (hidden aliases)
TOP_LEVEL_ALIASES = {"doctor": "doctor", "up": "up", "down": "down", "logs": "logs", "status": "fleet-status",
                     "service": "service"}


@click.group(name="fleet")
def fleet_group() -> None:
    """Several machines from a hosts file: check, start, watch and stop the learner and its actors."""


def register(cli: click.Group) -> None:
    cli.add_command(fleet_group)
    for name, alias in TOP_LEVEL_ALIASES.items():
        command = copy.copy(fleet_group.commands[name])
        command.hidden = True
        cli.add_command(command, name=alias)


def _define(cli: click.Group) -> None:
    hosts_argument = click.argument("hosts", type=click.Path(dir_okay=False))
    remote_option = click.option("--remote", default="", help=REMOTE_HELP)

    @cli.command()
    @hosts_argument
    @remote_option
    @click.option("--model", default="tiny", show_default=True, help="The model the run will use.")
    @click.option("--set", "settings", multiple=True, metavar="KEY=VALUE", help="Config fields the run will use.")
    @click.option("--listen-s", type=float, default=30.0, show_default=True,
                  help="How long the learner's port is held open for the connect test.")
    def doctor(hosts, remote, model, settings, listen_s):
        """Check every host of HOSTS in parallel and say what is wrong and how to fix it."""
        from .doctor import examine, render

        findings = examine(_fleet(hosts), _remote(remote), model, list(settings), listen_s)
        click.echo(render(findings))
        if any(f.ok is False for f in findings):
            sys.exit(1)

    @cli.command()
    @hosts_argument
    @remote_option
    @click.option("--keys-dir", default="artmlx-keys", show_default=True, type=click.Path(file_okay=False),
                  help="Where the fleet's CURVE keys are made and kept (here).")
    @click.option("--dry-run", is_flag=True, help="Print every remote command instead of running it.")
    @click.option("--wait-s", type=float, default=600.0, show_default=True,
                  help="How long to wait for every actor to load the model.")
    @click.option("--model", help="tiny (embedded, default), a Hugging Face id or a model folder on every host.")
    @click.option("--env", help="Environment name or module:Class (importable on every host).")
    @click.option("--steps", type=int, help="Number of GRPO updates.")
    @click.option("--seed", type=int, help="Run seed.")
    @click.option("--set", "settings", multiple=True, metavar="KEY=VALUE", help="Any config field; repeatable.")
    @click.option("--follow", is_flag=True, help="Keep printing the per-host table until the learner stops.")
    def up(hosts, remote, keys_dir, dry_run, wait_s, model, env, steps, seed, settings, follow):
        """Make and copy keys, start the learner and every actor of HOSTS, and show them per host."""
        from .fleet import FleetControl

        control = FleetControl(_fleet(hosts), _remote(remote, dry_run), Path(keys_dir))
        _report(control.up(_train_args(model, env, steps, seed, settings), wait_s=wait_s, say=click.echo))
        if follow and not dry_run:
            control.follow(say=click.echo)

    @cli.command()
    @hosts_argument
    @remote_option
    @click.option("--dry-run", is_flag=True, help="Print every remote command instead of running it.")
    @click.option("--grace-s", type=float, default=60.0, show_default=True,
                  help="How long the learner gets to checkpoint and stop its actors before SIGKILL.")
    def down(hosts, remote, dry_run, grace_s):
        """Stop the learner of HOSTS (it checkpoints and stops its actors), then anything left."""
        from .fleet import FleetControl

        _report(FleetControl(_fleet(hosts), _remote(remote, dry_run), Path(".")).down(grace_s))

    @cli.command()
    @hosts_argument
    @remote_option
    @click.option("-n", "--lines", type=int, default=20, show_default=True, help="Lines per log.")
    def logs(hosts, remote, lines):
        """The last lines of the learner's and every actor's log, per host."""
        from .fleet import FleetControl

        for result in FleetControl(_fleet(hosts), _remote(remote), Path(".")).logs(lines):
            click.echo(f"##### {result.host}" + ("" if result.ok else " (FAILED)"))
            click.echo(result.detail)

    @cli.command(name="status")
    @hosts_argument
    @remote_option
    def fleet_status(hosts, remote):
        """The learner's state with actors, generated tokens/s and groups summed per host."""
        from .fleet import FleetControl, per_host_table

        fleet = _fleet(hosts)
        state = FleetControl(fleet, _remote(remote), Path(".")).status()
        if state is None:
            raise click.ClickException(f"no answer from the learner on {fleet.learner.ssh} ({fleet.learner.address})")
        click.echo(per_host_table(state, fleet))

    @cli.command()
    @hosts_argument
    @click.option("--host", "host_name", required=True, help="The actor host (its `ssh` field).")
    @click.option("--kind", type=click.Choice(["launchd", "systemd"]), required=True)
    @click.option("--index", type=int, default=0, show_default=True, help="Which of the host's actors.")
    def service(hosts, host_name, kind, index):
        """A launchd LaunchAgent or systemd unit that keeps one actor of HOSTS running on its host."""
        from .services import install_hint, launchd_plist, systemd_unit

        fleet = _fleet(hosts)
        try:
            host = fleet.host(host_name)
        except ValueError as error:
            raise click.ClickException(str(error))
        click.echo((launchd_plist if kind == "launchd" else systemd_unit)(fleet, host, index), nl=False)
        click.echo(f"# {install_hint(kind, host, index)}", err=True)


_define(fleet_group)
