"""Budgets enforced before a job reaches Slurm: ``dlsub submit`` and ``dlsub estimate`` ask here.

Spend comes from Slurm's accounting (:meth:`SlurmClient.usage`) for the
budget's period, priced by the policy; a user's own dlsub store is not
trusted for it. Without a ``[budgets]`` table nothing is asked of Slurm.
"""

from __future__ import annotations

import time

from dlsub.job.submit import SubmitError
from dlsub.site_config.budget import refusal
from dlsub.site_config.cost import Spend, period_start, spend_at, total
from dlsub.site_config.policy_file import AgentPolicy
from dlsub.slurm_plugins.client import SlurmClient


class OverBudget(SubmitError):
    """The job would take the user or their account past its budget; the message says what is left."""


def extra_for(policy: AgentPolicy, partition: str, nodes: int, time_limit_min: int | None, gpus: int = 0,
              gpu_type: str = "") -> Spend:
    """The most a job may use: its time limit at the price of its allocation (0 without a limit). Its GPUs
    cost their kind's price where the policy prices kinds; before Slurm places it, its kind is the one it
    asks for (``gpu_type``), else the partition's declared one, or else the dearest kind it may get (a job
    on a cpu-role partition has none)."""
    table = policy.prices()
    kinds = [""]
    if gpus > 0 and gpu_type:
        kinds = [gpu_type]
    elif gpus > 0 and policy.role_of(partition) != "cpu":
        declared = table.gpu_type(partition)
        kinds = [declared] if declared else ["", *table.gpu_hour]
    hourly = max(table.hourly(partition, nodes, gpus, kind) for kind in kinds)
    return spend_at(60.0 * (time_limit_min or 0), nodes, hourly)


def check_budget(policy: AgentPolicy, client: SlurmClient, user: str, extra: Spend,
                 now: float | None = None) -> None:
    """Raise :class:`OverBudget` when ``extra`` does not fit in the user's or their account's budget."""
    budgets = policy.budgets
    if not budgets.enabled:
        return
    since = period_start(budgets.period, time.time() if now is None else now)
    mine = client.usage(since, user=user)
    budget = budgets.for_user(user)
    if budget is not None:
        message = refusal(f"user {user}", budget, total(mine, policy.prices()), extra, budgets.period)
        if message:
            raise OverBudget(message)
    for account in sorted({r.account for r in mine if r.account} & set(budgets.accounts)):
        spent = total(client.usage(since, account=account, all_users=True), policy.prices())
        message = refusal(f"account {account}", budgets.accounts[account], spent, extra, budgets.period)
        if message:
            raise OverBudget(message)
