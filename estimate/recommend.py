"""The rows and the recommendation of ``dlsub estimate`` (pure: fits and cluster facts in, a table out).

One row per (partition, kind of GPU, batch size; the kind only where the
partition's GPUs have one, see :mod:`dlsub.estimate.gpu_kinds`): memory per node, walltime (with the
continuations the partition's MaxTime forces), node-hours and cost, when
Slurm would start it (``sbatch --test-only``), when it would finish, and
whether it can run at all (memory and GPUs per node, continuations).

The recommendation compares, as iScheduler does:

* **ideal**: wait for the row that finishes first on a GPU partition;
* **immediate**: start now where the job can start now (a CPU or dev
  partition), at the ideal row's batch size, and move onto the ideal
  partition when it frees up (the steps done by then are kept; the move
  costs the policy's restart cost and an attempt's fixed cost).

It recommends immediate when that finishes earlier by more than the
policy's ``min_saving_s``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dlsub.estimate.partition_fit import PartitionFit, cost, node_hours, walltime
from dlsub.job.loss_curve import fit_loss_curve

#: A row whose estimated start is at most this far off "starts now".
STARTS_NOW_S = 60.0


@dataclass(frozen=True)
class PartitionFacts:
    name: str
    role: str  # gpu, cpu or dev (the policy's; "gpu" when the node has GPUs and the policy says nothing)
    max_time_s: float | None
    node_memory_mb: int
    node_gpus: int
    cost_per_node_hour: float
    start_in_s: float | None  # from sbatch --test-only; None: Slurm cannot place it
    # The kind of GPU the row runs on (None: untyped, or no GPUs asked for) and where the kind was read:
    # "gres" (Slurm's GRES type, asked for in --gres) or "policy" (the partition's declared gpu_type).
    gpu_type: str | None = None
    gpu_type_from: str = ""
    # policy.toml [gpu_types.KIND] cost_per_gpu_hour, where it prices the kind: its GPUs cost that instead
    # of the node-hour price, as dlsub's cost of a job counts them.
    cost_per_gpu_hour: float | None = None


@dataclass(frozen=True)
class Horizon:
    epochs: float | None = None
    target_loss: float | None = None


@dataclass(frozen=True)
class Knobs:
    """What the site's policy and the request add."""

    gpus: int = 0
    nodes: int = 1
    restart_s: float = 60.0  # policy moves.restart_cost_s: one continuation or move
    grace_s: float = 60.0  # the checkpoint signal's lead before a time limit
    max_continuations: int = 20
    min_saving_s: float = 60.0


def _steps(fit: PartitionFit, batch_size: int, horizon: Horizon) -> tuple[float | None, str]:
    """Steps to the horizon at this batch size, and how they were found (or why not)."""
    if horizon.target_loss is not None:
        # The loss as a function of samples seen, from every profile of the partition: a larger
        # batch takes fewer steps to see as many samples.
        samples = [(s * p.batch_size, v) for p in fit.measured.values() for s, v in p.losses]
        curve = fit_loss_curve([s for s, _ in samples], [v for _, v in samples])
        if curve is None:
            return None, "too few loss reports in the profiles to fit the loss curve"
        at = curve.step_for(horizon.target_loss)
        if at is None:
            return None, f"the fitted loss curve levels off at {curve.c:.4g}, above the target"
        return max(1.0, at / batch_size), "loss-curve fit"
    spe = fit.steps_per_epoch(batch_size)
    if spe is None:
        return None, "the script reports no steps per epoch (init(total_steps=, total_epochs=))"
    epochs = horizon.epochs
    if epochs is None:
        declared = [p.declared_epochs for p in fit.measured.values() if p.declared_epochs]
        if not declared:
            return None, "give --epochs N or --target-loss X (the script declares no total_epochs)"
        epochs = float(declared[0])
    return epochs * spe, f"{epochs:g} epochs × {spe} steps"


def build_rows(fits: Mapping[str, PartitionFit], facts: Mapping[str, PartitionFacts],
               batch_sizes: Sequence[int], horizon: Horizon, knobs: Knobs,
               failed: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """One row per (partition, kind of GPU, batch size), numbered from 1 (``dlsub submit --choice N``).

    ``fits``, ``facts`` and ``failed`` are keyed alike: by partition, or by ``partition/kind`` where the
    partition's GPUs have a kind (:attr:`dlsub.estimate.gpu_kinds.Target.key`).
    """
    rows: list[dict[str, Any]] = []
    for name, fact in facts.items():
        fit = fits.get(name)
        for bs in batch_sizes:
            row: dict[str, Any] = {"choice": len(rows) + 1, "partition": fact.name, "role": fact.role, "batch_size": bs,
                                   "memory_mb": None, "walltime_s": None, "node_hours": None, "cost": None,
                                   "start_s": fact.start_in_s, "finish_s": None, "feasible": False,
                                   "profiled": bool(fit and bs in fit.measured), "why": "",
                                   "max_time_min": None if fact.max_time_s is None else int(fact.max_time_s // 60)}
            if fact.gpu_type is not None:  # untyped rows keep the fields they had
                row.update(gpu_type=fact.gpu_type, gpu_type_from=fact.gpu_type_from)
            rows.append(row)
            if fit is None:
                row["why"] = (failed or {}).get(name, "not profiled")
                continue
            procs = max(1, knobs.gpus) if fact.node_gpus else 1
            gpus = knobs.gpus if fact.node_gpus else 0
            memory = fit.memory(bs) * procs
            row["memory_mb"] = round(memory)
            row["step_s"] = round(fit.step_time(bs), 6)
            steps, how = _steps(fit, bs, horizon)
            row["horizon"] = how
            if steps is None:
                row["why"] = how
                continue
            steps = math.ceil(steps)
            train_s = steps * fit.step_time(bs)
            wt = walltime(train_s, fit.attempt_overhead_s, fact.max_time_s, restart_s=knobs.restart_s,
                          grace_s=knobs.grace_s)
            row.update(steps=steps, attempts=wt.attempts, train_s=round(train_s, 2),
                       overhead_s=round(fit.attempt_overhead_s, 2))
            problems = []
            if memory > fact.node_memory_mb:
                problems.append(f"needs {memory:.0f} MB per node; its nodes have {fact.node_memory_mb} MB")
            if gpus > fact.node_gpus:
                problems.append(f"needs {gpus} GPUs per node; its nodes have {fact.node_gpus}")
            if not math.isfinite(wt.seconds):
                problems.append("an attempt's start-up alone exceeds the partition's MaxTime")
            elif wt.attempts - 1 > knobs.max_continuations:
                problems.append(f"needs {wt.attempts - 1} continuations; the site allows {knobs.max_continuations}")
            if fact.start_in_s is None:
                problems.append("Slurm cannot place it there now (sbatch --test-only)")
            if math.isfinite(wt.seconds):
                row["walltime_s"] = round(wt.seconds, 1)
                row["node_hours"] = round(node_hours(wt.seconds, knobs.nodes), 4)
                row["cost"] = round(_cost(wt.seconds, knobs, fact), 4)
                if fact.start_in_s is not None:
                    row["finish_s"] = round(fact.start_in_s + wt.seconds, 1)
            row["feasible"] = not problems
            row["why"] = "; ".join(problems)
    return rows


def _cost(seconds: float, knobs: Knobs, fact: PartitionFacts) -> float:
    """The row's cost: its GPUs at their kind's price per GPU-hour where the policy prices the kind, else its
    nodes at the partition's node-hour price (:meth:`dlsub.site_config.cost.Prices.hourly`'s rule)."""
    gpus = knobs.gpus * knobs.nodes if fact.node_gpus else 0
    if gpus > 0 and fact.cost_per_gpu_hour is not None:
        return seconds / 3600.0 * gpus * fact.cost_per_gpu_hour
    return cost(seconds, knobs.nodes, fact.cost_per_node_hour)


def where(row: Mapping[str, Any]) -> str:
    """A row's partition, with its kind of GPU where it has one: ``gpu (a100)``."""
    kind = row.get("gpu_type")
    return f"{row['partition']} ({kind})" if kind else str(row["partition"])


def _with_kind(summary: dict[str, Any], row: Mapping[str, Any], key: str = "gpu_type") -> dict[str, Any]:
    if row.get("gpu_type"):
        summary[key] = row["gpu_type"]
    return summary


def _immediate_finish(now_row: dict[str, Any], ideal: dict[str, Any], knobs: Knobs) -> float:
    """Start on ``now_row``'s partition, move to ``ideal``'s when it starts; the finish time."""
    started = float(now_row["start_s"])
    move_at = float(ideal["start_s"])
    done = max(0.0, (move_at - started - float(now_row["overhead_s"])) / float(now_row["step_s"]))
    remaining = float(ideal["steps"]) - done
    if remaining <= 0 or move_at >= float(now_row["finish_s"]):
        return float(now_row["finish_s"])
    return move_at + knobs.restart_s + float(ideal["overhead_s"]) + remaining * float(ideal["step_s"])


def recommend(rows: Sequence[dict[str, Any]], knobs: Knobs) -> dict[str, Any]:
    """Ideal (wait for the best GPU row) against immediate (start now, move later), with their finish times."""
    feasible = [r for r in rows if r["feasible"] and r["finish_s"] is not None]
    if not feasible:
        return {"choice": None, "mode": None,
                "reason": "no row is feasible: " + "; ".join(sorted({r["why"] for r in rows if r["why"]}))}
    gpu_rows = [r for r in feasible if r["role"] == "gpu"] or feasible
    ideal = min(gpu_rows, key=lambda r: (r["finish_s"], r["cost"]))
    result: dict[str, Any] = {
        "ideal": _with_kind({"choice": ideal["choice"], "partition": ideal["partition"],
                             "batch_size": ideal["batch_size"], "start_s": ideal["start_s"],
                             "finish_s": ideal["finish_s"]}, ideal),
        "choice": ideal["choice"], "mode": "ideal",
    }
    now_rows = [r for r in feasible if r["batch_size"] == ideal["batch_size"] and r["start_s"] <= STARTS_NOW_S
                and r["partition"] != ideal["partition"]]
    if ideal["start_s"] <= STARTS_NOW_S or not now_rows:
        result["immediate"] = None
        result["reason"] = (f"{where(ideal)} can start now: nothing to gain by starting elsewhere"
                            if ideal["start_s"] <= STARTS_NOW_S else "no other partition can start it now")
        return result
    best_now = min(now_rows, key=lambda r: _immediate_finish(r, ideal, knobs))
    finish = _immediate_finish(best_now, ideal, knobs)
    immediate = _with_kind({"choice": best_now["choice"], "partition": best_now["partition"],
                            "batch_size": best_now["batch_size"], "start_s": best_now["start_s"],
                            "move_to": ideal["partition"], "finish_s": round(finish, 1)}, best_now)
    result["immediate"] = _with_kind(immediate, ideal, "move_to_gpu_type")
    if finish + knobs.min_saving_s < float(ideal["finish_s"]):
        result.update(choice=best_now["choice"], mode="immediate",
                      reason=f"starting now on {where(best_now)} and moving to {where(ideal)} "
                             f"finishes {float(ideal['finish_s']) - finish:.0f} s earlier than waiting")
    else:
        result["reason"] = f"waiting for {where(ideal)} finishes no later than starting elsewhere now"
    return result
