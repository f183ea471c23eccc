"""Submitting from an estimate, and what an estimate adds to a plan (environment, resources).

``dlsub submit --from-estimate ID --choice N`` takes row N of a saved
estimate: its script, arguments (with the batch-size argument), partition,
GPUs and nodes, the kind of GPU the row was profiled on (asked of Slurm as
``--gres=gpu:KIND:N`` where its GRES names the kind), and, where the user gave none, ``--mem`` and ``--time``
from the profile with a stated safety margin.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from dlsub.contract import ENV_BATCH_SIZE, valid_gpu_type
from dlsub.estimate.recommend import where
from dlsub.job.submit import Plan
from dlsub.slurm_plugins.sbatch import render_sbatch

#: Memory asked for: the predicted peak per node × this, plus a floor for the launcher and runtime.
MEM_MARGIN = 1.25
MEM_FLOOR_MB = 256
#: Time asked for: the predicted walltime of one attempt × this, plus a fixed slack.
TIME_MARGIN = 1.5
TIME_SLACK_MIN = 5


def with_env(plan: Plan, env: dict[str, str]) -> Plan:
    """The plan with more environment for the training container, its batch script rendered again."""
    if not env:
        return plan
    container = dataclasses.replace(plan.batch.container, env=(*plan.batch.container.env, *sorted(env.items())))
    batch = dataclasses.replace(plan.batch, container=container)
    workers = dataclasses.replace(plan.workers, container=container) if plan.workers is not None else None
    return dataclasses.replace(plan, batch=batch, script_text=render_sbatch(batch), workers=workers)


@dataclass(frozen=True)
class FromEstimate:
    """What a row of an estimate sets for ``dlsub submit``."""

    script: str
    args: tuple[str, ...]
    partition: str
    gpus: int
    nodes: int
    image: str | None
    mem_mb: int | None
    time_limit_min: int | None
    env: dict[str, str]
    note: str
    # The kind of GPU to ask Slurm for (the row's, where Slurm's GRES names it); "": any kind.
    gpu_type: str = ""


def from_estimate(estimate: dict[str, Any], choice: int | None) -> FromEstimate:
    """Row ``choice`` (1-based; None: the recommended one) of a saved estimate, as submit options."""
    rows = estimate["rows"]
    if choice is None:
        choice = (estimate.get("recommendation") or {}).get("choice")
        if choice is None:
            raise LookupError(f"estimate {estimate.get('id')} recommends nothing (no row is feasible); "
                              f"pick a row with --choice N")
    if not isinstance(choice, int) or not 1 <= choice <= len(rows):
        raise LookupError(f"--choice {choice}: estimate {estimate.get('id')} has rows 1 to {len(rows)}")
    row = rows[choice - 1]
    if not row.get("feasible"):
        raise LookupError(f"row {choice} ({where(row)}, batch size {row['batch_size']}) is not feasible: "
                          f"{row.get('why') or 'no prediction'}; pick a feasible row")
    bs = int(row["batch_size"])
    args = tuple(str(a) for a in estimate.get("args", []))
    batch_arg = estimate.get("batch_arg", "--batch-size")
    if batch_arg != "none":
        args = (*args, str(batch_arg), str(bs))
    mem = None
    if row.get("memory_mb"):
        mem = int(math.ceil(float(row["memory_mb"]) * MEM_MARGIN)) + MEM_FLOOR_MB
    limit = None
    if row.get("walltime_s"):
        per_attempt = float(row["walltime_s"]) / max(1, int(row.get("attempts") or 1))
        limit = int(math.ceil(per_attempt * TIME_MARGIN / 60.0)) + TIME_SLACK_MIN
        if row.get("max_time_min"):
            limit = min(limit, int(row["max_time_min"]))
    kind = str(row["gpu_type"]) if row.get("gpu_type") and row.get("gpu_type_from") == "gres" else ""
    if kind and valid_gpu_type(kind) is None:
        raise LookupError(f"estimate {estimate.get('id')} row {choice}: GPU type {kind!r} is not a GRES type's "
                          f"name; run `dlsub estimate` again")
    note = (f"from estimate {estimate.get('id')} row {choice}: {where(row)}, batch size {bs}"
            + (f"; on {kind} GPUs (--gres=gpu:{kind}:{int(estimate.get('gpus', 0))}), the kind it was profiled on"
               if kind else "")
            + (f"; --mem {mem}M (predicted {row['memory_mb']} MB × {MEM_MARGIN} + {MEM_FLOOR_MB} MB)" if mem else "")
            + (f"; --time {limit} min (predicted {float(row['walltime_s']):.0f} s × {TIME_MARGIN} + "
               f"{TIME_SLACK_MIN} min)" if limit else ""))
    return FromEstimate(str(estimate["script"]), args, str(row["partition"]), int(estimate.get("gpus", 0)),
                        int(estimate.get("nodes", 1)), estimate.get("image"), mem, limit,
                        {ENV_BATCH_SIZE: str(bs)}, note, kind)


def chosen_row(home: Any, estimate_id: str, choice: int | None) -> FromEstimate:
    """Row ``choice`` of the user's saved estimate ``estimate_id``; SubmitError saying what to do otherwise."""
    from dlsub.estimate.profile_cache import EstimateCache
    from dlsub.job.submit import SubmitError

    try:
        return from_estimate(EstimateCache(home).load_estimate(estimate_id), choice)
    except LookupError as exc:
        raise SubmitError(str(exc).strip("'\"")) from None


def submit_options(row: FromEstimate) -> dict[str, Any]:
    """The `dlsub submit` options the estimate's row sets (by their parameter names); None where it sets none.

    The caller fills only the options the user left unset (the user's own win).
    """
    return {"gpus": row.gpus, "nodes": row.nodes, "partition": row.partition, "image": row.image,
            "mem": f"{row.mem_mb}M" if row.mem_mb else None,
            "time_limit": str(row.time_limit_min) if row.time_limit_min else None}
