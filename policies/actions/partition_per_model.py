"""Elastic jobs placed across a site's GPU partitions of one model each (pure: views in, actions out).

Many sites give each GPU model its own partition (``a100``, ``l40s``) rather than one partition whose nodes
name several kinds in their GRES. With ``[goodput] across_gpu_types``, the agent treats those partitions as
one room of several kinds: the partitions the policy file calls GPU partitions (``role = "gpu"``) whose
usable nodes all name the same one kind, where two or more kinds are so found, each in one partition only
(two partitions of one model are two queues, not a choice of model) and no node in two of them.

The typed policy places an elastic job that waits in one of them exactly as it places one that waits in a
partition of several kinds (:func:`~dlsub.policies.actions.gpu_kind_rules.place_waiting`): on the kind that is
fastest for it by what it, or its user's earlier runs of the same command, measured on one GPU of each, when a
node of that kind has its GPUs idle or held by elastic workers. Here the place is the partition of that kind:
the job's pending main job is pointed at it (``scontrol update Partition=... TresPerNode=gres:gpu:KIND:N``),
never at one Slurm would refuse the job (AllowGroups, AllowAccounts, a MaxTime shorter than its limit), and
never when its user named the partition (``-p``) or the kind. Its held workers follow it there when it grows
(the agent's grow points each at the main job's partition as it releases it).

A running elastic job of one of them is sized among all the site's kinds (:func:`sizing_room`), and a move the
policy makes to another kind (:func:`~dlsub.policies.actions.gpu_kind_rules.plan_across_kinds`, with its
checks: measured where it runs, checkpointed, the gain beats the restart, room for its main job now) is pointed
at that kind's partition under the same rules (:func:`moves_across_partitions`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dlsub.policies.actions.goodput_resize_rules import ScaledJob
from dlsub.policies.actions.gpu_kind_rules import place_waiting
from dlsub.policies.actions.kinds import ActionKind
from dlsub.policies.actions.move_views import Action
from dlsub.policies.actions.partition_view import PartitionView
from dlsub.policies.actions.resize_rules import ElasticJob
from dlsub.policies.api import Policy


@dataclass(frozen=True)
class ModelPartitions:
    """The site's GPU partitions of one model each, as one room of several kinds."""

    room: PartitionView  # their nodes together, and what waits in each counted against its kind
    partition_of: Mapping[str, str]  # each kind's partition

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self.partition_of.values())

    @property
    def kinds(self) -> list[str]:
        return sorted(self.partition_of)


def model_partitions(rooms: Sequence[PartitionView]) -> ModelPartitions | None:
    """The GPU partitions of one model each among ``rooms`` (see the module's doc); None where there are not two
    kinds so found."""
    by_kind: dict[str, list[PartitionView]] = {}
    for room in rooms:
        kinds = {n.gpu_type or "" for n in room.nodes}
        if room.role == "gpu" and len(kinds) == 1 and "" not in kinds and "," not in room.name:
            by_kind.setdefault(kinds.pop(), []).append(room)
    chosen = {kind: found[0] for kind, found in by_kind.items() if len(found) == 1}
    nodes = [n for room in chosen.values() for n in room.nodes]
    if len(chosen) < 2 or len({n.name for n in nodes}) != len(nodes):
        return None
    # A job waiting in a partition of one model waits for that model, whatever kind its request names.
    waiting: Counter[str] = Counter()
    for kind, room in chosen.items():
        waiting[kind] += room.waiting_gpus
    merged = PartitionView(
        "+".join(sorted(room.name for room in chosen.values())), tuple(nodes),
        sum(room.waiting_gpus for room in chosen.values()),
        max(room.waiting_per_node for room in chosen.values()),
        tuple(sorted((k, g) for k, g in waiting.items() if g > 0)), role="gpu")
    return ModelPartitions(merged, {kind: room.name for kind, room in chosen.items()})


def place_across_partitions(waiting: Sequence[ScaledJob], running: Sequence[ScaledJob], site: ModelPartitions,
                            policy: Policy, now: float, may_use: Mapping[str, frozenset[str]]) -> list[Action]:
    """The partition (and so the model) each elastic job that waits in one of ``site``'s partitions is asked
    for (``PLACE`` actions naming the partition). ``waiting``, ``running``: the site's elastic jobs as the policy
    sees them, on each of its kinds; ``may_use``: per dlsub id, the site's partitions Slurm would take the job
    on."""
    jobs = {s.job.dlsub_id: s.job for s in waiting}
    actions = []
    for action in place_waiting([s for s in waiting if not _pinned(s.job)], running, site.room, policy, now):
        job = jobs[action.dlsub_id]
        target = (site.partition_of.get(action.gpu_type) if action.gpu_type
                  else _idle_partition(site, job))
        if target is None or target not in may_use.get(job.dlsub_id, frozenset()):
            continue
        if target == job.partition and (action.gpu_type or None) in (job.asked_gpu_type, _kind(site, target)):
            continue  # where it waits already: its partition's one kind is the kind it waits for
        kind = action.gpu_type or _kind(site, target)
        details = {**(action.details or {}), "from_partition": job.partition, "to_partition": target}
        actions.append(dataclasses.replace(
            action, partition=target, details=details,
            reason=(f"{action.reason}; on partition {target}, the site's partition of {kind}"
                    + (f" (it waited on {job.partition})" if target != job.partition else ""))))
    return actions


def sizing_room(site: ModelPartitions, room: PartitionView) -> PartitionView:
    """The room the elastic jobs of ``room`` (one of the site's partitions) are sized in: every node of the
    site's partitions, and what waits in ``room`` alone (a job waiting on another model's partition cannot use
    this one's GPUs, so it holds none of them back). Named as ``room``: its jobs' grows are on it."""
    kind = _kind(site, room.name)
    return dataclasses.replace(site.room, name=room.name, waiting_gpus=room.waiting_gpus,
                               waiting_per_node=room.waiting_per_node,
                               waiting_by_kind=((kind, room.waiting_gpus),) if room.waiting_gpus else ())


def moves_across_partitions(moves: Sequence[Action], site: ModelPartitions, jobs: Mapping[str, ElasticJob],
                            may_use: Mapping[str, frozenset[str]]) -> list[Action]:
    """The moves between kinds the typed policy made for the running elastic jobs of one of the site's
    partitions (:func:`~dlsub.policies.actions.gpu_kind_rules.plan_across_kinds`, on :func:`sizing_room`), each
    pointed at its kind's partition; a note instead where its user named the partition or the kind, or Slurm
    would refuse it there. Notes pass as they are."""
    out = []
    for action in moves:
        job = jobs.get(action.dlsub_id)
        target = site.partition_of.get(action.gpu_type or "")
        if job is None or action.kind != ActionKind.SIGNAL_MOVE or target is None or target == job.partition:
            out.append(action)
            continue
        figures = str((action.details or {}).get("figures", ""))  # the rates the move was made on (_move_or_note)
        if _pinned(job):
            why = f"its user named {'its partition' if job.pinned else 'its kind of GPU'} at submit"
            out.append(Action(ActionKind.NOTE, job.dlsub_id, job.slurm_job_id,
                              f"stays on {job.partition}: {figures}; {why}", details=action.details))
        elif target not in may_use.get(job.dlsub_id, frozenset()):
            out.append(Action(ActionKind.NOTE, job.dlsub_id, job.slurm_job_id,
                              f"not moved to {target}, the site's partition of {action.gpu_type}: {figures}; Slurm "
                              "would refuse it there (its user's groups, its account or its time limit)",
                              details=action.details))
        else:
            out.append(dataclasses.replace(
                action, partition=target, details={**(action.details or {}), "from_partition": job.partition,
                                                   "to_partition": target},
                reason=f"{action.reason}; on partition {target}, the site's partition of {action.gpu_type}"))
    return out


def _kind(site: ModelPartitions, partition: str) -> str:
    return next(k for k, p in site.partition_of.items() if p == partition)


def _pinned(job: ElasticJob) -> bool:
    """Its user chose where it runs: the partition (-p) or the kind (--gpu-type)."""
    return job.pinned or job.user_gpu_type is not None


def _idle_partition(site: ModelPartitions, job: ElasticJob) -> str | None:
    """For a job asked for as any kind again: the partition of a kind other than the one it waited for with
    its main job's GPUs idle on one node now."""
    for kind, name in sorted(site.partition_of.items()):
        if kind != job.asked_gpu_type and any(n.gpu_type == kind and n.gpus >= job.gpus_per_node
                                              for n in site.room.nodes):
            return name
    return None


def rewait(rooms: Sequence[PartitionView], placed: Sequence[Action],
           jobs: Mapping[str, ElasticJob]) -> tuple[PartitionView, ...]:
    """The rooms with the waiting GPUs of the jobs ``placed`` this tick counted where they now wait (Slurm's
    queue, read before, still has them where they were)."""
    out = {room.name: room for room in rooms}
    for action in placed:
        job = jobs.get(action.dlsub_id)
        if job is None or action.partition is None:
            continue
        source, target = out.get(job.partition), out.get(action.partition)
        if source is not None:
            out[source.name] = _counted(source, job, -1, job.asked_gpu_type)
        if target is not None:
            out[target.name] = _counted(out[target.name], job, +1, action.gpu_type or None)
    return tuple(out[room.name] for room in rooms)


def _counted(room: PartitionView, job: ElasticJob, sign: int, kind: str | None) -> PartitionView:
    by_kind: Counter[str] = Counter(dict(room.waiting_by_kind))
    if kind:
        by_kind[kind] += sign * job.main_gpus
    return dataclasses.replace(
        room, waiting_gpus=max(0, room.waiting_gpus + sign * job.main_gpus),
        waiting_per_node=max(room.waiting_per_node, job.gpus_per_node) if sign > 0 else room.waiting_per_node,
        waiting_by_kind=tuple(sorted((k, g) for k, g in by_kind.items() if g > 0)))


__all__ = ["ModelPartitions", "model_partitions", "moves_across_partitions", "place_across_partitions", "rewait",
           "sizing_room"]
