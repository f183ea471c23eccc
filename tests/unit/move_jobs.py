"""What the move rules' tests share: a job as the planner sees it (policies/actions/move_views.JobInfo)."""

from __future__ import annotations

from dlsub.policies.actions.move_views import JobInfo


def job_info(now: float, **kw: object) -> JobInfo:
    """Alice's immediate-mode job at ``now``: running on cpu for 500 s, wanting one GPU, checkpointed 40 s ago,
    3 h of work left; ``kw`` changes any field."""
    base: dict[str, object] = {
        "dlsub_id": "aaaa0001", "slurm_job_id": 10, "user": "alice", "state": "RUNNING", "reason": "None",
        "ended": False, "partition": "cpu", "mode": "immediate", "ideal_partition": "gpu", "gpus_wanted": 1,
        "gpus_now": 0, "submit_time": now - 600, "start_time": now - 500, "end_time": now + 3600,
        "checkpointable": True, "last_checkpoint_time": now - 40, "eta_s": 3 * 3600.0}
    return JobInfo(**{**base, **kw})  # type: ignore[arg-type]
