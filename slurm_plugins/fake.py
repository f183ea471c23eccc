"""A stateful fake Slurm behind :class:`SlurmClient`'s ``_run`` seam. Unit tests only.

It answers the commands dlsub uses with output shaped like the Slurm version
it is made with (``FakeSlurm(..., version="24.11.5")``; 22.05 by default:
``scontrol --version``, ``sbatch --parsable``, ``squeue --json``, ``sinfo --json``
on 22.05 and ``scontrol show nodes --json`` after,
``scontrol show partition --oneliner``, ``scancel``, ``scontrol requeue`` (and ``requeuehold``),
``scontrol update/hold/release``, ``scontrol ping``; for the batch launcher
``squeue -h -j ID -o %T`` and ``scontrol -o show node NODE``) and keeps jobs in memory
so a test can move them through states with :meth:`FakeSlurm.set_job_state`,
as submitit's MockedSubprocess does.

Like the testbed's job_submit.lua, ``sbatch`` of a job whose comment starts
with ``dlsub:`` freezes its request into AdminComment
(:class:`dlsub.contract.SubmitRecord`); ``job_submit_lua = False`` turns
that off. ``submit_uid``/``submit_user`` say who submits. A benchmark can
add thousands of ready-made ``squeue --json`` records with
:meth:`FakeSlurm.add_raw_jobs`; they are served as given, serialized once.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlsub.contract import COMMENT_PREFIX, SUBMIT_RECORD_PREFIX, gpus_in_tres
from dlsub.slurm_plugins.timespec import parse_slurm_duration


@dataclass
class FakeNode:
    name: str
    partitions: list[str]
    cpus: int = 4
    memory_mb: int = 8000
    gpus: int = 0
    state: str = "idle"
    gpus_used: int = 0
    gpu_type: str = ""  # its GRES names this kind (gpu:a100:4); "": untyped (gpu:4)


@dataclass
class FakePartition:
    name: str
    nodes: list[str]
    max_time: str = "UNLIMITED"
    default_time: str = "01:00:00"
    default: bool = False
    state: str = "UP"
    allow_groups: str = "ALL"
    allow_accounts: str = "ALL"


@dataclass
class FakeJob:
    job_id: int
    script: str
    options: dict[str, str]
    user: str = "tester"
    state: str = "PENDING"
    nodes: str = ""
    restart_cnt: int = 0
    exit_code: int = 0
    signals: list[str] = field(default_factory=list)
    reason: str = "None"
    description: str = ""  # squeue --json's state_description: Slurm's words for the reason, where they differ
    user_id: int = 1000
    start_time: int = 1_700_000_000
    end_time: int = 0
    admin_comment: str = ""
    submit_time: int = 1_700_000_000
    node_count: int = 1
    array_job_id: int | None = None  # a task of a job array (``--array``)
    array_task_id: int | None = None


def testbed_cluster(version: str = "22.05.8") -> FakeSlurm:
    """A fake shaped like the local testbed: cpu (default), gpu, gpu-dev; answering as Slurm ``version``."""
    return FakeSlurm(
        nodes=[
            FakeNode("cpu1", ["cpu"]),
            FakeNode("cpu2", ["cpu"]),
            FakeNode("gpu1", ["gpu", "gpu-dev"], gpus=4),
            FakeNode("gpu2", ["gpu", "gpu-dev"], gpus=4),
        ],
        partitions=[
            FakePartition("cpu", ["cpu1", "cpu2"], default=True),
            FakePartition("gpu", ["gpu1", "gpu2"]),
            FakePartition("gpu-dev", ["gpu1", "gpu2"], max_time="00:10:00", default_time="00:10:00"),
        ],
        version=version,
    )


class FakeSlurm:
    """Call it like ``subprocess.run``: ``FakeSlurm()(argv) -> CompletedProcess``."""

    def __init__(self, nodes: list[FakeNode], partitions: list[FakePartition], version: str = "22.05.8") -> None:
        self.version = version
        self.nodes = {n.name: n for n in nodes}
        self.partitions = {p.name: p for p in partitions}
        self.jobs: dict[int, FakeJob] = {}
        self.history: dict[int, FakeJob] = {}  # purged from squeue, kept by accounting
        self.calls: list[list[str]] = []
        self.reachable = True
        self._next_id = 1000
        self.submit_uid = 1000
        self.submit_user = "tester"
        self.job_submit_lua = True
        # `scontrol show config` and `sacctmgr show user` (dlsub doctor), as the testbed has them.
        self.config = {"JobSubmitPlugins": "lua", "AuthInfo": "cred_expire=10", "GresTypes": "gpu",
                       "SLURM_CONF": "/etc/slurm/slurm.conf", "ProctrackType": "proctrack/cgroup",
                       "TaskPlugin": "task/cgroup,task/affinity", "CgroupPlugin": "cgroup/v1",
                       "ConstrainDevices": "yes", "ConstrainRAMSpace": "yes"}
        self.config_time = "2026-11-24T12:00:00"
        self.admin_levels = {"dlsub": "Operator"}
        # Records from add_raw_jobs, each with its JSON and its squeue line made once.
        self._raw: dict[int, tuple[str, str]] = {}

    # ---------------------------------------------------------------- test API
    def set_job_state(self, job_id: int, state: str, *, nodes: str = "", exit_code: int = 0) -> None:
        job = self.jobs[job_id]
        job.state = state
        job.exit_code = exit_code
        if nodes:
            job.nodes = nodes

    def submitted(self) -> list[FakeJob]:
        return list(self.jobs.values())

    def start(self, job_id: int, node: str, now: int) -> None:
        """The job starts on ``node`` at ``now`` (its partition's time limit counts from there)."""
        job = self.jobs[job_id]
        job.state, job.nodes, job.reason, job.start_time = "RUNNING", node, "None", now
        job.end_time = now + 3600
        self._use(job, +1)

    def requeue_held(self, job_id: int) -> None:
        """What the batch script does after a checkpoint for a move: ``scontrol requeuehold``."""
        job = self.jobs[job_id]
        self._use(job, -1)
        job.state, job.reason, job.nodes = "PENDING", "JobHeldUser", ""
        job.restart_cnt += 1

    def requeue_self(self, job_id: int) -> None:
        """What the batch script does after exit 85: ``scontrol requeue``; Slurm then holds it back (BeginTime)."""
        job = self.jobs[job_id]
        self._use(job, -1)
        job.state, job.reason, job.nodes = "PENDING", "BeginTime", ""
        job.restart_cnt += 1

    def launch_fails(self, job_id: int) -> None:
        """Slurm could not launch the job's batch script (a node back from a cut link still held its previous
        attempt: "Duplicate jobid"): it requeues the job held (scontrol: Reason=launch_failed_requeued_held)."""
        job = self.jobs[job_id]
        if job.state == "RUNNING":
            self._use(job, -1)
        # As 24.11 prints it: a user's hold in state_reason, the launch failure in state_description.
        job.state, job.reason, job.description, job.nodes = "PENDING", "JobHeldUser", "launch failed requeued held", ""
        job.restart_cnt += 1

    def admin_hold(self, job_id: int) -> None:
        """An administrator holds the job (``scontrol hold`` as root): Reason=JobHeldAdmin."""
        self.jobs[job_id].reason = "JobHeldAdmin"

    def add_raw_jobs(self, records: list[dict[str, Any]]) -> None:
        """Serve these ``squeue --json`` job records (22.05's flat shape, turned into this version's) as they
        are: a big cluster, for benchmarks."""
        for r in records:
            shaped = _data_parser_job({"exit_code": 0, **r}) if self._data_parser else r
            self._raw[int(r["job_id"])] = (json.dumps(shaped, separators=(",", ":")), self._queue_line(r))

    def _use(self, job: FakeJob, sign: int) -> None:
        node = self.nodes.get(job.nodes)
        gres = job.options.get("gres", "")
        if node is not None and gres.startswith("gpu:"):
            node.gpus_used += sign * gpus_in_tres(gres)

    # ---------------------------------------------------------------- dispatch
    def __call__(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        argv = list(argv)
        self.calls.append(argv)
        if not self.reachable:
            return self._done(argv, 1, "", f"{argv[0]}: error: Unable to contact slurm controller (connect failure)")
        handler = {
            "sbatch": self._sbatch,
            "squeue": self._squeue,
            "sinfo": self._sinfo,
            "sacctmgr": self._sacctmgr,
            "scancel": self._scancel,
            "scontrol": self._scontrol,
            "sacct": self._sacct,
        }.get(argv[0])
        if handler is None:
            return self._done(argv, 127, "", f"{argv[0]}: command not found")
        return handler(argv)

    @staticmethod
    def _done(argv: list[str], rc: int, out: str, err: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, rc, out, err)

    # ---------------------------------------------------------------- commands
    def _sbatch(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        script_path = argv[-1]
        try:
            text = Path(script_path).read_text()
        except OSError as exc:
            return self._done(argv, 1, "", f"sbatch: error: Unable to open file {script_path}: {exc}")
        options = dict(re.findall(r"^#SBATCH --([\w-]+)=(.*)$", text, flags=re.MULTILINE))
        partition = options.get("partition") or next(p.name for p in self.partitions.values() if p.default)
        if partition not in self.partitions:
            return self._done(argv, 1, "", "sbatch: error: invalid partition specified: " + partition)
        requested = options.get("partition", "")
        options["partition"] = partition
        kind = re.fullmatch(r"gpu:([^:]+):\d+", options.get("gres", ""))
        if kind is not None and not any(self.nodes[n].gpu_type == kind.group(1)
                                        for n in self.partitions[partition].nodes if n in self.nodes):
            # Slurm refuses a GRES type no node of the partition has.
            return self._done(argv, 1, "", "sbatch: error: Batch job submission failed: Invalid generic resource "
                                           "(gres) specification")
        if "--test-only" in argv:
            return self._done(argv, 0, "", "sbatch: Job 0 to start at 2026-01-01T00:00:00 using 1 processors on nodes "
                              f"{self.partitions[partition].nodes[0]} in partition {partition}")
        self._next_id += 1
        job = FakeJob(self._next_id, script_path, options, user=self.submit_user, user_id=self.submit_uid,
                      submit_time=1_700_000_000 + self._next_id)
        comment = options.get("comment", "")
        if self.job_submit_lua and comment.startswith(COMMENT_PREFIX):
            minutes = parse_slurm_duration(options["time"]) if options.get("time") else None
            gres = options.get("gres", "")
            job.admin_comment = (f"{SUBMIT_RECORD_PREFIX}uid={job.user_id};partition={requested};"
                                 f"time={minutes if minutes is not None else ''};"
                                 f"tres={'gres:' + gres if gres else ''}|{comment}")
        if "hold" in re.findall(r"^#SBATCH --(hold)$", text, flags=re.MULTILINE):
            job.reason = "JobHeldUser"
        array = re.search(r"^\d+-(\d+)$", options.get("array", ""))
        if array is None:
            self.jobs[self._next_id] = job
            return self._done(argv, 0, f"{self._next_id}\n")
        # One record per task (Slurm splits them as they start; the fake has them apart from the start).
        first = self._next_id
        for task in range(int(array.group(1)) + 1):
            if task:
                self._next_id += 1
            self.jobs[self._next_id] = FakeJob(
                self._next_id, script_path, dict(options), user=job.user, user_id=job.user_id, reason=job.reason,
                submit_time=job.submit_time, admin_comment=job.admin_comment, array_job_id=first,
                array_task_id=task)
        return self._done(argv, 0, f"{first}\n")

    def task(self, handle: str) -> FakeJob:
        """An array task by ``<array>_<task>``."""
        array, task = (int(x) for x in handle.split("_"))
        return next(j for j in self.jobs.values() if j.array_job_id == array and j.array_task_id == task)

    def _matching(self, handle: str) -> list[FakeJob]:
        """The jobs a job id or ``<array>_<task>`` names (an array's id names all its tasks)."""
        if "_" in handle:
            try:
                return [self.task(handle)]
            except (StopIteration, ValueError):
                return []
        job_id = int(handle)
        tasks = [j for j in self.jobs.values() if j.array_job_id == job_id]
        return tasks or ([self.jobs[job_id]] if job_id in self.jobs else [])

    def _job_json(self, job: FakeJob) -> dict[str, Any]:
        gres = job.options.get("gres", "")
        return {
            "job_id": job.job_id,
            "name": job.options.get("job-name", "fake"),
            "user_name": job.user,
            "job_state": job.state,
            "partition": job.options.get("partition", ""),
            "nodes": job.nodes,
            "comment": job.options.get("comment", ""),
            "restart_cnt": job.restart_cnt,
            "state_reason": job.reason,
            **({"state_description": job.description} if job.description else {}),
            "user_id": job.user_id,
            "standard_output": job.options.get("output", ""),
            "end_time": job.end_time,
            "time_limit": _minutes(job.options.get("time", "")),
            "start_time": job.start_time,
            "submit_time": job.submit_time,
            "exit_code": job.exit_code << 8,  # 22.05 prints the wait status
            "tres_per_node": f"gres:{gres}" if gres else "",
            "admin_comment": job.admin_comment,
            "node_count": job.node_count,
            "array_job_id": job.array_job_id or 0,
            "array_task_id": job.array_task_id,
            "array_task_string": "",
        }

    def _queue_line(self, flat: dict[str, Any]) -> str:
        """A 22.05-shaped record as ``squeue --format=QUEUE_FORMAT`` prints it on this version."""
        task = flat.get("array_task_id")
        array = int(flat.get("array_job_id") or 0)
        gres = str(flat.get("tres_per_node") or "")
        if self._data_parser:
            gres = gres.replace("gres:", "gres/", 1)
        submitted = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(int(flat.get("submit_time") or 0)))
        return "|".join(str(v) for v in (
            flat["job_id"], array or flat["job_id"], task if array and task is not None else "N/A",
            # %r prints Slurm's words for the reason where it has them (a failed launch's), else the reason.
            flat.get("user_id", 0), flat.get("job_state", "PENDING"),
            flat.get("state_description") or flat.get("state_reason") or "None",
            flat.get("partition", ""), flat.get("node_count") or 1, gres or "N/A", submitted))

    def _squeue(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        if argv[1:3] == ["-h", "-j"] and argv[4:] == ["-o", "%T"]:  # one job's state (the batch launcher's)
            found = self._matching(argv[3])
            if not found:
                return self._invalid(argv, argv[3])
            return self._done(argv, 0, "".join(f"{j.state}\n" for j in found))
        jobs = list(self.jobs.values())
        raw = list(self._raw.values())
        if "--json" in argv and not self._data_parser:
            # 22.05's squeue --json prints every job, whatever --jobs and --user say.
            argv = [a for i, a in enumerate(argv) if a not in ("--jobs", "--user")
                    and (i == 0 or argv[i - 1] not in ("--jobs", "--user"))]
        if "--jobs" in argv:
            wanted = {int(x) for x in argv[argv.index("--jobs") + 1].split(",")}
            unknown = wanted - set(self.jobs) - set(self._raw)
            if unknown:
                return self._done(argv, 1, "", "slurm_load_jobs error: Invalid job id specified")
            jobs = [j for j in jobs if j.job_id in wanted or j.array_job_id in wanted]
            raw = [self._raw[i] for i in sorted(wanted) if i in self._raw]
        if "--user" in argv:
            user = argv[argv.index("--user") + 1]
            jobs = [j for j in jobs if j.user == user]
            raw = []
        if any(a.startswith("--format=") for a in argv):
            lines = [line for _, line in raw] + [self._queue_line(self._job_json(j)) for j in jobs]
            return self._done(argv, 0, "".join(f"{line}\n" for line in lines))
        if self._data_parser:
            # 23.02 on: squeue's default state filter applies to --json as well.
            if "--states=all" not in argv:
                jobs = [j for j in jobs if j.state in ("PENDING", "RUNNING", "REQUEUED", "SUSPENDED", "COMPLETING")]
            own = ",".join(json.dumps(_data_parser_job(self._job_json(j))) for j in jobs)
        else:
            own = ",".join(json.dumps(self._job_json(j)) for j in jobs)
        body = ",".join(t for t in (",".join(text for text, _ in raw), own) if t)
        return self._done(argv, 0, '{"meta": {}, "errors": [], "jobs": [' + body + "]}")

    def purge(self, job_id: int) -> None:
        """Slurm forgets a finished job (MinJobAge); only accounting still has it."""
        self.history[job_id] = self.jobs.pop(job_id)

    def _sacct(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        wanted = {int(x) for x in argv[argv.index("-j") + 1].split(",")}
        lines = [
            "|".join([str(j.job_id), j.options.get("job-name", "fake"), j.user, j.state,
                      j.options.get("partition", ""), j.nodes or "None assigned", f"{j.exit_code}:0",
                      j.options.get("comment", "")])
            for j in {**self.jobs, **self.history}.values() if j.job_id in wanted
        ]
        return self._done(argv, 0, "".join(line + "\n" for line in lines))

    @property
    def _data_parser(self) -> bool:
        """Slurm 23.02 and later print the data_parser shapes (see dialects.py)."""
        major, minor = (int(x) for x in self.version.split(".")[:2])
        return (major, minor) >= (23, 2)

    def _sinfo(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        if self._data_parser:
            return self._done(argv, 1, "", "sinfo: the fake prints grouped --json only as 22.05 did; "
                              "dlsub reads scontrol show nodes --json on this version")
        return self._done(argv, 0, json.dumps({"meta": {}, "errors": [], "nodes": self._node_records()}))

    def _node_records(self) -> list[dict[str, Any]]:
        nodes: list[dict[str, Any]] = [
            {
                "name": n.name,
                "state": n.state,
                "state_flags": [],
                "partitions": n.partitions,
                "cpus": n.cpus,
                "alloc_cpus": 0,
                "real_memory": n.memory_mb,
                "alloc_memory": 0,
                "gres": (f"gpu:{n.gpu_type}:{n.gpus}" if n.gpu_type else f"gpu:{n.gpus}") if n.gpus else "",
                "gres_used": f"gpu:{n.gpu_type}:{n.gpus_used}" if n.gpu_type else f"gpu:{n.gpus_used}",
            }
            for n in self.nodes.values()
        ]
        if self._data_parser:
            for node in nodes:
                flags: list[str] = node.pop("state_flags")
                node["state"] = [str(node["state"]).upper(), *(f.upper() for f in flags)]
        return nodes

    def _sacctmgr(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        user = argv[argv.index("user") + 1]
        level = self.admin_levels.get(user)
        return self._done(argv, 0, f"{user}|{level}\n" if level is not None else "")

    def _invalid(self, argv: list[str], job_id: str) -> subprocess.CompletedProcess[str]:
        return self._done(argv, 1, "", f"{argv[0]}: error: Invalid job id specified ({job_id})")

    def _scancel(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        jobs = self._matching(argv[-1])
        if not jobs:
            return self._done(argv, 1, "",
                              f"scancel: error: Kill job error on job id {argv[-1]}: Invalid job id specified")
        signal = next((a.split("=", 1)[1] for a in argv if a.startswith("--signal=")), None)
        for job in jobs:
            if signal:
                job.signals.append(signal)
            elif job.state not in ("COMPLETED", "FAILED", "CANCELLED"):
                if job.state == "RUNNING":
                    self._use(job, -1)
                job.state = "CANCELLED"
        return self._done(argv, 0, "")

    def _scontrol(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        if argv[1:3] == ["show", "config"]:
            lines = [f"Configuration data as of {self.config_time}",
                     *(f"{k:<24}= {v}" for k, v in self.config.items()), f"{'SLURM_VERSION':<24}= {self.version}"]
            return self._done(argv, 0, "\n".join(lines) + "\n")
        if argv[1:2] == ["--version"]:
            return self._done(argv, 0, f"slurm-wlm {self.version}\n")
        if argv[1:4] == ["show", "nodes", "--json"] and self._data_parser:
            return self._done(argv, 0, json.dumps({"meta": {}, "errors": [], "nodes": self._node_records()}))
        if argv[1:4] == ["-o", "show", "node"]:
            node = self.nodes.get(argv[4])
            if node is None:
                return self._done(argv, 1, "", f"Node {argv[4]} not found")
            kind = f"{node.gpu_type}:" if node.gpu_type else ""
            gres = f"gpu:{kind}{node.gpus}(S:0)" if node.gpus else "(null)"
            return self._done(argv, 0, f"NodeName={node.name} Arch=x86_64 CPUTot={node.cpus} Gres={gres} "
                                       f"State={node.state.upper()} Partitions={','.join(node.partitions)}\n")
        if argv[1:2] == ["ping"]:
            return self._done(argv, 0, "Slurmctld(primary) at localhost is UP\n")
        if argv[1:3] == ["show", "partition"]:
            lines = []
            for p in self.partitions.values():
                lines.append(
                    f"PartitionName={p.name} AllowGroups={p.allow_groups} AllowAccounts={p.allow_accounts} "
                    f"Default={'YES' if p.default else 'NO'} DefaultTime={p.default_time} "
                    f"MaxNodes=UNLIMITED MaxTime={p.max_time} Nodes={','.join(p.nodes)} State={p.state}"
                )
            return self._done(argv, 0, "\n".join(lines) + "\n")
        if argv[1:2] in (["requeue"], ["requeuehold"], ["release"], ["hold"]) and not self._matching(argv[2]):
            return self._invalid(argv, argv[2])
        if argv[1:2] == ["requeue"]:
            for job in self._matching(argv[2]):
                job.state = "PENDING"
                job.restart_cnt += 1
            return self._done(argv, 0, "")
        if argv[1:2] == ["requeuehold"]:
            jobs = self._matching(argv[2])
            for job in jobs:
                if job.state != "RUNNING":
                    return self._done(argv, 1, "", f"Requeue of JobId={job.job_id} failed: Job is pending execution")
            for job in jobs:
                self.requeue_held(job.job_id)
            return self._done(argv, 0, "")
        if argv[1:2] == ["update"]:
            fields = dict(a.split("=", 1) for a in argv[2:])
            job_id = fields.pop("jobid")
            found = self._matching(job_id)
            if len(found) != 1:
                return self._invalid(argv, job_id)
            job = found[0]
            if "AdminComment" in fields:
                return self._done(argv, 1, "", "scontrol: error: Access/permission denied")
            if "Comment" in fields:
                job.options["comment"] = fields["Comment"]
            if "TimeLimit" in fields:
                job.options["time"] = fields["TimeLimit"]
            if "Partition" in fields:
                if job.state != "PENDING":
                    return self._done(argv, 1, "", "scontrol: error: Job is no longer pending execution")
                job.options["partition"] = fields["Partition"]
            if "ReqNodeList" in fields:
                if job.state != "PENDING":
                    return self._done(argv, 1, "", "scontrol: error: Job is no longer pending execution")
                job.options["nodelist"] = fields["ReqNodeList"]
            if "TresPerNode" in fields:
                value = fields["TresPerNode"]
                job.options["gres"] = value.removeprefix("gres:") if value else ""
            return self._done(argv, 0, "")
        if argv[1:2] in (["release"], ["hold"]):
            for job in self._matching(argv[2]):
                job.reason = "None" if argv[1] == "release" else "JobHeldUser"
                job.description = ""
            return self._done(argv, 0, "")
        return self._done(argv, 1, "", f"scontrol: error: fake does not know {' '.join(argv[1:])}")


def _minutes(text: str) -> int:
    """A job's time limit in minutes as squeue --json gives it (60 when none was asked for)."""
    minutes = parse_slurm_duration(text) if text else None
    return minutes if minutes is not None else 60


#: squeue fields that data_parser (23.02 on) prints as {"set", "infinite", "number"}.
_WRAPPED = ("time_limit", "start_time", "submit_time", "end_time", "node_count", "cpus", "memory_per_node",
            "array_job_id", "array_task_id", "het_job_id", "het_job_offset")


def _data_parser_job(flat: dict[str, Any]) -> dict[str, Any]:
    """A 22.05-shaped squeue record in the shape Slurm 23.02 and later print (as recorded on 24.11)."""
    out = dict(flat)
    for key in _WRAPPED:
        value = flat.get(key)
        out[key] = {"set": value is not None, "infinite": False, "number": int(value or 0)}
    out["job_state"] = [flat["job_state"]]
    out["exit_code"] = {"status": ["ERROR" if flat["exit_code"] else "SUCCESS"],
                        "return_code": {"set": True, "infinite": False, "number": int(flat["exit_code"]) >> 8},
                        "signal": {"id": {"set": False, "infinite": False, "number": 0}, "name": ""}}
    out["tres_per_node"] = str(flat.get("tres_per_node") or "").replace("gres:", "gres/", 1)
    return out
