"""The ``dlsub agent`` group, ``dlsub why``, ``dlsub backfill --once`` and ``dlsub config check``.

Assembled from two halves that live apart: the daemon's commands
(:mod:`dlsub.cli.daemon_commands`: ``agent run``, ``agent tick``, ``backfill``,
run as the service account) and what users ask it
(:mod:`dlsub.cli.query_commands`: ``why``, ``agent status``, over its socket).
"""

from __future__ import annotations

from pathlib import Path

import click

from dlsub.cli import daemon_commands, query_commands
from dlsub.cli.errors import fail
from dlsub.site_config.policy_file import PolicyFileError, load_policy

__all__ = ["agent", "backfill", "config", "why"]

why = query_commands.why
backfill = daemon_commands.backfill


@click.group()
def agent() -> None:
    """The agent: a reconcile loop that moves, continues and backfills dlsub jobs."""


agent.add_command(daemon_commands.run)
agent.add_command(daemon_commands.tick)
agent.add_command(query_commands.status)


@click.group()
def config() -> None:
    """The admin's policy file."""


@config.command()
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False))
def check(file: Path) -> None:
    """Validate a policy.toml: unknown keys, types, cron expressions, policy name."""
    try:
        policy = load_policy(file)
    except PolicyFileError as exc:
        fail(str(exc))
    click.echo(f"{file}: ok: policy {policy.policy}, default mode {policy.default_mode}, "
               f"tick every {policy.tick_interval_s:g} s, {len(policy.partitions)} partition(s) "
               f"({', '.join(f'{n}={p.role}' for n, p in policy.partitions.items()) or 'none'}), "
               f"{len(policy.backfill.windows)} backfill window(s)")
