"""What the agent keeps about one job it follows: the ``data`` column of its store's ``jobs`` table.

:class:`JobData` is that column as a typed record, read and written here
only (:meth:`JobData.from_json`, :meth:`JobData.to_json`): the request the
agent trusts (:class:`TrustedRequest`), where reading the job's files
stopped and what they summed up to, what it last said about the job, and
what its moves changed. The JSON is the one earlier versions wrote (the same
keys, a request in the same shape), so a store written by them loads as it
is; a field at its empty value is left out, as those versions left the key
out until it had something to say.

Writers replace a field's value, never change it in place: a shallow copy
(:meth:`JobData.copy`) taken before a tick's changes tells whether the row
must be written.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from dlsub.contract import valid_application, valid_gpu_type
from dlsub.job_progress import AttemptsSummary, ProgressSummary
from dlsub.jobdir import Cursor


@dataclass(frozen=True)
class TrustedRequest:
    """What a dlsub job asked for, as the agent trusts it: from its submit record (``source`` "record"),
    else the tags first seen (``source`` "comment"), frozen in its row (:attr:`JobData.request`).

    A store migrated from the schema keyed by dlsub id holds requests of ``source`` "migrated" with no
    dlsub id: only their partition and time limit are used, until the job is seen again."""

    source: str
    dlsub_id: str
    mode: str | None
    ideal: str | None
    gpus: int | None
    partition: str | None
    time_limit_min: int | None
    role: str = "main"  # "main", or "worker" for an elastic job's worker task
    # An elastic job's (min, max) members: the main job's nodes, then its workers, each one node (--nodes
    # MIN:MAX) or one task of ``step`` GPUs (--gpus MIN:MAX). Stored under "nodes", the tag's name.
    members: tuple[int, int] | None = None
    step: int = 0  # GPUs of each worker of a job elastic in GPUs (0: whole nodes)
    plain: bool = False  # submit tagged its script as one that uses no dlsub library (Tags.plain)
    application: str | None = None  # the command it trains, as submit named it (Tags.application)
    # The one kind of GPU it asked for itself (SubmitRecord.gpu_type; where it has no record, the kind Slurm's
    # request named when the agent first saw it): the agent never changes a kind its user chose.
    gpu_type: str | None = None
    pinned: bool = False  # its user named its partition (Tags.pinned): an elastic job stays on it while it waits

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrustedRequest:
        """A request as :meth:`to_dict` wrote it (or a migrated one, without a dlsub id)."""
        members = d.get("nodes")
        return cls(str(d.get("source") or ""), str(d.get("dlsub_id") or ""), d.get("mode"), d.get("ideal"),
                   d.get("gpus"), d.get("partition"), d.get("time_limit_min"), d.get("role", "main"),
                   (int(members[0]), int(members[1])) if members else None, int(d.get("step") or 0),
                   d.get("plain") is True, valid_application(d.get("application")), valid_gpu_type(d.get("gpu_type")),
                   d.get("pinned") is True)

    def to_dict(self) -> dict[str, Any]:
        """As the row keeps it (JSON)."""
        return {"source": self.source, "dlsub_id": self.dlsub_id, "mode": self.mode, "ideal": self.ideal,
                "gpus": self.gpus, "partition": self.partition, "time_limit_min": self.time_limit_min,
                "role": self.role, "nodes": list(self.members) if self.members else None, "step": self.step,
                # Only when set: a request stored before the tag existed is written back as it was.
                **({"plain": True} if self.plain else {}),
                **({"application": self.application} if self.application else {}),
                **({"gpu_type": self.gpu_type} if self.gpu_type else {}),
                **({"pinned": True} if self.pinned else {})}

    @property
    def elastic_main(self) -> bool:
        """The main job of an elastic job (its workers are planned with it)."""
        return bool(self.members) and self.role == "main"


@dataclass
class JobData:
    """What the agent keeps about one Slurm job it follows, beyond its state (one row of ``jobs``)."""

    request: TrustedRequest | None = None  # frozen at first sight; None: not yet
    ignored: bool = False  # it claims another user's dlsub id: never acted on, its files never read
    first_note: str | None = None  # why its request is trusted as it is, to record once it is observed
    # Where its job directory is, fixed at first sight (``job_dir_fixed``); None then: Slurm's record
    # names none the agent may read.
    job_dir: str | None = None
    job_dir_fixed: bool = False
    files: dict[str, Cursor | None] = field(default_factory=dict)  # where reading each file stopped
    progress: ProgressSummary | None = None  # its progress file folded so far (None: never read)
    attempts: AttemptsSummary | None = None  # its attempt file folded so far (None: never read)
    said: dict[str, str] = field(default_factory=dict)  # the last reason recorded in each slot (see ``once``)
    last_note: str | None = None  # the last reason it was told to wait
    partition: str | None = None  # where Slurm last showed it
    attempt_seen: int | None = None  # Slurm's restart count of the last attempt recorded running
    sample: tuple[int | None, int | None, int] | None = None  # the last progress sample: step, checkpoint step, count
    continuations: int = 0  # how often it was continued past its time limit
    launch_releases: int = 0  # how often it was released after Slurm held it for a failed launch
    backfilled_from: str | None = None  # the partition it left for a backfill window (None: not backfilled)
    backfilled_limit_min: int | None = None  # its own time limit there

    def copy(self) -> JobData:
        """A shallow copy (fields are replaced, never changed in place)."""
        return dataclasses.replace(self)

    def progress_summary(self) -> ProgressSummary:
        """A summary to fold new events into, apart from the one kept."""
        return ProgressSummary.from_dict(self.progress.to_dict() if self.progress is not None else None)

    def attempts_summary(self, slurm_job_id: int) -> AttemptsSummary:
        """A summary of ``slurm_job_id``'s attempts to fold new events into (afresh if the one kept is of
        another job that had its id)."""
        return AttemptsSummary.from_dict(self.attempts.to_dict() if self.attempts is not None else None,
                                         slurm_job_id)

    # ---------------------------------------------------------------- the one serialization
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.request is not None:
            out["request"] = self.request.to_dict()
        if self.ignored:
            out["ignored"] = True
        if self.first_note is not None:
            out["first_note"] = self.first_note
        if self.job_dir_fixed:
            out["job_dir"] = self.job_dir
        if self.files:
            out["files"] = {name: c.to_dict() if c is not None else None for name, c in self.files.items()}
        if self.progress is not None:
            out["progress"] = self.progress.to_dict()
        if self.attempts is not None:
            out["attempts"] = self.attempts.to_dict()
        if self.said:
            out["said"] = dict(self.said)
        for name in ("last_note", "partition", "attempt_seen", "backfilled_from", "backfilled_limit_min"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.sample is not None:
            out["sample"] = list(self.sample)
        if self.continuations:
            out["continuations"] = self.continuations
        if self.launch_releases:
            out["launch_releases"] = self.launch_releases
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JobData:
        """The record a row keeps; a value of the wrong type reads as the field's empty value (the store is
        the agent's own, so only a damaged file has one), and keys no field names are passed over."""
        request = d.get("request")
        files = d.get("files")
        said = d.get("said")
        sample = d.get("sample")
        progress, attempts = d.get("progress"), d.get("attempts")
        return cls(
            request=_request(request),
            ignored=bool(d.get("ignored")),
            first_note=_str(d.get("first_note")),
            job_dir=_str(d.get("job_dir")) or None, job_dir_fixed="job_dir" in d,
            files={str(k): Cursor.from_dict(v) for k, v in files.items()} if isinstance(files, dict) else {},
            progress=ProgressSummary.from_dict(progress) if isinstance(progress, dict) else None,
            attempts=(AttemptsSummary.from_dict(attempts, _int(attempts.get("slurm_job_id")) or 0)
                      if isinstance(attempts, dict) else None),
            said={str(k): str(v) for k, v in said.items()} if isinstance(said, dict) else {},
            last_note=_str(d.get("last_note")),
            partition=_str(d.get("partition")),
            attempt_seen=_int(d.get("attempt_seen")),
            sample=(_int(sample[0]), _int(sample[1]), _int(sample[2]) or 0)
            if isinstance(sample, list) and len(sample) == 3 else None,
            continuations=_int(d.get("continuations")) or 0,
            launch_releases=_int(d.get("launch_releases")) or 0,
            backfilled_from=_str(d.get("backfilled_from")),
            backfilled_limit_min=_int(d.get("backfilled_limit_min")),
        )

    @classmethod
    def from_json(cls, text: str | None) -> JobData:
        """A row's ``data`` column; one that does not parse reads as empty."""
        try:
            raw = json.loads(text or "{}")
        except ValueError:
            raw = {}
        return cls.from_dict(raw if isinstance(raw, dict) else {})


def _request(raw: Any) -> TrustedRequest | None:
    if not isinstance(raw, dict):
        return None
    try:
        return TrustedRequest.from_dict(raw)
    except (TypeError, ValueError, IndexError):
        return None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


__all__ = ["JobData", "TrustedRequest"]
