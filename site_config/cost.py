"""Node-hours and cost: of one job from its attempts, of a user from Slurm's accounting (pure).

The price of a partition is the policy's ``cost_per_node_hour``; GPUs of a
kind the policy prices (``[gpu_types.NAME] cost_per_gpu_hour``) cost that
per GPU-hour instead, wherever they run (a100s cost what a100s cost, on any
partition). The kind is the one Slurm's GRES named for the allocation, or
the partition's declared ``gpu_type``. A job's
spend so far comes from its own attempt records (start and end of each
Slurm attempt; a running attempt counts up to now). A user's or account's
spend over a period comes from ``sacct`` (every allocation, requeued ones
too), so jobs outside dlsub and profiling runs count as well.
"""

from __future__ import annotations

import calendar
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
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


def _first(partition: str) -> str:
    """A job over several partitions (``gpu,cpu``) is priced at the first."""
    return partition.split(",")[0]


@dataclass(frozen=True)
class Prices:
    """The policy's prices: per node-hour of each partition, per GPU-hour of each GPU type it prices, and the
    GPU type a partition declares (for sites whose GRES does not name one)."""

    node_hour: Mapping[str, float] = field(default_factory=dict)
    gpu_hour: Mapping[str, float] = field(default_factory=dict)
    partition_gpu_type: Mapping[str, str] = field(default_factory=dict)

    def gpu_type(self, partition: str, named: str = "") -> str:
        """The kind of GPU an allocation has: the one Slurm named, else the partition's declared one."""
        return named or self.partition_gpu_type.get(_first(partition), "")

    def hourly(self, partition: str, nodes: int, gpus: int = 0, gpu_type: str = "") -> float:
        """What an allocation costs an hour: its GPUs at their kind's price when the policy prices that
        kind, else its nodes at the partition's."""
        kind = self.gpu_type(partition, gpu_type)
        if gpus > 0 and kind in self.gpu_hour:
            return gpus * float(self.gpu_hour[kind])
        return max(1, nodes) * float(self.node_hour.get(_first(partition), 0.0))


def spend_at(seconds: float, nodes: int, hourly: float) -> Spend:
    """``seconds`` of an allocation of ``nodes`` that costs ``hourly`` (:meth:`Prices.hourly`) an hour."""
    hours = max(0.0, seconds) / 3600.0
    return Spend(hours * max(1, nodes), hours * hourly)


def _attempt_gpus(start: Mapping[str, Any], nodes: int) -> int:
    """The GPUs of an attempt: its start record names its node's (``"0,1"``), the same on each of its nodes."""
    named = str(start.get("gpus") or "")
    return len([g for g in named.split(",") if g.strip()]) * max(1, nodes)


def job_spend(attempts: Sequence[dict[str, Any]], nodes: int, prices: Prices, now: float) -> Spend:
    """What a job has used so far, by its attempt records (a running attempt up to ``now``)."""
    total = Spend()
    open_start: dict[Any, dict[str, Any]] = {}

    def used(start: dict[str, Any], until: float) -> Spend:
        hourly = prices.hourly(str(start.get("partition", "")), nodes, _attempt_gpus(start, nodes),
                              str(start.get("gpu_type") or ""))
        return spend_at(until - float(start["time"]), nodes, hourly)

    for event in attempts:
        key = (event.get("slurm_job_id"), event.get("restart"))
        if event.get("event") == "start":
            open_start[key] = event
        elif event.get("event") == "end" and key in open_start:
            total += used(open_start.pop(key), float(event["time"]))
    for start in open_start.values():
        total += used(start, now)
    return total


def record_spend(record: UsageRecord, prices: Prices) -> Spend:
    """One allocation of Slurm's accounting, at the site's prices."""
    hourly = prices.hourly(record.partition, record.nodes, record.gpus, record.gpu_type)
    return spend_at(record.elapsed_s, record.nodes, hourly)


def summarize(records: Iterable[UsageRecord], prices: Prices) -> dict[tuple[str, str], Spend]:
    """Spend per (user, partition)."""
    out: dict[tuple[str, str], Spend] = {}
    for r in records:
        key = (r.user, r.partition)
        out[key] = out.get(key, Spend()) + record_spend(r, prices)
    return out


def total(records: Iterable[UsageRecord], prices: Prices) -> Spend:
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
