"""Node-hours and cost: of one job from its attempts, of a user from Slurm's accounting (pure).

The price of a partition is the policy's ``cost_per_node_hour``. A job's
spend so far comes from its own attempt records (start and end of each
Slurm attempt; a running attempt counts up to now). A user's or account's
spend over a period comes from ``sacct`` (every allocation, requeued ones
too), so jobs outside dlsub and profiling runs count as well.
"""

from __future__ import annotations

import calendar
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from dlsub.slurm_plugins.usage import UsageRecord

PERIODS = ("day", "week", "month")


@dataclass(frozen=True)
class Spend:
    node_hours: float = 0.0
    cost: float = 0.0

    def __add__(self, other: Spend) -> Spend:
        return Spend(self.node_hours + other.node_hours, self.cost + other.cost)


def price(prices: Mapping[str, float], partition: str) -> float:
    """A partition's cost per node-hour; a job over several (``gpu,cpu``) is priced at the first."""
    return float(prices.get(partition.split(",")[0], 0.0))


def spend(seconds: float, nodes: int, cost_per_node_hour: float) -> Spend:
    hours = max(0.0, seconds) / 3600.0 * max(1, nodes)
    return Spend(hours, hours * cost_per_node_hour)


def job_spend(attempts: Sequence[dict[str, Any]], nodes: int, prices: Mapping[str, float], now: float) -> Spend:
    """What a job has used so far, by its attempt records (a running attempt up to ``now``)."""
    total = Spend()
    open_start: dict[Any, dict[str, Any]] = {}
    for event in attempts:
        key = (event.get("slurm_job_id"), event.get("restart"))
        if event.get("event") == "start":
            open_start[key] = event
        elif event.get("event") == "end" and key in open_start:
            start = open_start.pop(key)
            total += spend(float(event["time"]) - float(start["time"]), nodes,
                           price(prices, str(start.get("partition", ""))))
    for start in open_start.values():
        total += spend(now - float(start["time"]), nodes, price(prices, str(start.get("partition", ""))))
    return total


def summarize(records: Iterable[UsageRecord], prices: Mapping[str, float]) -> dict[tuple[str, str], Spend]:
    """Spend per (user, partition)."""
    out: dict[tuple[str, str], Spend] = {}
    for r in records:
        key = (r.user, r.partition)
        out[key] = out.get(key, Spend()) + spend(r.elapsed_s, r.nodes, price(prices, r.partition))
    return out


def total(records: Iterable[UsageRecord], prices: Mapping[str, float]) -> Spend:
    result = Spend()
    for value in summarize(records, prices).values():
        result += value
    return result


def period_start(period: str, now: float, tz: timezone | None = None) -> float:
    """The start of the budget period containing ``now``: midnight, Monday midnight, the 1st of the month."""
    if period not in PERIODS:
        raise ValueError(f"period {period!r}; valid periods: {', '.join(PERIODS)}")
    moment = datetime.fromtimestamp(now, tz or UTC)
    midnight = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        return midnight.timestamp()
    if period == "week":
        return (midnight - timedelta(days=midnight.weekday())).timestamp()
    return midnight.replace(day=1).timestamp()


def period_end(period: str, now: float, tz: timezone | None = None) -> float:
    start = datetime.fromtimestamp(period_start(period, now, tz), tz or UTC)
    if period == "day":
        return (start + timedelta(days=1)).timestamp()
    if period == "week":
        return (start + timedelta(days=7)).timestamp()
    return (start + timedelta(days=calendar.monthrange(start.year, start.month)[1])).timestamp()
