"""Budgets from policy.toml: node-hours or cost per user or account and period (pure).

::

    [budgets]
    period = "month"            # day | week | month (UTC)
    [budgets.users.alice]       # "*" is every user without a table of their own
    node_hours = 100.0
    [budgets.accounts.vision]
    cost = 2500.0

A budget with both keys must keep both. :func:`refusal` is what ``dlsub
submit`` and ``dlsub estimate`` ask before Slurm sees a job; :func:`allows`
is the one question the agent's move planner asks before a move.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dlsub.site_config.cost import PERIODS, Spend
from dlsub.strict import unknown_keys


class BudgetError(ValueError):
    """A ``[budgets]`` table that cannot be used; the message names the key."""


@dataclass(frozen=True)
class Budget:
    # Node-hours per period (nodes x hours, whatever the partition); none: not limited.
    node_hours: float | None = None
    # Cost per period at the partitions' and GPU kinds' prices; none: not limited.
    cost: float | None = None

    def left(self, spent: Spend) -> Spend:
        """What is left (infinite where the budget sets no bound; never below zero)."""
        return Spend(math.inf if self.node_hours is None else max(0.0, self.node_hours - spent.node_hours),
                     math.inf if self.cost is None else max(0.0, self.cost - spent.cost))


@dataclass(frozen=True)
class Budgets:
    # The period a budget is counted over: "day", "week" or "month" (UTC).
    period: str = "month"
    users: Mapping[str, Budget] = field(default_factory=dict)
    accounts: Mapping[str, Budget] = field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        return bool(self.users or self.accounts)

    def for_user(self, user: str) -> Budget | None:
        return self.users.get(user) or self.users.get("*")


def _budget(where: str, table: Any) -> Budget:
    if not isinstance(table, dict):
        raise BudgetError(f"{where}: expected a table with node_hours and/or cost")
    message = unknown_keys(where, table, ["node_hours", "cost"])
    if message:
        raise BudgetError(message)
    values: dict[str, float] = {}
    for key, value in table.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise BudgetError(f"{where}.{key}: expected a number 0 or more, got {value!r}")
        values[key] = float(value)
    if not values:
        raise BudgetError(f"{where}: give node_hours, cost or both")
    return Budget(**values)


def parse_budgets(table: Any, where: str = "policy.toml.budgets") -> Budgets:
    if not isinstance(table, dict):
        raise BudgetError(f"{where}: expected a table")
    message = unknown_keys(where, table, ["period", "users", "accounts"])
    if message:
        raise BudgetError(message)
    period = table.get("period", "month")
    if period not in PERIODS:
        raise BudgetError(f"{where}.period: {period!r}; valid periods: {', '.join(PERIODS)}")
    parsed: dict[str, dict[str, Budget]] = {}
    for kind in ("users", "accounts"):
        group = table.get(kind, {})
        if not isinstance(group, dict):
            raise BudgetError(f"{where}.{kind}: expected tables [budgets.{kind}.NAME]")
        parsed[kind] = {str(name): _budget(f"{where}.{kind}.{name}", value) for name, value in group.items()}
    return Budgets(period, parsed["users"], parsed["accounts"])


def allows(left: Spend, extra: Spend) -> bool:
    """May something costing ``extra`` start when ``left`` is what remains? (The move planner's hook.)"""
    return extra.node_hours <= left.node_hours + 1e-9 and extra.cost <= left.cost + 1e-9





def refusal(who: str, budget: Budget, spent: Spend, extra: Spend, period: str) -> str | None:
    """None when ``extra`` fits in what ``budget`` leaves of this period; else the message to show."""
    left = budget.left(spent)
    exhausted = (budget.node_hours is not None and left.node_hours <= 0) or (budget.cost is not None
                                                                              and left.cost <= 0)
    if not exhausted and allows(left, extra):
        return None
    parts = []
    if budget.node_hours is not None:
        parts.append(f"{spent.node_hours:.2f} of {budget.node_hours:.2f} node-hours used, "
                     f"{left.node_hours:.2f} left")
    if budget.cost is not None:
        parts.append(f"{spent.cost:.2f} of {budget.cost:.2f} (cost) used, {left.cost:.2f} left")
    need = (f"; this job may use up to {extra.node_hours:.2f} node-hours costing {extra.cost:.2f} (its time "
            f"limit × nodes × the partition's price)" if not exhausted else "")
    return (f"budget: {who} has {'; '.join(parts)} this {period}{need}. Ask for less (--time, --nodes, a "
            f"cheaper partition with -p), wait for the next {period}, or ask your admin to raise the budget")
