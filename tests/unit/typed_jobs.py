"""Helpers for the pure policy tests on clusters of several GPU types (no tests here): an exact model of a
job's goodput, a job, a typed cluster, and which type and size each job got."""

from __future__ import annotations

from dataclasses import dataclass

from dlsub.policies.api import Allocation, ClusterView, JobView, Node


@dataclass(frozen=True)
class Linear:
    """Goodput ``speed x GPUs ** power`` at every batch size (batch 64)."""

    speed: float
    power: float = 1.0

    def step_time(self, placement: tuple[int, ...], batch_size: int) -> float:
        return 1.0 / self.goodput(placement, batch_size)

    def goodput(self, placement: tuple[int, ...], batch_size: int) -> float:
        return self.speed * sum(placement) ** self.power

    def best_batch(self, placement: tuple[int, ...]) -> tuple[int, float]:
        return 64, self.goodput(placement, 64)


def job(name: str, hi: int = 8, arrival_s: float = 0.0, **fields: object) -> JobView:
    return JobView(name=name, arrival_s=arrival_s, gpus=1, min_gpus=1, max_gpus=hi, adaptive_batch=True,
                   batch_size=64, **fields)  # type: ignore[arg-type]


def cluster(*groups: tuple[str, int, int]) -> ClusterView:
    """(type, nodes, GPUs a node) per group."""
    return ClusterView(tuple(Node(f"{t}{i}", per, gpu_type=t) for t, count, per in groups for i in range(count)))


def types_of(decision: dict[str, Allocation], c: ClusterView) -> dict[str, tuple[str, int]]:
    """Each job given GPUs: (its nodes' GPU type, its GPUs)."""
    kinds = c.type_of()
    return {name: ({kinds[n] for n in a.nodes}.pop(), a.gpus) for name, a in decision.items() if a.gpus}
