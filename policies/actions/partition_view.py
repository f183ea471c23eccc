"""One partition as the action rules see it this tick (pure): the one shape the move rules and the resize rules
share, built once per tick by the agent's observe step (and by the simulator's engine where it plans live)."""

from __future__ import annotations

from dataclasses import dataclass

from dlsub.policies.api import IdleNode


@dataclass(frozen=True)
class PartitionView:
    """A partition's usable nodes with what each has idle, what jobs waiting there want, and what the policy file
    says of it."""

    name: str
    # Every usable node: its idle GPUs, and its idle CPUs and free memory where known (a worker needs
    # those too).
    nodes: tuple[IdleNode, ...]
    waiting_gpus: int = 0  # GPUs wanted by jobs waiting there (not held, not ours to overtake)
    waiting_per_node: int = 0  # the most GPUs on one node that one of them wants
    # Of waiting_gpus, what the jobs that ask for one kind of GPU (gres:gpu:KIND:N) want, per kind: only GPUs
    # of that kind can start them, so only those are worth freeing or keeping for them.
    waiting_by_kind: tuple[tuple[str, int], ...] = ()
    role: str | None = None  # gpu | cpu | dev | None (not in the policy)
    speed: float = 1.0  # relative to a GPU partition's 1.0 (policy.toml)
    max_time_s: float | None = None
    cost_per_node_hour: float = 0.0  # the policy's price of a node-hour here (budgets)

    @property
    def idle_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    def _idle(self, freed: dict[str, int] | None) -> list[tuple[IdleNode, int]]:
        back = freed or {}
        return [(n, n.gpus + back.get(n.name, 0)) for n in self.nodes]

    def short_of_gpus(self, freed: dict[str, int] | None = None) -> bool:
        """Whether jobs wait here that the idle GPUs cannot start: too few in all, or none on one node.

        ``freed``: GPUs per node that leaving workers are giving back already.
        """
        if self.waiting_gpus <= 0:
            return False
        idle = self._idle(freed)
        return (self.waiting_gpus > sum(g for _, g in idle)
                or not any(g >= self.waiting_per_node for _, g in idle))

    def untyped_waiting(self) -> int:
        """The waiting GPUs of jobs that take any kind."""
        return max(0, self.waiting_gpus - sum(g for _, g in self.waiting_by_kind))

    def short_for(self, kind: str | None, freed: dict[str, int] | None = None) -> bool:
        """Whether GPUs freed on a node of ``kind`` would start a waiting job: some wait for any kind and the
        idle GPUs cannot start them all (:meth:`short_of_gpus`), or some wait for this kind and more than its
        idle GPUs."""
        if self.untyped_waiting() > 0 and self.short_of_gpus(freed):
            return True
        wanted = sum(g for k, g in self.waiting_by_kind if k == kind)
        return wanted > 0 and wanted > sum(g for n, g in self._idle(freed) if n.gpu_type == kind)


__all__ = ["PartitionView"]
