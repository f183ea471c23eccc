"""A worker's training processes join a running group in process (issue 52): the group grows without a restart.

An elastic job grows by a worker (a held array task the agent releases) whose torchrun joins the main job's
rendezvous; torchrun then stops every rank and starts the group again at the larger size from a checkpoint.
Where the training re-forms in process (:meth:`dlsub.checkpointing.run.Run.regroup_in_process`), its rank 0
records where the group's store is (:func:`publish`, :func:`dlsub.contract.regroup_record`), and a worker that
starts then joins through it instead:

* its torchrun (:mod:`dlsub.checkpointing.torchrun_main`, told by the worker's launcher that it may:
  :data:`~dlsub.contract.ENV_JOIN_IN_PROCESS`) finds the record of its attempt and the store answering
  (:func:`worth_joining`), and starts its processes as one node of its own (:func:`standalone`), the record in
  their environment (:data:`~dlsub.contract.ENV_REGROUP_JOIN`);
* each process, before the script runs (:func:`join_if_told`, from the entry point), asks the group for a place
  (:meth:`ElasticGroup.join`); the members make one at their next step boundary, form the larger group with it
  and send it rank 0's state from memory. Its ``RANK`` and ``WORLD_SIZE`` are then the new group's, and the
  script's own ``init_process_group`` finds the group formed (it returns at once);
* the script's :meth:`Run.restore` returns that state (no checkpoint is read) and its ``regroup_in_process`` takes
  this group (no collective of its own: the members made theirs at the start).

What the script runs between its start and its first step, the members wait for in their ``on_change`` (its
model's wrap, DDP's first collective): they stand still for the joining process's set-up, not its interpreter's
start or imports. Where anything fails (no record, the store gone, the members never re-form), the process
tells its torchrun (:func:`dlsub.contract.join_failed_marker`), which joins through the rendezvous instead:
today's restart, nothing lost.

torch is imported where it is used: the record's checks run where torch is already imported.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from dlsub import contract
from dlsub.checkpointing.regroup import (
    DEFAULT_TIMEOUT_S,
    Change,
    ElasticGroup,
    RegroupFailed,
    store_client,
    torchrun_store_address,
)

#: How long the worker's torchrun waits for the group's store to answer before it joins through the rendezvous.
STORE_CHECK_S = 3.0
#: How long it waits for the record of a training that has not reached its loop yet (a worker released as the job
#: starts): past that it joins through the rendezvous.
RECORD_WAIT_S = 20.0
_PREFIX_RE = re.compile(r"\Adlsub/regroup/[0-9]{1,20}\Z")
_HOST_RE = re.compile(r"\A[A-Za-z0-9._:-]{1,253}\Z")
#: torchrun's options that put a node into the job's rendezvous, each with its value.
_RENDEZVOUS_OPTIONS = ("--nnodes", "--rdzv-backend", "--rdzv_backend", "--rdzv-endpoint", "--rdzv_endpoint",
                       "--rdzv-id", "--rdzv_id", "--rdzv-conf", "--rdzv_conf", "--max-restarts", "--max_restarts")


@dataclasses.dataclass(frozen=True)
class JoinPoint:
    """Where a running group takes processes that join: its store and its keys there."""

    addr: str
    port: int
    prefix: str
    backend: str

    def to_json(self) -> str:
        return json.dumps({"addr": self.addr, "port": self.port, "prefix": self.prefix, "backend": self.backend})

    @classmethod
    def from_json(cls, raw: str) -> JoinPoint | None:
        """The record, checked (the job's own user wrote the file); None for anything but one."""
        try:
            data = json.loads(raw)
            point = cls(str(data["addr"]), int(data["port"]), str(data["prefix"]), str(data["backend"]))
        except (ValueError, TypeError, KeyError):
            return None
        valid = (_HOST_RE.match(point.addr) and 0 < point.port < 65536 and _PREFIX_RE.match(point.prefix)
                 and point.backend in ("gloo", "nccl"))
        return point if valid else None


def publish(job_dir: Path, attempt: str, group: ElasticGroup) -> None:
    """Rank 0's record of where its group takes joining processes (under torchrun's store only; else none)."""
    address = torchrun_store_address()
    if address is None:
        return
    record = contract.regroup_record(job_dir, attempt)
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        temporary = record.with_name(f".{record.name}.{os.getpid()}")
        temporary.write_text(JoinPoint(*address, group.prefix, group.backend).to_json() + "\n")
        os.replace(temporary, record)  # a worker reading it never sees half of it
    except OSError as exc:
        print(f"dlsub: workers will join by a restart: could not record the group's store ({exc})", file=sys.stderr,
              flush=True)


def _in_its_loop(job_dir: Path, attempt: str) -> bool:
    """Whether ``attempt``'s training, at its latest start, is training already: it has asked should_stop() (its
    polls event), or declared that a framework saves for it (adapters never re-form in process). The events are
    the job's own user's: only their kind and attempt are read, from the file's last 64 KiB."""
    try:
        with open(job_dir / contract.PROGRESS_FILE, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            lines = f.read().splitlines()
    except OSError:
        return False
    listening = False
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if not isinstance(event, dict) or event.get("attempt") != attempt:
            continue
        if event.get("event") == contract.EVENT_START:
            listening = event.get("saves") == contract.SAVES_ON_REQUEST
        elif event.get("event") == contract.EVENT_POLLS:
            listening = True
    return listening


def worth_joining(environ: dict[str, str] | None = None,
                  wait_s: float = RECORD_WAIT_S) -> tuple[JoinPoint | None, str]:
    """For a worker's torchrun: the record of its attempt's group, if there is one and the group's store answers
    with the group's keys (a record of a group that has since restarted names a store that is gone); else None
    and why not. Where the training has not reached its loop yet, it waits up to ``wait_s`` for the record."""
    env = os.environ if environ is None else environ
    job_dir, attempt = env.get(contract.ENV_JOB_DIR), env.get(contract.ENV_ATTEMPT)
    if not job_dir or not attempt:
        return None, "not a job of dlsub's"
    record = contract.regroup_record(Path(job_dir), attempt)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with open(record, encoding="utf-8") as f:
                point = JoinPoint.from_json(f.read(4096))
            break
        except OSError as exc:
            why = f"the group has not said where it takes processes ({record.name}: {exc.strerror})"
        # A worker released as the job starts comes before its training has reached regroup_in_process: it waits
        # until the training is in its loop (then it would have said) or has said it never will.
        if _in_its_loop(Path(job_dir), attempt) or time.monotonic() >= deadline:
            return None, why
        time.sleep(0.2)
    if point is None:
        return None, f"{record} is not the library's record"
    try:
        if store_client(point.addr, point.port, STORE_CHECK_S).check([f"{point.prefix}/gen"]):
            return point, ""
        return None, f"the group's store at {point.addr}:{point.port} does not hold its keys (it restarted since)"
    except Exception as exc:  # noqa: BLE001 - refused, timed out, reset: the store is not there to join through
        return None, f"the group's store at {point.addr}:{point.port} did not answer ({str(exc)[:200]})"


def standalone(args: list[str], script_at: int) -> list[str]:
    """torchrun's arguments for one node of its own (``--standalone``, no restarts): the rendezvous options before
    the script (``args[:script_at]``) taken out, the rest as it was."""
    kept: list[str] = []
    options = iter(args[:script_at])
    for word in options:
        name = word.split("=", 1)[0]
        if name in _RENDEZVOUS_OPTIONS:
            if "=" not in word:
                next(options, None)
            continue
        if word == "--standalone":
            continue
        kept.append(word)
    return ["--standalone", "--nnodes", "1", "--max-restarts", "0", *kept, *args[script_at:]]


# The group this process joined before its script ran, and the state it got; taken by the script's Run.
_joined: tuple[ElasticGroup, Change] | None = None


def join_if_told() -> None:
    """In a training process, before its script: join the group named in the environment, if one is. On failure,
    tell torchrun (which joins through its rendezvous instead) and exit."""
    global _joined
    raw = os.environ.pop(contract.ENV_REGROUP_JOIN, "")
    point = JoinPoint.from_json(raw) if raw else None
    if point is None:
        return
    joining = contract.joining_marker(Path(tempfile.gettempdir()), os.getppid(), os.getpid())
    joining.touch()  # left behind if this process is killed while it joins
    try:
        store = store_client(point.addr, point.port, DEFAULT_TIMEOUT_S)
        _all_here_ready(store, point)
        group, change = ElasticGroup.join(store, backend=point.backend, prefix=point.prefix)
        members = group.members_count(member_tag())  # the members' part of their re-formation, after the state
    except (RegroupFailed, RuntimeError) as exc:
        print(f"dlsub: could not join the running group in process ({exc}); joining by a restart",
              file=sys.stderr, flush=True)
        contract.join_failed_marker(Path(tempfile.gettempdir()), os.getppid()).touch()
        sys.exit(1)
    joining.unlink(missing_ok=True)
    _joined = (group, change)
    os.environ.update(RANK=str(change.membership.rank), WORLD_SIZE=str(change.membership.world_size),
                      GROUP_WORLD_SIZE=str(members))
    _init_once_formed()


def _all_here_ready(store: Any, point: JoinPoint) -> None:
    """Wait for this container's other processes, so that all of them ask to join at once and the members take them
    in one re-formation, not one by one as each asks. On the group's store: under dlsub this torchrun holds none
    for its processes (its rank 0 would, in the ``init_process_group`` that joining replaces)."""
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    if processes <= 1:
        return
    here = re.sub(r"[^A-Za-z0-9_.-]", "_", os.environ.get("TORCHELASTIC_RUN_ID", "") or str(os.getppid()))[:80]
    key = f"{point.prefix}/arriving/{here}"
    if int(store.add(key, 1)) == processes:
        store.set(f"{key}/all", b"1")
    store.wait([f"{key}/all"], timedelta(seconds=DEFAULT_TIMEOUT_S))


def member_tag() -> str:
    """What tells the group's members apart (each a container: the main job's, a worker's; several may share a
    node): the container's name, else torchrun's number of the node."""
    return os.environ.get(contract.ENV_CONTAINER) or os.environ.get("GROUP_RANK", "")


def _init_once_formed() -> None:
    """The script's ``init_process_group`` returns at once where the group is formed already (it was: joined)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    original = distributed_c10d.init_process_group

    def init_process_group(*args: Any, **kwargs: Any) -> None:
        dist.init_process_group = distributed_c10d.init_process_group = original  # once: later groups are new
        if not dist.is_initialized():
            original(*args, **kwargs)

    dist.init_process_group = distributed_c10d.init_process_group = init_process_group


def joined() -> ElasticGroup | None:
    """The group this process joined before its script ran (None: it started with its group)."""
    return _joined[0] if _joined is not None else None


def take_state() -> dict[str, Any] | None:
    """The state rank 0 sent this process when it joined, once (the script's restore); None after, or if none."""
    global _joined
    if _joined is None or _joined[1].state is None:
        return None
    group, change = _joined
    _joined = (group, dataclasses.replace(change, state=None))
    return change.state


__all__ = ["JoinPoint", "join_if_told", "joined", "member_tag", "publish", "standalone", "take_state",
           "worth_joining"]
