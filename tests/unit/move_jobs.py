"""What the move rules' tests share: a job as the planner sees it (policies/actions/move_views.JobInfo), made and
changed by flat field names (each goes to the record of JobInfo that holds it: asked, reported, history)."""

from __future__ import annotations

import dataclasses

from dlsub.policies.actions.move_views import Asked, History, JobInfo, Reported

_RECORDS = {"asked": Asked, "reported": Reported, "history": History}


def _by_record(kw: dict[str, object]) -> tuple[dict[str, object], dict[str, dict[str, object]]]:
    """``kw`` split into JobInfo's own fields and each record's."""
    fields = {name: {f.name for f in dataclasses.fields(record)} for name, record in _RECORDS.items()}
    own: dict[str, object] = {}
    parts: dict[str, dict[str, object]] = {name: {} for name in _RECORDS}
    for key, value in kw.items():
        record = next((name for name, names in fields.items() if key in names), None)
        (own if record is None else parts[record])[key] = value
    return own, parts


def job_info(now: float, **kw: object) -> JobInfo:
    """Alice's immediate-mode job at ``now``: running on cpu for 500 s, wanting one GPU, checkpointed 40 s ago,
    3 h of work left; ``kw`` changes any field."""
    base: dict[str, object] = {
        "dlsub_id": "aaaa0001", "slurm_job_id": 10, "user": "alice", "state": "RUNNING", "reason": "None",
        "ended": False, "partition": "cpu", "mode": "immediate", "ideal_partition": "gpu", "gpus_wanted": 1,
        "gpus_now": 0, "submit_time": now - 600, "start_time": now - 500, "end_time": now + 3600,
        "checkpointable": True, "last_checkpoint_time": now - 40, "eta_s": 3 * 3600.0}
    own, parts = _by_record({**base, **kw})
    records = {name: record(**parts[name]) for name, record in _RECORDS.items()}  # type: ignore[arg-type]
    return JobInfo(**own, **records)  # type: ignore[arg-type]


def changed(job: JobInfo, **kw: object) -> JobInfo:
    """``job`` with these fields replaced, wherever JobInfo holds them."""
    own, parts = _by_record(kw)
    records = {name: dataclasses.replace(getattr(job, name), **values) for name, values in parts.items() if values}
    return dataclasses.replace(job, **own, **records)  # type: ignore[arg-type]
