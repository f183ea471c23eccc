"""``dlsub usage``: node-hours and cost per user and partition, from Slurm's accounting."""

from __future__ import annotations

import getpass
import json
import time
from datetime import datetime

import click

from dlsub.cli.errors import fail
from dlsub.site_config.cost import Spend, period_start, summarize
from dlsub.site_config.policy_file import AgentPolicy, PolicyFileError, load_policy
from dlsub.slurm_plugins.client import SlurmClient, SlurmError


def parse_since(text: str) -> float:
    """``2026-11-01`` or ``2026-11-01T08:00`` (local time) as epoch seconds."""
    for fmt in ("%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S"):
        try:
            return datetime.strptime(text, fmt).timestamp()
        except ValueError:
            continue
    raise click.BadParameter(f"{text!r} is not a date; use YYYY-MM-DD or YYYY-MM-DDTHH:MM")


@click.command()
@click.option("--user", "who", default=None, help="Whose usage (yours by default; others' for admins only).")
@click.option("--since", default=None, help="From this date (YYYY-MM-DD) [default: the start of the budget period].")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
def usage(who: str | None, since: str | None, as_json: bool) -> None:
    """Node-hours and cost of your jobs (all of Slurm's, dlsub's or not) by partition, at the site's prices."""
    me = getpass.getuser()
    try:
        policy = load_policy()
    except PolicyFileError as exc:
        click.echo(f"dlsub: warning: {exc}; using dlsub's default policy", err=True)
        policy = AgentPolicy()
    user = who or me
    if user != me and not policy.is_admin(me):
        fail(f"you may see your own usage only (you are {me}); drop --user")
    try:
        start = parse_since(since) if since else period_start(policy.budgets.period, time.time())
    except click.BadParameter as exc:
        fail(f"--since: {exc.message}")
    try:
        records = SlurmClient().usage(start, user=user)
    except SlurmError as exc:
        fail(str(exc), 1)
    table = summarize(records, policy.prices())
    grand = Spend()
    for value in table.values():
        grand += value
    # What is left is of the budget's own period; shown only when that is what was summed.
    budget = policy.budgets.for_user(user) if since is None else None
    left = budget.left(grand) if budget else None
    if as_json:
        click.echo(json.dumps({
            "user": user, "since": start,
            "partitions": [{"partition": p, "node_hours": round(s.node_hours, 4), "cost": round(s.cost, 4)}
                           for (_, p), s in sorted(table.items())],
            "node_hours": round(grand.node_hours, 4), "cost": round(grand.cost, 4),
            "budget": None if budget is None else {"node_hours": budget.node_hours, "cost": budget.cost,
                                                  "period": policy.budgets.period},
        }, indent=2))
        return
    click.echo(f"usage of {user} since {datetime.fromtimestamp(start):%Y-%m-%d %H:%M}")
    click.echo(f"{'PARTITION':<16}{'NODE-HOURS':>12}{'COST':>12}")
    for (_, part), s in sorted(table.items()):
        click.echo(f"{part:<16}{s.node_hours:>12.3f}{s.cost:>12.2f}")
    click.echo(f"{'total':<16}{grand.node_hours:>12.3f}{grand.cost:>12.2f}")
    if budget is not None and left is not None:
        click.echo(f"budget this {policy.budgets.period}: "
                   + ", ".join(x for x in (f"{left.node_hours:.2f} node-hours left" if budget.node_hours is not None
                                           else "", f"{left.cost:.2f} cost left" if budget.cost is not None
                                           else "") if x))
