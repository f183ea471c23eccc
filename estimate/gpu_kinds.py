"""Which kinds of GPU ``dlsub estimate`` profiles and predicts on (pure: Slurm's partitions in, targets out).

A kind of GPU runs a model at its own speed, and differently for each
model, so one kind's profile never predicts another's. A partition's kinds
are the types Slurm's GRES names on its GPU nodes (``Gres=gpu:a100:4``), or,
where the GRES names none, the one policy.toml declares for it
(``[partitions.NAME] gpu_type``), or none: an untyped partition, profiled
and predicted as before. A partition with nodes of several kinds gets one
target per kind; its untyped GPU nodes, if it also has some, get none (no
``--gres`` can ask for them alone).

A kind the GRES names is *pinned*: the profiling job, ``sbatch
--test-only`` and a submit from the row ask Slurm for it
(``--gres=gpu:KIND:N``), so the profile is measured on that kind. A kind
only the policy declares is not (Slurm would refuse a type its GRES lacks):
the partition has that one kind.

Partitions of the same role share a profile, as before, but only within a
kind: the profile of gpu's a100s stands for gpu-dev's a100s, never for its v100s.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from dlsub.contract import valid_gpu_type
from dlsub.job.submit import SubmitError
from dlsub.slurm_plugins.models import Partition


@dataclass(frozen=True)
class Target:
    """Where one row of an estimate runs: a partition, and the kind of GPU there (None: untyped or no GPUs)."""

    partition: str
    gpu_type: str | None = None
    pinned: bool = False  # the kind is a GRES type of the partition: asked for in --gres=gpu:KIND:N

    @property
    def key(self) -> str:
        """Its name in an estimate's dicts: the partition's alone when untyped (the keys untyped estimates had)."""
        return self.partition if self.gpu_type is None else f"{self.partition}/{self.gpu_type}"

    @property
    def order(self) -> tuple[str, str]:
        """Sorts by partition, then kind (an untyped estimate's order: by partition)."""
        return self.partition, self.gpu_type or ""

    @property
    def label(self) -> str:
        return self.partition if self.gpu_type is None else f"{self.partition} ({self.gpu_type})"

    @property
    def gres_type(self) -> str:
        """The kind to name in ``--gres`` ("" for any kind)."""
        return (self.gpu_type or "") if self.pinned else ""


def parse_gpu_types(text: str | None) -> frozenset[str]:
    """``--gpu-type a100,v100``: the kinds to profile on; empty for all of them."""
    if text is None:
        return frozenset()
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    bad = [k for k in kinds if valid_gpu_type(k) is None]
    if not kinds or bad:
        raise SubmitError(f"--gpu-type {text!r}: give GPU types as Slurm's GRES names them (letters, digits, '_', "
                          f"'.', '-'), comma-separated, e.g. --gpu-type a100,v100")
    return frozenset(kinds)


def partition_targets(partition: Partition, declared: str, gpus: int) -> list[Target]:
    """The targets of one partition for a job of ``gpus`` GPUs per node: one per kind of GPU it has."""
    if gpus <= 0 or not partition.max_gpus_per_node:
        return [Target(partition.name)]  # no GPUs asked for (or none there): their kind does not matter
    kinds = sorted({n.gpu_type for n in partition.nodes if n.gpus and n.gpu_type})
    if kinds:
        return [Target(partition.name, k, pinned=True) for k in kinds]
    if valid_gpu_type(declared) is not None:
        return [Target(partition.name, declared)]
    return [Target(partition.name)]


def profiled_targets(stand_in: Mapping[str, str], partitions: Mapping[str, Partition], roles: Mapping[str, str],
                     declared: Mapping[str, str], gpus: int, wanted: Collection[str] = ()) -> dict[Target, Target]:
    """{target: the target whose profile stands for it}, from the partitions' own mapping (by role,
    :func:`dlsub.estimate.estimator.profiled_partitions`, in its order) split by kind of GPU.

    ``wanted``: only these kinds on partitions with GPUs (partitions without GPUs stay, for the immediate
    recommendation); a kind no partition here has is an error naming the kinds there are.
    """
    if wanted and gpus <= 0:
        raise SubmitError("--gpu-type goes with --gpus N: a job without GPUs runs on no kind of GPU")
    mapping: dict[Target, Target] = {}
    by_group: dict[tuple[str, str | None], Target] = {}
    seen: dict[str, set[str]] = {}
    for name in stand_in:
        for target in partition_targets(partitions[name], declared.get(name, ""), gpus):
            if target.gpu_type is not None:
                seen.setdefault(target.gpu_type, set()).add(name)
            gpu_target = gpus > 0 and partitions[name].max_gpus_per_node > 0
            if wanted and gpu_target and target.gpu_type not in wanted:
                continue
            mapping[target] = by_group.setdefault((roles[name], target.gpu_type), target)
    missing = sorted(set(wanted) - set(seen))
    if missing:
        there = "; ".join(f"{k} on {', '.join(sorted(ps))}" for k, ps in sorted(seen.items()))
        raise SubmitError(f"--gpu-type {','.join(missing)}: no partition profiled here has GPUs of that kind "
                          f"(GPU types here: {there or 'none named'})")
    return mapping
