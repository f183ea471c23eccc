"""The one Slurm client: Slurm's CLI with ``--json``, behind a single ``_run`` seam.

Every call to Slurm goes through :meth:`SlurmClient._run` with an argv list
(never a shell). Failures raise :class:`SlurmError` carrying the argv, exit
code, stdout, stderr and what to do next. Unit tests replace the runner with
:class:`dlsub.slurm_plugins.fake.FakeSlurm`; integration tests use the live
local cluster.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlsub.contract import valid_gpu_type, valid_partition
from dlsub.slurm_plugins.dialects import QUEUE_FORMAT, Dialect, SlurmParseError, SlurmVersion, dialect_for
from dlsub.slurm_plugins.models import Partition, SlurmJob, SlurmNode, parse_key_values
from dlsub.slurm_plugins.timespec import parse_slurm_duration
from dlsub.slurm_plugins.usage import SACCT_FORMAT, UsageRecord

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]

_UNREACHABLE_MARKERS = (
    "Unable to contact slurm controller",
    "Socket timed out",
    "Connection refused",
    "Zero Bytes were transmitted",
    "Slurm backup controller in standby mode",
    "Couldn't find the specified plugin name for auth/munge",
    "Munge encode failed",
)


class SlurmError(RuntimeError):
    """A Slurm command failed. Carries everything needed to see why."""

    def __init__(self, argv: Sequence[str], returncode: int, stdout: str, stderr: str, hint: str = "") -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        self.hint = hint
        detail = (stderr or stdout).strip() or "(no output)"
        message = f"{' '.join(self.argv)} exited with {returncode}: {detail}"
        if hint:
            message += f"\n{hint}"
        super().__init__(message)


class SlurmUnreachable(SlurmError):
    """slurmctld did not answer (down, wrong host, or munge broken)."""


_HANDLE = re.compile(r"^\d+(_\d+)?\Z")


#: A node name as Slurm prints it (what ``point_at_node`` puts on a command line).
_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")


def _job_handle(job: int | str) -> str:
    """A job id (``123``) or array task (``123_4``), checked: it goes on a command line."""
    text = str(int(job)) if isinstance(job, int) else str(job)
    if not _HANDLE.match(text):
        raise ValueError(f"{text!r} is not a Slurm job id or array task")
    return text


def _default_runner(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    # Our parsers read Slurm's own formats; keep them stable.
    env.pop("SQUEUE_FORMAT", None)
    env.pop("SQUEUE_FORMAT2", None)
    env.pop("SINFO_FORMAT", None)
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, env=env, timeout=120, check=False)
    except FileNotFoundError:
        return subprocess.CompletedProcess(
            list(argv), 127, "", f"{argv[0]}: command not found (are Slurm's client tools installed and on PATH?)"
        )
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(list(argv), 124, "", f"timed out after {exc.timeout} s")



def _names_or_all(value: str) -> tuple[str, ...] | None:
    """A partition's comma list of groups or accounts as scontrol prints it; None: ALL (or unset, which is ALL)."""
    names = tuple(n for n in value.split(",") if n and n != "(null)")
    return None if not names or names == ("ALL",) else names

class SlurmClient:
    """Slurm through its command-line tools. One instance per process is plenty."""

    def __init__(self, runner: Runner | None = None) -> None:
        self._runner: Runner = runner or _default_runner
        self._dialect: Dialect | None = None

    # ------------------------------------------------------------------ seam
    def _run(self, argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = self._runner(argv)
        if check and result.returncode != 0:
            text = f"{result.stdout}\n{result.stderr}"
            if result.returncode == 127 or any(m in text for m in _UNREACHABLE_MARKERS):
                raise SlurmUnreachable(
                    argv,
                    result.returncode,
                    result.stdout,
                    result.stderr,
                    hint="Slurm's controller (slurmctld) could not be reached: check `scontrol ping` and "
                    "`sinfo`; on the local testbed run `sudo make testbed`.",
                )
            raise SlurmError(argv, result.returncode, result.stdout, result.stderr)
        return result

    def _json(self, argv: Sequence[str]) -> dict[str, Any]:
        result = self._run(argv)
        try:
            data = json.loads(result.stdout)
        except json.JSONDecodeError as exc:
            raise SlurmError(argv, result.returncode, result.stdout, result.stderr,
                             hint=f"output is not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise SlurmError(argv, result.returncode, result.stdout, result.stderr, hint="output is not a JSON object")
        errors = [e for e in data.get("errors") or [] if e]
        if errors:
            raise SlurmError(argv, result.returncode, result.stdout, json.dumps(errors))
        return data

    # ------------------------------------------------------------------ version
    def version(self) -> SlurmVersion:
        """The Slurm version its clients report (``scontrol --version``), asked once."""
        return self.dialect().version

    def dialect(self) -> Dialect:
        """How this Slurm's commands and JSON are read: chosen by the version it reports."""
        if self._dialect is None:
            argv = ["scontrol", "--version"]
            result = self._run(argv)
            try:
                version = SlurmVersion.parse(result.stdout)
            except ValueError as exc:
                raise SlurmError(argv, result.returncode, result.stdout, result.stderr, hint=str(exc)) from exc
            self._dialect = dialect_for(version)
        return self._dialect

    def _records(self, argv: Sequence[str], key: str) -> list[dict[str, Any]]:
        """The list under ``key`` in a command's JSON output."""
        records = self._json(argv).get(key) or []
        if not isinstance(records, list):
            raise SlurmError(argv, 0, "", "", hint=f"Slurm {self.version()}: {key!r} is not a list")
        return records

    def _parsed(self, argv: Sequence[str], parse: Callable[[Any], Any], raw: Any) -> Any:
        try:
            return parse(raw)
        except SlurmParseError as exc:
            raise SlurmError(argv, 0, "", "", hint=str(exc)) from exc

    # ------------------------------------------------------------------ reads
    def config(self) -> SlurmConfig:
        """slurmctld's running configuration (``scontrol show config``)."""
        return parse_config(self._run(["scontrol", "show", "config"]).stdout)

    def _user_field(self, user: str, field: str) -> str | None:
        """One field of ``user``'s record in Slurm's accounting (``sacctmgr show user``), stripped; None when it
        has no association (or there is no accounting)."""
        result = self._run(["sacctmgr", "-n", "-P", "show", "user", user, f"format=User,{field}"], check=False)
        for line in result.stdout.splitlines():
            name, _, value = line.partition("|")
            if name == user:
                return value.strip()
        return None

    def admin_level(self, user: str) -> str | None:
        """An account's Slurm admin level (``None``, ``Operator``, ``Administrator``); None when it has no
        association (or there is no accounting)."""
        level = self._user_field(user, "AdminLevel")
        return None if level is None else level or "None"

    def default_account(self, user: str) -> str | None:
        """The account a job of ``user`` runs under when it names none (its association's DefaultAccount); None
        when it has none (or there is no accounting)."""
        return self._user_field(user, "DefaultAccount") or None

    def ping(self) -> None:
        """Raise :class:`SlurmUnreachable` unless the primary slurmctld answers."""
        result = self._run(["scontrol", "ping"], check=False)
        if result.returncode != 0 or "UP" not in result.stdout:
            raise SlurmUnreachable(
                ["scontrol", "ping"],
                result.returncode,
                result.stdout,
                result.stderr,
                hint="Slurm's controller (slurmctld) is not answering: check `scontrol ping`; "
                "on the local testbed run `sudo make testbed`.",
            )

    def nodes(self) -> list[SlurmNode]:
        """Every node, one record each (``sinfo --json`` on 22.05, ``scontrol show nodes --json`` after)."""
        dialect = self.dialect()
        argv = list(dialect.nodes_argv)
        return [SlurmNode.from_sinfo(self._parsed(argv, dialect.node, raw)) for raw in self._records(argv, "nodes")]

    def partitions(self) -> list[Partition]:
        """Partitions with their limits (``scontrol show partition``) and nodes (:meth:`nodes`)."""
        nodes = self.nodes()
        result = self._run(["scontrol", "show", "partition", "--oneliner"])
        partitions = []
        for line in result.stdout.splitlines():
            kv = parse_key_values(line)
            if "PartitionName" not in kv:
                continue
            name = kv["PartitionName"]
            max_nodes = kv.get("MaxNodes", "UNLIMITED")
            partitions.append(
                Partition(
                    name=name,
                    nodes=tuple(n for n in nodes if name in n.partitions),
                    max_time_min=parse_slurm_duration(kv.get("MaxTime", "UNLIMITED")),
                    default_time_min=parse_slurm_duration(kv.get("DefaultTime", "NONE")),
                    default=kv.get("Default", "NO") == "YES",
                    state=kv.get("State", "UP"),
                    max_nodes=None if max_nodes == "UNLIMITED" else int(max_nodes),
                    allow_groups=_names_or_all(kv.get("AllowGroups", "ALL")),
                    allow_accounts=_names_or_all(kv.get("AllowAccounts", "ALL")),
                    deny_accounts=_names_or_all(kv.get("DenyAccounts", "")) or (),
                )
            )
        return partitions

    def jobs(self, *, user: str | None = None, job_ids: Iterable[int] = (), strict: bool = False) -> list[SlurmJob]:
        """All jobs Slurm still knows (ended ones too, until MinJobAge), in one ``squeue --json`` call.

        squeue refuses a list of ids when one has been purged: then none (or, ``strict``, the error)."""
        dialect = self.dialect()
        argv = ["squeue", "--json", *dialect.all_states]
        if user:
            argv += ["--user", user]
        ids = [str(int(j)) for j in job_ids]
        if ids:
            argv += ["--jobs", ",".join(ids)]
        try:
            records = self._records(argv, "jobs")
        except SlurmError as exc:
            # squeue --jobs fails outright when a listed job has been purged.
            if ids and not strict and "Invalid job id" in (exc.stderr + exc.stdout):
                return []
            raise
        if dialect.json_ignores_filters and (user or ids):
            # Before parsing: 22.05's flat records name the job, its array and its user plainly.
            wanted = {int(j) for j in ids}
            records = [raw for raw in records if isinstance(raw, dict)
                       and (not user or raw.get("user_name") == user)
                       and (not wanted or raw.get("job_id") in wanted or raw.get("array_job_id") in wanted)]
        return [SlurmJob.from_squeue(self._parsed(argv, dialect.job, raw)) for raw in records]

    def jobs_by_id(self, job_ids: Iterable[int]) -> list[SlurmJob]:
        """These jobs (an array's id: all its tasks) as Slurm still lists them: one ``squeue --jobs`` call,
        or, when one of them is gone (squeue then refuses the whole list), every job's filtered here."""
        wanted = {int(j) for j in job_ids}
        if not wanted:
            return []
        try:
            return self.jobs(job_ids=sorted(wanted), strict=True)
        except SlurmError as exc:
            if "Invalid job id" not in exc.stderr + exc.stdout:
                raise
        return [job for job in self.jobs() if job.job_id in wanted or job.array_job_id in wanted]

    def queue(self) -> list[SlurmJob]:
        """Every job slurmctld still holds, brief (:data:`~dlsub.slurm_plugins.dialects.QUEUE_FORMAT`:
        ids, uid, state, reason, partition, node count, GRES, submit time; no name, comment or record).
        A few dozen bytes a job where ``squeue --json`` prints several KB: what the agent reads every
        tick, with :meth:`jobs` for the few jobs it needs whole."""
        dialect = self.dialect()
        argv = ["squeue", "--noheader", "--states=all", f"--format={QUEUE_FORMAT}"]
        lines = self._run(argv).stdout.splitlines()
        return [SlurmJob.from_squeue(self._parsed(argv, dialect.queue_record, line)) for line in lines if line]

    def accounting(self, job_ids: Iterable[int]) -> list[SlurmJob]:
        """Finished jobs from Slurm's accounting (``sacct``), for those squeue no longer lists.

        Empty when the cluster keeps no accounting: callers then fall back
        to what the job left in its directory.
        """
        ids = ",".join(str(int(j)) for j in job_ids)
        if not ids:
            return []
        argv = ["sacct", "-X", "-n", "-P", "-j", ids, "--format=JobIDRaw,JobName,User,State,Partition,NodeList,"
                "ExitCode,Comment"]
        result = self._run(argv, check=False)
        if result.returncode != 0:
            return []
        return [job for line in result.stdout.splitlines() if (job := SlurmJob.from_sacct(line)) is not None]

    def job_state(self, job_id: int) -> str:
        """One job's state as squeue prints it (``RUNNING``); "" when squeue lists it not (or fails). The batch
        launcher's one look at the queue, where ``squeue --json`` of 22.05 would print every job."""
        return self._run(["squeue", "-h", "-j", str(int(job_id)), "-o", "%T"], check=False).stdout.rstrip("\n")

    def node_show(self, node: str) -> str:
        """``scontrol -o show node NODE``'s line ("" when it fails): the batch launcher reads the node's GRES."""
        return self._run(["scontrol", "-o", "show", "node", node], check=False).stdout

    def job(self, job_id: int) -> SlurmJob | None:
        found = [j for j in self.jobs(job_ids=[job_id]) if j.job_id == job_id]
        return found[0] if found else None

    # ------------------------------------------------------------------ writes
    def submit(self, script: Path, *, args: Sequence[str] = ()) -> int:
        """``sbatch --parsable SCRIPT``; returns the Slurm job id."""
        result = self._run(["sbatch", "--parsable", *args, str(script)])
        first = result.stdout.strip().split(";")[0]
        try:
            return int(first)
        except ValueError as exc:
            raise SlurmError(["sbatch", "--parsable", str(script)], 0, result.stdout, result.stderr,
                             hint="sbatch did not print a job id") from exc

    def test_only(self, script: Path, *, args: Sequence[str] = ()) -> str:
        """Slurm's own start-time estimate, without submitting (``sbatch --test-only``)."""
        result = self._run(["sbatch", "--test-only", *args, str(script)])
        return (result.stderr or result.stdout).strip()

    def cancel(self, job_id: int, *, signal: str | None = None, batch: bool = False) -> None:
        argv = ["scancel"]
        if signal:
            argv += [f"--signal={signal}"]
        if batch:
            argv += ["--batch"]
        self._run([*argv, str(int(job_id))])

    def requeue(self, job_id: int) -> None:
        self._run(["scontrol", "requeue", str(int(job_id))])

    def requeue_held(self, job_id: int | str) -> None:
        """Requeue a running job (or one array task, ``<array>_<task>``) and hold it (``scontrol requeuehold``):
        Slurm ends its attempt and keeps it pending, held as the user's hold is, until released. The agent's
        restart of a job that does not checkpoint; the batch launcher's after a move's checkpoint, and a
        worker's going back to its held pool."""
        self._run(["scontrol", "requeuehold", _job_handle(job_id)])

    def update_job(self, job_id: int, **fields: str) -> None:
        """``scontrol update jobid=N Key=Value ...`` (e.g. ``Partition="gpu"``)."""
        self._run(["scontrol", "update", f"jobid={int(job_id)}", *(f"{k}={v}" for k, v in fields.items())])

    def release(self, job_id: int | str) -> None:
        """Release a held job (or one array task, ``<array>_<task>``). A requeued one still waits for its
        BeginTime (cred_expire + 1 s after the requeue): started sooner on the node it left, slurmd kills
        it ("Job credential revoked")."""
        self._run(["scontrol", "release", _job_handle(job_id)])

    def point_at_node(self, job_id: int | str, node: str | None, partition: str | None = None) -> None:
        """Have a pending job (or one array task) start on ``node`` only (``scontrol update ReqNodeList=``):
        an elastic job's worker starts where the agent counted idle GPUs for it, the job's own node first,
        not on whichever node Slurm would try first. Slurm keeps it across a requeue; each grow points again.
        ``partition``: on that partition too (``Partition=``, in the same update): a worker follows its main
        job to the partition the agent placed it on. ``node`` None: the partition only."""
        if node is not None and not _NODE_NAME.match(node):
            raise ValueError(f"{node!r} is not a Slurm node name")
        if partition is not None and not valid_partition(partition):
            raise ValueError(f"{partition!r} is not a Slurm partition name")
        fields = [*([f"Partition={partition}"] if partition else []), *([f"ReqNodeList={node}"] if node else [])]
        if fields:
            self._run(["scontrol", "update", f"jobid={_job_handle(job_id)}", *fields])

    def signal_task(self, handle: str, signal: str) -> None:
        """Signal the batch shell of one array task (``scancel --batch --signal``)."""
        self._run(["scancel", f"--signal={signal}", "--batch", _job_handle(handle)])

    def retarget(self, job_id: int, partition: str, gpus_per_node: int, time_limit_min: int | None = None,
                 gpu_type: str = "") -> None:
        """Point a pending job at another partition, with that many GPUs per node (of kind ``gpu_type``, as
        Slurm's GRES names it: ``gres:gpu:a100:4``; "": any kind), and a time limit.

        GPUs are only ever added or kept: Slurm 22.05 leaves a pending job
        "never runnable" on CPU nodes after its GPU request is cleared.
        """
        if gpu_type and valid_gpu_type(gpu_type) is None:
            raise ValueError(f"{gpu_type!r} is not a GPU type's name (letters, digits, '_', '.', '-')")
        fields = {"Partition": partition}
        if gpus_per_node:
            kind = f"{gpu_type}:" if gpu_type else ""
            fields["TresPerNode"] = f"gres:gpu:{kind}{int(gpus_per_node)}"
        if time_limit_min is not None:
            fields["TimeLimit"] = str(time_limit_min)
        self.update_job(job_id, **fields)

    # ------------------------------------------------------------------ estimates and accounting
    def start_estimate(self, partition: str, *, cpus: int, mem_mb: int, gpus_per_node: int = 0, nodes: int = 1,
                       time_limit_min: int | None = None, gpu_type: str = "") -> float | None:
        """When Slurm would start such a job on ``partition`` now (``sbatch --test-only``), epoch seconds.

        None when Slurm gives no time (it cannot place the job). The request
        travels as ``#SBATCH`` lines of a throw-away script, as dlsub's own jobs do;
        ``gpu_type`` names the kind of its GPUs as Slurm's GRES does (``gpu:a100:4``; "": any kind).
        """
        import tempfile

        if gpu_type and valid_gpu_type(gpu_type) is None:
            raise ValueError(f"{gpu_type!r} is not a GPU type's name (letters, digits, '_', '.', '-')")

        lines = ["#!/bin/sh", f"#SBATCH --partition={partition}", f"#SBATCH --nodes={int(nodes)}",
                 f"#SBATCH --cpus-per-task={int(cpus)}", f"#SBATCH --mem={int(mem_mb)}M"]
        if gpus_per_node:
            lines.append(f"#SBATCH --gres=gpu:{gpu_type + ':' if gpu_type else ''}{int(gpus_per_node)}")
        if time_limit_min is not None:
            lines.append(f"#SBATCH --time={int(time_limit_min)}")
        with tempfile.TemporaryDirectory(prefix="dlsub-test-only-") as tmp:
            script = Path(tmp) / "probe.sh"
            script.write_text("\n".join([*lines, "true", ""]), encoding="utf-8")
            result = self._run(["sbatch", "--test-only", str(script)], check=False)
        return parse_start_time(f"{result.stdout}\n{result.stderr}")

    def usage(self, since: float, *, user: str | None = None, account: str | None = None,
              all_users: bool = False) -> list[UsageRecord]:
        """Every allocation since ``since`` (requeued runs each count) from ``sacct``; [] without accounting."""
        import time as _time

        start = _time.strftime("%Y-%m-%dT%H:%M:%S", _time.localtime(since))
        argv = ["sacct", "-n", "-P", "-X", "-D", "-S", start, "-E", "now", f"--format={SACCT_FORMAT}"]
        if user:
            argv += ["-u", user]
        elif all_users:
            argv += ["-a"]
        if account:
            argv += ["-A", account]
        result = self._run(argv, check=False)
        if result.returncode != 0:
            return []
        return [r for line in result.stdout.splitlines() if (r := UsageRecord.from_sacct(line)) is not None]


def parse_start_time(text: str) -> float | None:
    """The epoch time in ``sbatch --test-only``'s "Job N to start at 2026-11-22T15:10:00 using ..."."""
    import re
    import time as _time

    m = re.search(r"to start at (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)", text)
    if not m:
        return None
    return _time.mktime(_time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S"))


@dataclass(frozen=True)
class SlurmConfig:
    """``scontrol show config``: its ``Key = Value`` lines, and when slurmctld printed them."""

    values: dict[str, str]
    as_of: float | None  # epoch seconds of "Configuration data as of ...": slurmctld's clock

    def get(self, key: str, default: str = "") -> str:
        return self.values.get(key, default)

    @property
    def cred_expire_s(self) -> int:
        """How long a requeued job waits before it may start again (Slurm's default is 120 s)."""
        for key in ("AuthInfo", "CredentialParameters", "CommunicationParameters"):
            m = re.search(r"cred_expire=(\d+)", self.get(key))
            if m:
                return int(m.group(1))
        return 120


def parse_config(text: str) -> SlurmConfig:
    import time as _time

    values: dict[str, str] = {}
    as_of = None
    for line in text.splitlines():
        m = re.match(r"Configuration data as of (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)", line)
        if m:
            as_of = _time.mktime(_time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S"))
            continue
        key, sep, value = line.partition(" = ")
        if sep and key.strip() and " " not in key.strip():
            values.setdefault(key.strip(), value.strip())
    return SlurmConfig(values, as_of)
