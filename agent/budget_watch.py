"""What each budget has left, for the agent's move planner: spend from ``sacct``, read at most once a minute.

The planner (``dlsub.policies.actions.move_rules``) is pure; it gets, on each job, the
budgets that bound its owner (``JobInfo.budgets``) with what they have left
this period. This module fills them in. Spend comes from Slurm's accounting
through the one Slurm client (:meth:`SlurmClient.usage`, a single ``sacct -a``
for every user and account), priced by the policy, exactly as ``dlsub
submit`` and ``dlsub usage`` price it (:mod:`dlsub.site_config.cost`).

One ``sacct`` per minute at most (the agent's clock, so tests drive it with
a fake one), and again at once when a new period starts. Without a
``[budgets]`` table nothing is asked of Slurm and no job carries a budget.
Spend within a period only grows, so each reading is merged with the last
one of the same period by taking the larger of the two for each user and
account: when ``sacct`` fails (an exception, or a non-zero exit, which the
client reads as no records) the last reading stands. With no reading yet
nothing counts as spent, so a hiccup in accounting neither stops the tick
nor freezes every move; the submit-time check stays the strict gate.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence

from dlsub.policies.actions.move_views import BudgetLeft, JobInfo
from dlsub.site_config.budget import Budget
from dlsub.site_config.cost import Spend, period_start, record_spend
from dlsub.site_config.policy_file import AgentPolicy
from dlsub.slurm_plugins.client import SlurmClient

log = logging.getLogger("dlsub.agent")

#: Seconds a reading of ``sacct`` is used before it is read again.
SPEND_TTL_S = 60.0


def _left(scope: str, budget: Budget, spent: Spend) -> BudgetLeft:
    left = budget.left(spent)
    return BudgetLeft(scope, None if math.isinf(left.node_hours) else left.node_hours,
                      None if math.isinf(left.cost) else left.cost)


def _larger(old: dict[str, Spend], new: dict[str, Spend]) -> dict[str, Spend]:
    """Per name, the larger reading of spend (it only grows within a period; a failed read shows none)."""
    out = dict(old)
    for name, s in new.items():
        o = out.get(name, Spend())
        out[name] = Spend(max(o.node_hours, s.node_hours), max(o.cost, s.cost))
    return out


class BudgetWatch:
    def __init__(self, client: SlurmClient, policy: AgentPolicy, ttl_s: float = SPEND_TTL_S) -> None:
        self.client = client
        self.policy = policy
        self.ttl_s = ttl_s
        self._read_at: float | None = None  # the agent's clock at the last reading
        self._since: float | None = None  # the period that reading covers
        self._users: dict[str, Spend] = {}
        self._accounts: dict[str, Spend] = {}

    def _refresh(self, now: float) -> None:
        since = period_start(self.policy.budgets.period, now)
        fresh = self._read_at is not None and now - self._read_at < self.ttl_s and self._since == since
        if fresh:
            return
        if self._since != since:
            self._users, self._accounts = {}, {}  # a new period: nothing spent in it yet
        self._read_at, self._since = now, since
        try:
            records = self.client.usage(since, all_users=True)
        except Exception as exc:  # noqa: BLE001 - accounting trouble costs the budgets a reading, never the tick
            log.warning("reading spend for budgets failed (%s): using the last reading", exc)
            return
        table = self.policy.prices()
        users: dict[str, Spend] = {}
        accounts: dict[str, Spend] = {}
        for r in records:
            used = record_spend(r, table)
            users[r.user] = users.get(r.user, Spend()) + used
            if r.account:
                accounts[r.account] = accounts.get(r.account, Spend()) + used
        self._users, self._accounts = _larger(self._users, users), _larger(self._accounts, accounts)

    def left(self, user: str, account: str, now: float) -> tuple[BudgetLeft, ...]:
        """The budgets that bound ``user`` (theirs, their job's account's) with what each has left."""
        budgets = self.policy.budgets
        if not budgets.enabled:
            return ()
        self._refresh(now)
        out = []
        mine = budgets.for_user(user)
        if mine is not None:
            out.append(_left(f"user {user}", mine, self._users.get(user, Spend())))
        theirs = budgets.accounts.get(account) if account else None
        if theirs is not None:
            out.append(_left(f"account {account}", theirs, self._accounts.get(account, Spend())))
        return tuple(out)

    def attach(self, infos: Sequence[JobInfo], accounts: Mapping[int, str], now: float) -> list[JobInfo]:
        """``infos`` with their budgets filled in (``accounts``: Slurm job id → the job's account)."""
        if not self.policy.budgets.enabled:
            return list(infos)
        return [dataclasses.replace(i, budgets=self.left(i.user, accounts.get(i.slurm_job_id, ""), now))
                for i in infos]
