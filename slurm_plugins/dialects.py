"""What differs between the Slurm versions dlsub runs on, and nothing else (pure).

Slurm's JSON changed shape in 23.02, when the CLI's ``--json`` moved onto the
data_parser plugins (v0.0.39 and later):

- numbers became ``{"set": bool, "infinite": bool, "number": N}`` objects;
- ``job_state`` became a list of flags (``["PENDING", "REQUEUED"]``);
- ``exit_code`` became ``{"status": [...], "return_code": <number>, "signal": ...}``;
- ``sinfo --json`` groups nodes (one record per set of alike nodes), so the
  per-node view comes from ``scontrol show nodes --json``, whose ``state`` is a
  list of flags too;
- ``squeue --json`` applies squeue's default state filter (pending and
  running only), so ended jobs need ``--states=all``.

The client asks Slurm its version once (``scontrol --version``) and takes the
:class:`Dialect` of that version: the choice is made by the version Slurm
reports, never by the shape of one field. Each dialect turns Slurm's records
into one flat shape (22.05's: plain ints and strings) that
:mod:`dlsub.slurm_plugins.models` reads; a record that does not have the
shape its version promises raises :class:`SlurmParseError` naming the field,
the value and the version.

Recorded output of each version the testbed runs lives in
``tests/fixtures/slurm/<version>/`` (``testbed/record_slurm.py``); the
parsers' tests run over all of them.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from dlsub.contract import HELD_AFTER_FAILED_LAUNCH, HELD_BY_USER

#: The versions the testbed runs and CI tests: a site on another gets a warning from `dlsub doctor`.
TESTED_VERSIONS = ("22.05", "24.11", "26.05")
#: Older than this, dlsub does not run (its JSON has none of the fields read here).
OLDEST_SUPPORTED = (22, 5)


class SlurmParseError(ValueError):
    """A Slurm record is not shaped as its version's output is. Names the field, value and version."""

    def __init__(self, version: SlurmVersion, record: str, field: str, value: Any, expected: str) -> None:
        self.version = version
        self.field = field
        shown = repr(value)
        if len(shown) > 120:
            shown = shown[:117] + "..."
        super().__init__(f"Slurm {version}: {record} field {field!r} is {shown}, expected {expected}; "
                         f"dlsub reads Slurm {', '.join(TESTED_VERSIONS)} (is this a newer Slurm? "
                         f"run `dlsub doctor`)")


@dataclass(frozen=True, order=True)
class SlurmVersion:
    major: int
    minor: int
    micro: int = 0

    @classmethod
    def parse(cls, text: str) -> SlurmVersion:
        """``scontrol --version``'s ``slurm 24.11.5`` (Debian: ``slurm-wlm 24.11.5``)."""
        m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text or "")
        if not m:
            raise ValueError(f"no Slurm version in {text.strip()[:80]!r}")
        return cls(int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))

    @property
    def series(self) -> str:
        """``24.11``: the release series (what the testbed and the fixtures are named by)."""
        return f"{self.major}.{self.minor:02d}"

    def __str__(self) -> str:
        return f"{self.series}.{self.micro}"


#: The whole queue as the agent's tick reads it every time (``squeue --noheader --format``): one short
#: line a job, with only what Slurm itself decides or checks (ids, uid, state, reason, partition,
#: node count, GRES, submit time). Nothing a user writes freely (name, comment, paths) is in it, so no
#: job can forge a line or a field; the full JSON of the jobs that are dlsub's is read apart.
#: These ``%`` letters mean the same from Slurm 2.x to 26.05.
QUEUE_FIELDS = ("job_id", "array_job_id", "array_task_id", "user_id", "job_state", "state_reason", "partition",
                "node_count", "tres_per_node", "submit_time")
QUEUE_FORMAT = "%A|%F|%K|%U|%T|%r|%P|%D|%b|%V"


#: How Slurm names the hold of ``scontrol requeuehold`` (priority 0, released as a user's hold is):
#: 22.05's JSON says the first, squeue's ``%r`` the second (24.11); later JSON says JobHeldUser.
_REQUEUED_HELD = ("job_requeued_in_held_state", "job requeued in held state")


#: How Slurm says it requeued a job held because its batch script could not be launched: squeue's ``%r`` and
#: the JSON's ``state_description`` (whose ``state_reason`` then says JobHeldUser) the first (24.11), scontrol the
#: second. Read as HELD_AFTER_FAILED_LAUNCH: a hold the agent may release, not the user's own.
_LAUNCH_FAILED = ("launch failed requeued held", "launch_failed_requeued_held")


def _held_reason(reason: str, description: str = "") -> str:
    if reason in _LAUNCH_FAILED or description in _LAUNCH_FAILED:
        return HELD_AFTER_FAILED_LAUNCH
    return HELD_BY_USER if reason in _REQUEUED_HELD else reason


class Dialect:
    """Slurm before 23.02 (22.05): flat JSON of plain ints and strings, ``sinfo --json`` per node."""

    #: The Slurm command whose JSON lists nodes one record each.
    nodes_argv: tuple[str, ...] = ("sinfo", "--json")
    #: Arguments that make ``squeue --json`` list ended jobs too (still held by slurmctld).
    all_states: tuple[str, ...] = ()
    #: 22.05's ``squeue --json`` prints every job whatever ``--jobs``, ``--user`` or ``--states`` say
    #: (the client filters; a whole read of a few jobs costs every job's JSON there).
    json_ignores_filters = True

    def __init__(self, version: SlurmVersion) -> None:
        self.version = version

    # ------------------------------------------------------------------ typed reads
    def _fail(self, record: str, field: str, value: Any, expected: str) -> SlurmParseError:
        return SlurmParseError(self.version, record, field, value, expected)

    def _int(self, raw: dict[str, Any], field: str, record: str, default: int | None = 0) -> int | None:
        value = raw.get(field, default)
        if value is None or (isinstance(value, int) and not isinstance(value, bool)):
            return value
        raise self._fail(record, field, value, "a whole number")

    def _wrapped(self, raw: dict[str, Any], field: str, record: str, default: int | None = 0) -> int | None:
        """A number that newer Slurm wraps in ``{"set", "infinite", "number"}``; here a plain int."""
        return self._int(raw, field, record, default)

    def _str(self, raw: dict[str, Any], field: str, record: str) -> str:
        value = raw.get(field, "")
        if value is None:
            return ""
        if isinstance(value, str):
            return value
        raise self._fail(record, field, value, "a string")

    def _count(self, raw: dict[str, Any], field: str, record: str) -> int:
        """A count or time Slurm always sets (0 when it does not say)."""
        return self._wrapped(raw, field, record) or 0

    def _limit(self, raw: dict[str, Any], field: str, record: str) -> int | None:
        """A limit that may be unlimited (None) or unset (None)."""
        return self._wrapped(raw, field, record, default=None)

    def _job_state(self, raw: dict[str, Any], record: str) -> tuple[str, tuple[str, ...]]:
        value = raw.get("job_state", "UNKNOWN")
        if isinstance(value, str):
            return value.upper(), ()
        raise self._fail(record, "job_state", value, "a state name")

    def _reason(self, raw: dict[str, Any], record: str) -> str:
        """Why it waits. 22.05 says ``job_requeued_in_held_state`` after ``scontrol requeuehold``
        (priority 0: held as a user's hold is) where later versions say ``JobHeldUser``; a failed launch is told by
        ``state_description`` (see ``_LAUNCH_FAILED``)."""
        description = raw.get("state_description")
        return _held_reason(self._str(raw, "state_reason", record), description if isinstance(description, str) else "")

    def _exit_code(self, raw: dict[str, Any], record: str) -> int | None:
        """22.05 prints the batch shell's raw wait status (exit 3 is 768; killed by SIGTERM, 15)."""
        status = self._int(raw, "exit_code", record, default=None)
        if status is None or status & 0x7F:  # killed by a signal: no exit code
            return None
        return status >> 8

    def _array_task(self, raw: dict[str, Any], record: str) -> int | None:
        value = self._wrapped(raw, "array_task_id", record, default=None)
        # 4294967294 (NO_VAL) and friends: not a task of its own yet.
        return value if value is not None and 0 <= value < 4294967294 else None

    # ------------------------------------------------------------------ records
    def job(self, raw: dict[str, Any]) -> dict[str, Any]:
        """One ``squeue --json`` job as the flat record :class:`~dlsub.slurm_plugins.models.SlurmJob` reads."""
        if not isinstance(raw, dict):
            raise self._fail("squeue job", "(record)", raw, "an object")
        job_id = self._int(raw, "job_id", "squeue job", default=None)
        if job_id is None:
            raise self._fail("squeue job", "job_id", raw.get("job_id"), "a job id")
        record = f"squeue job {job_id}"
        state, flags = self._job_state(raw, record)
        return {
            "job_id": job_id,
            "name": self._str(raw, "name", record),
            "user_name": self._str(raw, "user_name", record),
            "user_id": self._int(raw, "user_id", record, default=None),
            "account": self._str(raw, "account", record),
            "job_state": state,
            "state_flags": list(flags),
            "state_reason": self._reason(raw, record),
            "partition": self._str(raw, "partition", record),
            "nodes": self._str(raw, "nodes", record),
            "comment": self._str(raw, "comment", record),
            "admin_comment": self._str(raw, "admin_comment", record),
            "restart_cnt": self._int(raw, "restart_cnt", record) or 0,
            "priority": self._limit(raw, "priority", record),
            "time_limit": self._limit(raw, "time_limit", record),
            "start_time": self._count(raw, "start_time", record),
            "submit_time": self._count(raw, "submit_time", record),
            "end_time": self._count(raw, "end_time", record),
            "exit_code": self._exit_code(raw, record),
            "tres_per_node": self._str(raw, "tres_per_node", record),
            "node_count": self._count(raw, "node_count", record),
            "cpus": self._count(raw, "cpus", record),
            "memory_per_node": self._limit(raw, "memory_per_node", record),
            "array_job_id": self._count(raw, "array_job_id", record),
            "array_task_id": self._array_task(raw, record),
            "array_task_string": self._str(raw, "array_task_string", record),
            "het_job_id": self._count(raw, "het_job_id", record),
            "het_job_offset": self._count(raw, "het_job_offset", record),
            "standard_output": self._str(raw, "standard_output", record),
        }

    def node(self, raw: dict[str, Any]) -> dict[str, Any]:
        """One node of :attr:`nodes_argv`'s JSON as the flat record ``SlurmNode.from_sinfo`` reads."""
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise self._fail("node", "name", raw.get("name") if isinstance(raw, dict) else raw, "a node name")
        record = f"node {raw['name']}"
        state, flags = self._node_state(raw, record)
        partitions = raw.get("partitions") or []
        if not isinstance(partitions, list):
            raise self._fail(record, "partitions", partitions, "a list of partition names")
        return {
            "name": raw["name"],
            "state": state,
            "state_flags": list(flags),
            "partitions": [str(p) for p in partitions],
            "cpus": self._int(raw, "cpus", record) or 0,
            "alloc_cpus": self._int(raw, "alloc_cpus", record) or 0,
            "real_memory": self._int(raw, "real_memory", record) or 0,
            "alloc_memory": self._int(raw, "alloc_memory", record) or 0,
            "gres": self._str(raw, "gres", record),
            "gres_used": self._str(raw, "gres_used", record),
        }

    def queue_record(self, line: str) -> dict[str, Any]:
        """One line of :data:`QUEUE_FORMAT` as the flat record ``SlurmJob.from_squeue`` reads, with
        ``brief`` set: no name, comment or submit record (nothing a user writes is in the line)."""
        fields = line.split("|")
        if len(fields) != len(QUEUE_FIELDS):
            raise self._fail("squeue line", "(line)", line, f"{len(QUEUE_FIELDS)} fields joined by '|' "
                             f"({QUEUE_FORMAT})")
        raw = dict(zip(QUEUE_FIELDS, fields, strict=True))
        record = f"squeue line {raw['job_id']}"
        numbers: dict[str, int] = {}
        for name in ("job_id", "array_job_id", "user_id", "node_count"):
            if not raw[name].isdigit():
                raise self._fail(record, name, raw[name], "a whole number")
            numbers[name] = int(raw[name])
        try:
            submit_time = int(time.mktime(time.strptime(raw["submit_time"], "%Y-%m-%dT%H:%M:%S")))
        except ValueError:
            raise self._fail(record, "submit_time", raw["submit_time"], "YYYY-MM-DDTHH:MM:SS") from None
        # squeue prints the job's own id as its array's for a job that is not a task of one.
        array = numbers["array_job_id"] if raw["array_task_id"] not in ("N/A", "") else 0
        reason = raw["state_reason"]
        return {
            "job_id": numbers["job_id"],
            "user_id": numbers["user_id"],
            "job_state": raw["job_state"].upper(),
            "state_reason": _held_reason(reason),
            "partition": raw["partition"],
            "node_count": numbers["node_count"],
            "tres_per_node": "" if raw["tres_per_node"] == "N/A" else raw["tres_per_node"],
            "array_job_id": array,
            "submit_time": submit_time,
            "brief": True,
        }

    def _node_state(self, raw: dict[str, Any], record: str) -> tuple[str, tuple[str, ...]]:
        state, flags = raw.get("state", "unknown"), raw.get("state_flags") or []
        if not isinstance(state, str) or not isinstance(flags, list):
            raise self._fail(record, "state", state, "a state name and a list of flags")
        return state.lower(), tuple(str(f).lower() for f in flags)


class DataParserDialect(Dialect):
    """Slurm from 23.02 on (data_parser v0.0.39+; recorded: 24.11's v0.0.42, 26.05's)."""

    nodes_argv = ("scontrol", "show", "nodes", "--json")
    all_states = ("--states=all",)
    json_ignores_filters = False

    def _number(self, raw: dict[str, Any], field: str, record: str) -> tuple[bool, bool, int]:
        """``{"set", "infinite", "number"}`` (absent: unset)."""
        value = raw.get(field)
        if value is None:
            return False, False, 0
        if isinstance(value, dict) and isinstance(value.get("number"), int):
            return bool(value.get("set", True)), bool(value.get("infinite", False)), int(value["number"])
        raise self._fail(record, field, value, '{"set", "infinite", "number"}')

    def _wrapped(self, raw: dict[str, Any], field: str, record: str, default: int | None = 0) -> int | None:
        is_set, infinite, number = self._number(raw, field, record)
        return number if is_set and not infinite else default

    def _job_state(self, raw: dict[str, Any], record: str) -> tuple[str, tuple[str, ...]]:
        value = raw.get("job_state")
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            return value[0].upper(), tuple(v.upper() for v in value[1:])
        raise self._fail(record, "job_state", value, "a list of state flags")

    def _exit_code(self, raw: dict[str, Any], record: str) -> int | None:
        value = raw.get("exit_code")
        if not isinstance(value, dict):
            raise self._fail(record, "exit_code", value, '{"status", "return_code", "signal"}')
        # Killed by a signal: return_code is unset (None), as 22.05's wait status says.
        return self._wrapped(value, "return_code", f"{record} exit_code", default=None)

    def _node_state(self, raw: dict[str, Any], record: str) -> tuple[str, tuple[str, ...]]:
        value = raw.get("state")
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            return value[0].lower(), tuple(v.lower() for v in value[1:])
        raise self._fail(record, "state", value, "a list of state flags")



def dialect_for(version: SlurmVersion) -> Dialect:
    """The dialect of the Slurm that reported ``version``."""
    return DataParserDialect(version) if (version.major, version.minor) >= (23, 2) else Dialect(version)
