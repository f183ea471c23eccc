"""Plain value objects for what Slurm reports; parsed from its JSON (pure)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# Job states in which Slurm will not run the job again.
TERMINAL_SLURM_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"}
)


def _gpus_in(gres: str | None) -> int:
    """GPU count in a GRES string such as ``gpu:4``, ``gpu:a100:2(S:0)`` or ``gres:gpu:2``."""
    total = 0
    for item in (gres or "").split(","):
        parts = item.split("(")[0].split(":")
        if parts and parts[0] == "gres":
            parts = parts[1:]
        if parts and parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
            total += int(parts[-1])
    return total


@dataclass(frozen=True)
class Node:
    name: str
    state: str  # sinfo's lower-case state, e.g. "idle", "mixed", "allocated", "down"
    partitions: tuple[str, ...]
    cpus: int
    alloc_cpus: int
    real_memory_mb: int
    alloc_memory_mb: int
    gpus: int
    gpus_used: int
    state_flags: tuple[str, ...] = ()

    @property
    def usable(self) -> bool:
        """Up and accepting work (not down, drained, failing or not responding)."""
        bad = ("down", "drain", "fail", "unknown", "inval", "not_responding", "no_respond", "future", "maint", "reserved")
        text = " ".join((self.state, *self.state_flags)).lower()
        return not any(b in text for b in bad)

    @property
    def idle_gpus(self) -> int:
        return max(0, self.gpus - self.gpus_used) if self.usable else 0

    @property
    def idle_cpus(self) -> int:
        return max(0, self.cpus - self.alloc_cpus) if self.usable else 0

    @property
    def free_memory_mb(self) -> int:
        return max(0, self.real_memory_mb - self.alloc_memory_mb) if self.usable else 0

    @classmethod
    def from_sinfo(cls, raw: dict[str, Any]) -> "Node":
        return cls(
            name=raw["name"],
            state=str(raw.get("state", "unknown")).lower(),
            partitions=tuple(raw.get("partitions") or ()),
            cpus=int(raw.get("cpus") or 0),
            alloc_cpus=int(raw.get("alloc_cpus") or 0),
            real_memory_mb=int(raw.get("real_memory") or 0),
            alloc_memory_mb=int(raw.get("alloc_memory") or 0),
            gpus=_gpus_in(raw.get("gres")),
            gpus_used=_gpus_in(raw.get("gres_used")),
            state_flags=tuple(str(f).lower() for f in raw.get("state_flags") or ()),
        )


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: tuple[Node, ...]
    max_time_min: int | None  # None: unlimited
    default_time_min: int | None
    default: bool = False
    state: str = "UP"
    max_nodes: int | None = None

    @property
    def up(self) -> bool:
        return self.state.upper() == "UP"

    @property
    def max_gpus_per_node(self) -> int:
        return max((n.gpus for n in self.nodes), default=0)


@dataclass(frozen=True)
class SlurmJob:
    job_id: int
    name: str
    user: str
    state: str  # squeue's upper-case state, e.g. PENDING, RUNNING, COMPLETED
    partition: str
    nodes: str
    comment: str
    restart_count: int
    reason: str
    time_limit_min: int | None
    start_time: int
    submit_time: int
    exit_code: int | None
    gpus_per_node: int = 0
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def dlsub_id(self) -> str | None:
        """The dlsub job this Slurm job is an attempt of (from ``--comment=dlsub:ID[;key=value...]``)."""
        m = re.match(r"^dlsub:([0-9a-f]+)(;|$)", self.comment or "")
        return m.group(1) if m else None

    @property
    def dlsub_tags(self) -> dict[str, str]:
        """The ``key=value`` tags dlsub put after the id in the comment (mode, ideal partition, GPUs)."""
        return parse_comment_tags(self.comment)

    @property
    def held(self) -> bool:
        """Held by a user or an admin (priority 0): it will not start until released."""
        return self.state == "PENDING" and self.reason in ("JobHeldUser", "JobHeldAdmin")

    @property
    def end_time(self) -> int:
        return _epoch(self.extra.get("end_time"))

    @property
    def user_id(self) -> int | None:
        value = self.extra.get("user_id")
        return int(value) if isinstance(value, int) else None

    @property
    def standard_output(self) -> str:
        return str(self.extra.get("standard_output", "") or "")

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_SLURM_STATES

    @classmethod
    def from_sacct(cls, line: str) -> "SlurmJob | None":
        """One ``sacct -P`` line: JobIDRaw|JobName|User|State|Partition|NodeList|ExitCode|Comment."""
        parts = line.split("|")
        if len(parts) < 8 or not parts[0].isdigit():
            return None
        job_id, name, user, state, partition, nodes, exit_code = parts[:7]
        comment = "|".join(parts[7:])  # a comment may itself hold '|'
        code = exit_code.split(":")[0]
        return cls(
            job_id=int(job_id), name=name, user=user,
            state=state.split()[0].upper() if state else "UNKNOWN",  # "CANCELLED by 1001"
            partition=partition, nodes=nodes if nodes != "None assigned" else "", comment=comment,
            restart_count=0, reason="", time_limit_min=None,
            start_time=0, submit_time=0, exit_code=int(code) if code.isdigit() else None,
        )

    @classmethod
    def from_squeue(cls, raw: dict[str, Any]) -> "SlurmJob":
        state = raw.get("job_state", "UNKNOWN")
        if isinstance(state, list):  # Slurm >= 23.02 gives a list of flags
            state = state[0] if state else "UNKNOWN"
        time_limit = raw.get("time_limit")
        if isinstance(time_limit, dict):  # newer Slurm: {"set": .., "infinite": .., "number": ..}
            time_limit = None if time_limit.get("infinite") else time_limit.get("number")
        exit_code = raw.get("exit_code")
        if isinstance(exit_code, dict):
            exit_code = exit_code.get("return_code")
        return cls(
            job_id=int(raw["job_id"]),
            name=raw.get("name", ""),
            user=raw.get("user_name", ""),
            state=str(state).upper(),
            partition=raw.get("partition", ""),
            nodes=raw.get("nodes", "") or "",
            comment=raw.get("comment", "") or "",
            restart_count=int(raw.get("restart_cnt") or 0),
            reason=raw.get("state_reason", "") or "",
            time_limit_min=int(time_limit) if isinstance(time_limit, int) and time_limit > 0 else None,
            start_time=_epoch(raw.get("start_time")),
            submit_time=_epoch(raw.get("submit_time")),
            exit_code=int(exit_code) if isinstance(exit_code, int) else None,
            gpus_per_node=_gpus_in(raw.get("tres_per_node")),
            extra=raw,
        )


COMMENT_TAG = re.compile(r"^[a-z_]+=[A-Za-z0-9._-]*$")


def parse_comment_tags(comment: str) -> dict[str, str]:
    """``dlsub:ID;mode=immediate;ideal=gpu;gpus=1`` -> {"mode": ..., ...}; malformed tags are ignored."""
    parts = (comment or "").split(";")
    if not parts or not parts[0].startswith("dlsub:"):
        return {}
    tags = {}
    for part in parts[1:]:
        if COMMENT_TAG.match(part):
            key, _, value = part.partition("=")
            tags[key] = value
    return tags


def _epoch(value: Any) -> int:
    if isinstance(value, dict):
        value = value.get("number", 0)
    return int(value or 0)


def parse_key_values(line: str) -> dict[str, str]:
    """``scontrol show ... -o`` output (``Key=Value Key2=Value2``) as a dict."""
    out: dict[str, str] = {}
    for token in line.split():
        key, sep, value = token.partition("=")
        if sep:
            out[key] = value
    return out
