"""Plain value objects for what Slurm reports; parsed from its JSON (pure)."""

from __future__ import annotations

import grp
import os
import pwd
import re
from dataclasses import dataclass, field
from typing import Any

from dlsub.contract import JobState, StateSource, SubmitRecord, Tags, gpu_type_in_gres, is_held
from dlsub.contract import gpus_in_tres as _gpus_in
from dlsub.hostlist import MAX_HOSTLIST as MAX_HOSTLIST  # re-exported: Slurm's records use them
from dlsub.hostlist import expand_nodes as expand_nodes


@dataclass(frozen=True)
class SlurmNode:
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
    gpu_type: str | None = None  # the one kind its GRES names (gpu:a100:4); None: untyped, or several kinds

    @property
    def usable(self) -> bool:
        """Up and accepting work (not down, drained, failing or not responding)."""
        bad = ("down", "drain", "fail", "unknown", "inval", "not_responding", "no_respond", "future", "maint",
               "reserved")
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
    def from_sinfo(cls, raw: dict[str, Any]) -> SlurmNode:
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
            gpu_type=gpu_type_in_gres(raw.get("gres")),
        )


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: tuple[SlurmNode, ...]
    max_time_min: int | None  # None: unlimited
    default_time_min: int | None
    default: bool = False
    state: str = "UP"
    max_nodes: int | None = None
    # Who may submit to it (AllowGroups, AllowAccounts, DenyAccounts; None: everybody).
    allow_groups: tuple[str, ...] | None = None
    allow_accounts: tuple[str, ...] | None = None
    deny_accounts: tuple[str, ...] = ()

    @property
    def up(self) -> bool:
        return self.state.upper() == "UP"

    @property
    def restricts_accounts(self) -> bool:
        """Whether AllowAccounts or DenyAccounts shuts some account out (only then is a job's account worth
        asking for)."""
        return self.allow_accounts is not None or bool(self.deny_accounts)

    def refuses(self, groups: frozenset[str] | None, account: str | None) -> str | None:
        """Why Slurm would refuse a job of a user in ``groups`` under ``account`` here (None: it takes it).

        Either None: not known, and not checked (Slurm checks at submit and at an update of the job's
        partition). Submit asks it for the user who submits, the agent for the owner of a job it would move.
        """
        if self.allow_groups is not None and groups is not None and not groups & set(self.allow_groups):
            return f"{self.name} is for the groups {', '.join(self.allow_groups)} only (its user is in none of them)"
        if account is not None:
            if self.allow_accounts is not None and account not in self.allow_accounts:
                return f"{self.name} takes the accounts {', '.join(self.allow_accounts)} only (this job's: {account})"
            if account in self.deny_accounts:
                return f"{self.name} refuses account {account}"
        return None

    @property
    def max_gpus_per_node(self) -> int:
        return max((n.gpus for n in self.nodes), default=0)


def user_groups(user: str) -> frozenset[str] | None:
    """The names of ``user``'s groups as this host resolves them (NSS: the same directory slurmctld asks for
    AllowGroups); None when the user is not known here, and then no partition is refused for their groups."""
    try:
        gid = pwd.getpwnam(user).pw_gid
        gids = os.getgrouplist(user, gid)
    except (KeyError, OSError):
        return None
    names = set()
    for g in gids:
        try:
            names.add(grp.getgrgid(g).gr_name)
        except KeyError:
            continue  # a gid without a name: no AllowGroups can name it
    return frozenset(names)


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
    #: Who told: slurmctld (squeue) knows the job's present; sacct's record lags it.
    seen_by: StateSource = StateSource.CONTROLLER

    @property
    def tags(self) -> Tags | None:
        """What the comment says now (public, and its owner may rewrite it: see :attr:`submit_record`)."""
        return Tags.parse(self.comment)

    @property
    def dlsub_id(self) -> str | None:
        """The dlsub job this Slurm job claims to be an attempt of (from its comment)."""
        tags = self.tags
        return tags.dlsub_id if tags else None

    @property
    def submit_record(self) -> SubmitRecord | None:
        """The request as job_submit.lua froze it at submit time (AdminComment; users cannot change it)."""
        return SubmitRecord.parse(str(self.extra.get("admin_comment", "") or ""))

    @property
    def dlsub_state(self) -> JobState:
        return JobState.from_slurm(self.state)

    @property
    def gpu_type_asked(self) -> str | None:
        """The one kind of GPU the job asks for (``gres:gpu:a100:1``), as Slurm holds its request; None: any
        kind, or none."""
        return gpu_type_in_gres(str(self.extra.get("tres_per_node") or ""))

    @property
    def held(self) -> bool:
        """Held by a user or an admin (priority 0): it will not start until released."""
        return is_held(self.state, self.reason)

    @property
    def end_time(self) -> int:
        return int(self.extra.get("end_time") or 0)

    @property
    def user_id(self) -> int | None:
        value = self.extra.get("user_id")
        return value if isinstance(value, int) else None

    @property
    def node_count(self) -> int:
        """Nodes it runs on or asked for (0: Slurm did not say)."""
        return int(self.extra.get("node_count") or 0)

    @property
    def cpus_per_node(self) -> int:
        """CPUs it holds (or asks for) on each of its nodes (0: Slurm did not say)."""
        return int(self.extra.get("cpus") or 0) // max(1, self.node_count)

    @property
    def memory_per_node_mb(self) -> int:
        """Memory it asked for on each node, in MB (0: Slurm did not say, or asked per CPU)."""
        return int(self.extra.get("memory_per_node") or 0)

    @property
    def het_job_id(self) -> int | None:
        """The heterogeneous job it is a component of (None: not a hetjob)."""
        return int(self.extra.get("het_job_id") or 0) or None

    @property
    def array_job_id(self) -> int | None:
        """The job array it is a task of (None: not an array job)."""
        return int(self.extra.get("array_job_id") or 0) or None

    @property
    def array_task_handle(self) -> str | None:
        """``<array>_<task>`` as scontrol and scancel take it: this task, or the first of the
        tasks still pending together in one record (``array_task_string`` ``0-3``)."""
        array = self.array_job_id
        if array is None:
            return None
        task = self.extra.get("array_task_id")
        if task is None:
            m = re.match(r"^\[?(\d+)", str(self.extra.get("array_task_string") or ""))
            task = int(m.group(1)) if m else None
        return f"{array}_{task}" if task is not None else None

    @property
    def standard_output(self) -> str:
        return str(self.extra.get("standard_output", "") or "")

    @property
    def terminal(self) -> bool:
        """Slurm has ended the job (completed, failed, cancelled, timed out, preempted, ...)."""
        return self.dlsub_state.terminal

    @classmethod
    def from_sacct(cls, line: str) -> SlurmJob | None:
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
            seen_by=StateSource.ACCOUNTING,
        )

    @classmethod
    def from_squeue(cls, raw: dict[str, Any]) -> SlurmJob:
        """A job from its flat record, as :meth:`dlsub.slurm_plugins.dialects.Dialect.job` gives it
        for the Slurm version that printed it."""
        time_limit = raw.get("time_limit")
        exit_code = raw.get("exit_code")
        return cls(
            job_id=int(raw["job_id"]),
            name=raw.get("name", ""),
            user=raw.get("user_name", ""),
            state=str(raw.get("job_state", "UNKNOWN")).upper(),
            partition=raw.get("partition", ""),
            nodes=raw.get("nodes", "") or "",
            comment=raw.get("comment", "") or "",
            restart_count=int(raw.get("restart_cnt") or 0),
            reason=raw.get("state_reason", "") or "",
            time_limit_min=time_limit if isinstance(time_limit, int) and time_limit > 0 else None,
            start_time=int(raw.get("start_time") or 0),
            submit_time=int(raw.get("submit_time") or 0),
            exit_code=exit_code if isinstance(exit_code, int) else None,
            gpus_per_node=_gpus_in(raw.get("tres_per_node")),
            extra=raw,
        )


def parse_key_values(line: str) -> dict[str, str]:
    """``scontrol show ... -o`` output (``Key=Value Key2=Value2``) as a dict."""
    out: dict[str, str] = {}
    for token in line.split():
        key, sep, value = token.partition("=")
        if sep:
            out[key] = value
    return out
