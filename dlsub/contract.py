"""dlsub's one contract between the CLI, the batch script, the launcher, the
training library and the agent.

Everything the parts say to each other is defined here and nowhere else:
the tags in a Slurm job's ``--comment``, the record ``job_submit.lua``
freezes at submit time, the environment the batch script gives the
container, the container's roles and labels, the files of a job directory
and the schema of their events, the exit code that means "checkpointed,
resume me", what each signal asks for, and the one job-state model with
what one look at a job may show after another. (The batch script, bash, keeps its own literals; a
unit test checks that every DLSUB_ variable it uses is named here.)

Standard library only: the training library imports it inside containers
whose images have nothing but Python and torch.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

# ---------------------------------------------------------------- exit codes

#: The training exits with this after a checkpoint: "checkpointed, resume me".
#: The batch script then requeues the job (bounded by ``max_continuations``).
RESUME_EXIT_CODE = 85
#: A training process or container launcher of an attempt that is no longer the job's newest exits with this
#: (fencing: :func:`superseded_since`): a newer attempt of the job has started, and what this one would write
#: is not the job's. Its batch launcher then touches nothing in Slurm: the job id is the newer attempt's.
SUPERSEDED_EXIT_CODE = 86

# ---------------------------------------------------------------- signals
# Names as ``scancel --signal`` and bash's ``trap`` take them.

#: To the batch shell: checkpoint and continue in a new attempt on the same
#: partition. Slurm sends it ``--signal=B:USR1@GRACE`` before the time limit;
#: ``dlsub requeue`` and the agent's time-limit continuation send it too.
#: Inside the container the launcher hands it to the training processes.
CHECKPOINT_SIGNAL = "USR1"
#: To the batch shell, from the agent only: checkpoint for a move. The batch
#: script requeues the job *held*, so the agent can point it elsewhere first.
MOVE_SIGNAL = "USR2"
#: Into a worker's container, for MOVE_SIGNAL (a shrink: leave the group). A training that re-forms its group in
#: process (``Run.regroup_in_process``) catches it: its ranks leave and the others go on without a restart; the
#: launcher hands any other training CHECKPOINT_SIGNAL instead (the whole group checkpoints and re-forms).
LEAVE_SIGNAL = "USR2"
#: scancel and preemption: stop. Slurm, not dlsub, decides what follows.
STOP_SIGNAL = "TERM"
#: STOP_SIGNAL as Python's signal module names it (``signal.Signals[...]``).
STOP_SIGNUM_NAME = f"SIG{STOP_SIGNAL}"

#: Slurm's reason for a pending job held by its user's side: after MOVE_SIGNAL the batch script
#: requeues the job held (``scontrol requeuehold``), and an elastic job's idle workers wait so.
HELD_BY_USER = "JobHeldUser"
#: Slurm's reason for a pending job an administrator holds: dlsub never releases it.
HELD_BY_ADMIN = "JobHeldAdmin"
#: Slurm's reason for a job it requeued held itself because its batch script could not be launched: seen on the
#: testbed when a node came back from a cut link still holding a requeued job's old attempt and Slurm started
#: the job there again at once ("Duplicate jobid": the node drained). Slurm, not an administrator, holds it; the
#: agent releases it (at most ``policies.actions.move_rules.MAX_LAUNCH_RELEASES`` times).
HELD_AFTER_FAILED_LAUNCH = "launch_failed_requeued_held"


def is_held(state: str, reason: str) -> bool:
    """Whether Slurm holds a job (by its user's side or an admin, priority 0): it will not start until
    released. The one test of "held"; who holds it is in ``reason``."""
    return state == "PENDING" and reason in (HELD_BY_USER, HELD_BY_ADMIN, HELD_AFTER_FAILED_LAUNCH)

# ---------------------------------------------------------------- the container's environment
# Set by the batch script (slurm_plugins/batch.sh) and passed into the
# container (containers/podman.py); read by the launcher and the library.

#: The dlsub id and the job directory (the container sees it at the same path).
ENV_JOB_ID = "DLSUB_JOB_ID"
ENV_JOB_DIR = "DLSUB_JOB_DIR"
#: ``<slurm job id>-<restart count>``: which attempt this is (a gang's nodes share it).
ENV_ATTEMPT = "DLSUB_ATTEMPT"
#: One of CONTAINER_ROLES.
ENV_ROLE = "DLSUB_ROLE"
#: The container's name (one per node and attempt): where its launcher records its exit status (exit_record).
ENV_CONTAINER = "DLSUB_CONTAINER"
#: The type of the node's GPUs as Slurm's GRES names it (``gpu:a100:4`` -> ``a100``); unset or empty for untyped
#: GPUs and CPU nodes. The attempt's start record keeps it as ``gpu_type``.
ENV_GPU_TYPE = "DLSUB_GPU_TYPE"
#: A gang's torchrun rendezvous, ``host:port``, and how many nodes it starts with.
ENV_RDZV_ENDPOINT = "DLSUB_RDZV_ENDPOINT"
# The interface gloo and NCCL open their sockets on (the batch script sets both, slurm_plugins/batch.sh).
SOCKET_IFNAME_ENV = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
ENV_NNODES = "DLSUB_NNODES"
#: A heterogeneous job's parts, as Slurm host lists.
ENV_TRAINER_NODES = "DLSUB_TRAINER_NODES"
ENV_CPU_NODES = "DLSUB_CPU_NODES"
#: Set by ``dlsub submit --from-estimate`` and ``dlsub estimate``'s profiling runs (``--env``): the global
#: batch size to use, how long to profile, and the loss a run aims for.
ENV_BATCH_SIZE = "DLSUB_BATCH_SIZE"
ENV_PROFILE_STEPS = "DLSUB_PROFILE_STEPS"
ENV_PROFILE_SECONDS = "DLSUB_PROFILE_SECONDS"
ENV_TARGET_LOSS = "DLSUB_TARGET_LOSS"
#: "1" in a CPU attempt of a job that asked for GPUs (immediate mode): its one training process starts through
#: dlsub's entry point too, which notes torch's no-GPU error (no_gpu_error_marker) should the script die of it.
ENV_WATCH_NO_GPU = "DLSUB_WATCH_NO_GPU"
#: "1" where dlsub's launcher set PYTHONSAFEPATH for torchrun and the rank entry point (both ``python -m`` of
#: dlsub's modules, from the submit directory: a ``dlsub/`` folder there would stand in for dlsub); the entry
#: point takes both away again before the user's script runs, which sees the environment it was given.
ENV_SAFE_PATH_SET = "DLSUB_SAFE_PATH_SET"
#: "1" where dlsub's torchrun set PYTORCH_NVML_BASED_CUDA_CHECK for itself, to fork its training processes (torch
#: then asks NVML, not CUDA, whether there are GPUs: a process that initialized CUDA cannot fork one that uses it);
#: the entry point takes both away again before the user's script runs.
ENV_NVML_CHECK_SET = "DLSUB_NVML_CHECK_SET"
#: torch's documented switch for that: torch.cuda.is_available() asks NVML, which does not initialize CUDA.
NVML_CUDA_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"
#: "1" in a worker's container (launch ``--follow``) for its torchrun: it may join its group in process
#: (issue 52: the record below), not through torchrun's rendezvous, which restarts every rank.
ENV_JOIN_IN_PROCESS = "DLSUB_JOIN_IN_PROCESS"
#: Set by that torchrun for the training processes it starts when they join in process: the record they join by.
ENV_REGROUP_JOIN = "DLSUB_REGROUP_JOIN"
CONTAINER_ENV = (ENV_JOB_ID, ENV_JOB_DIR, ENV_ATTEMPT, ENV_ROLE, ENV_CONTAINER, ENV_GPU_TYPE, ENV_RDZV_ENDPOINT,
                 ENV_NNODES, ENV_TRAINER_NODES, ENV_CPU_NODES, ENV_BATCH_SIZE, ENV_PROFILE_STEPS, ENV_PROFILE_SECONDS,
                 ENV_TARGET_LOSS, ENV_WATCH_NO_GPU, ENV_SAFE_PATH_SET)

#: What a container runs as (``$DLSUB_ROLE``): a training process of the group, or the one process of a
#: heterogeneous job's CPU component (``dlsub --cpu-nodes N``). Unset means a trainer.
ROLE_TRAINER = "trainer"
ROLE_CPU = "cpu"
CONTAINER_ROLES = (ROLE_TRAINER, ROLE_CPU)

#: Podman labels on every container the batch script starts; the TaskEpilog and
#: ``dlsub cancel`` find a job's containers by ``label=dlsub.slurm_job_id=<id>``.
LABEL_JOB_ID = "dlsub.job_id"
LABEL_SLURM_JOB_ID = "dlsub.slurm_job_id"
LABEL_ATTEMPT = "dlsub.attempt"
LABEL_NODE = "dlsub.node"
#: The image's name, beside the ID the container runs (submit records the ID: containers.podman.check_image).
LABEL_IMAGE = "dlsub.image"

#: Podman's runtime directory where the node has no ``/run/user/UID`` (batch
#: script, TaskEpilog, dlsub): made mode 0700, refused if another user made it.
RUNTIME_DIR_FALLBACK = "/tmp/dlsub-xdg-{uid}"


def runtime_dir_fallback(uid: int) -> Path:
    return Path(RUNTIME_DIR_FALLBACK.format(uid=uid))


# ---------------------------------------------------------------- GPUs through CDI
#: Where a node's Container Device Interface specs are (the directories Podman reads), and the device kind
#: NVIDIA's `nvidia-ctk cdi generate` names its GPUs by (``nvidia.com/gpu=<index>``). The batch script asks
#: Podman for CDI devices where a spec here names that kind; `dlsub doctor` checks a GPU node has one.
CDI_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
CDI_GPU_KIND = "nvidia.com/gpu"


# ---------------------------------------------------------------- the job directory
# ``$DLSUB_HOME/jobs/<dlsub id>/`` (``~/.dlsub/jobs/<id>/`` by default).

BATCH_SCRIPT = "job.sbatch"
#: Slurm's output file, one per Slurm job (``%j``); all attempts append to it. An elastic job's worker tasks
#: write one each, named as Slurm names an array's by default (a task keeps its index through every rejoin).
OUTPUT_PATTERN = "slurm-%j.out"
WORKER_OUTPUT_PATTERN = "slurm-%A_%a.out"
#: JSON lines from the training library (rank 0): start, progress, checkpoint,
#: restore, exit_for_resume, finished. The agent reads it.
PROGRESS_FILE = "progress.jsonl"
#: JSON lines from the batch script: one ``start`` and one ``end`` per attempt.
ATTEMPTS_FILE = "attempts.jsonl"
#: Checkpoints (mode 0700: only the job's owner reads them).
CHECKPOINT_DIR = "checkpoints"
#: Per-attempt markers (``<slurm id>-<restart>.resume``) and the batch
#: script's count of resume-requeues (``requeues``).
MARKERS_DIR = "attempts"
REQUEUE_COUNT_FILE = "requeues"
#: The batch script of an elastic job's worker array (role ``worker``).
WORKER_SCRIPT = "worker.sbatch"
#: In a job directory (mode 0600): the variables ``dlsub submit --export`` passes into the container, one
#: ``NAME=value`` a line, read by ``podman run --env-file``: their values stay off every command line.
CONTAINER_ENV_FILE = "container.env"
#: In MARKERS_DIR: where a gang's rendezvous is, for the nodes that join it
#: late (worker array tasks). One line, ``<host:port> <attempt> <slurm id>``,
#: written by the main job's batch script at the start of each attempt.
RENDEZVOUS_FILE = "rendezvous"

#: The files of a job directory the agent's account may read (and nothing else).
AGENT_READABLE = (PROGRESS_FILE, ATTEMPTS_FILE)
#: The one directory of a job directory the agent's account may write (ACL
#: u:<agent>:rwx; none where the filesystem has no ACLs): what the agent tells
#: the training. Owned by the job's user, so to the agent it is hostile ground.
AGENT_MAILBOX_DIR = "agent"
#: In AGENT_MAILBOX_DIR: the batch size the agent picked for this job, read by
#: the training library at each (re)start of a script that lets dlsub choose
#: it. One JSON object: ``batch_size`` (global), ``accumulation_steps``
#: (micro-steps per optimiser step, as the agent computed them for the size it
#: gave the job), ``reason``, ``time``. Written whole under a temporary name,
#: then renamed.
BATCH_FILE = "batch.json"
#: The most bytes of BATCH_FILE anyone writes or reads.
MAILBOX_MAX_BYTES = 4096
#: Where the batch size a run uses came from (its start event's ``batch_from``):
#: ``$DLSUB_BATCH_SIZE``, BATCH_FILE, or the script's declared initial batch.
BATCH_SOURCES = ("environment", "agent", "declared")


def batch_file(job_dir: Path) -> Path:
    """Where the agent leaves the batch size it picked for the job in ``job_dir``."""
    return job_dir / AGENT_MAILBOX_DIR / BATCH_FILE


def output_file(job_dir: Path, slurm_job_id: int) -> Path:
    return job_dir / OUTPUT_PATTERN.replace("%j", str(int(slurm_job_id)))


def resume_marker(job_dir: Path, attempt: str) -> Path:
    """The file whose presence says that ``attempt`` asked to be resumed."""
    return job_dir / MARKERS_DIR / f"{attempt}.resume"


#: What a container's name may be for its exit record (the batch script's: dlsub-<id>-<job>-<restart>-<role><n>).
CONTAINER_NAME_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.-]{0,199}\Z")


def exit_record(job_dir: Path, container: str) -> Path:
    """Where a container's launcher writes its exit status, for the batch script to read when Podman loses it
    (``podman run`` exits 127, "container has already been removed", when a signal it proxies meets the
    container's exit)."""
    return job_dir / MARKERS_DIR / f"{container}.exit"


#: What torch says when a script asks for CUDA where there is none (torch/cuda/__init__.py: a CPU build, no driver,
#: no device visible). A training process that dies of one of these leaves no_gpu_error_marker().
NO_GPU_ERRORS = ("Torch not compiled with CUDA enabled", "Found no NVIDIA driver on your system",
                 "No CUDA GPUs are available", "CUDA driver initialization failed")


def no_gpu_error_marker(job_dir: Path, attempt: str) -> Path:
    """Written by a training process of ``attempt`` that died of one of NO_GPU_ERRORS (its first line, at most
    200 characters): the launcher reads it when the attempt ends (the job's own file: it only decides what the
    job's own attempt does next)."""
    return job_dir / MARKERS_DIR / f"{attempt}.no-gpu"


#: Written by the launcher when it sends a job back for a GPU: never twice for one job.
NEEDS_GPU_SENT_FILE = "needs-gpu-sent"


def reform_marker(job_dir: Path, attempt: str) -> Path:
    """Touched by the main job's launcher each time ``attempt``'s group re-forms after a member left: the
    workers that were not asked to leave re-form with it (launch ``--follow``)."""
    return job_dir / MARKERS_DIR / f"{attempt}.reform"


def regroup_record(job_dir: Path, attempt: str) -> Path:
    """Written by rank 0 of ``attempt``'s group once the training re-forms in process (issue 52): where the group's
    store is, so that a worker that joins becomes a member without a restart (JSON: addr, port, prefix, backend)."""
    return job_dir / MARKERS_DIR / f"{attempt}.regroup"


def join_failed_marker(temporary_dir: Path, agent_pid: int) -> Path:
    """Made by a training process that could not join its group in process, for its torchrun (``agent_pid``): it
    joins through torchrun's rendezvous instead, today's restart."""
    return temporary_dir / f"dlsub-join-failed.{agent_pid}"


def joining_marker(temporary_dir: Path, agent_pid: int, pid: int) -> Path:
    """Made by training process ``pid`` as it begins to join its group in process, removed once it has joined: one
    left behind tells its torchrun (``agent_pid``) that the process died while joining (killed; it could not say
    so), and the torchrun joins through the rendezvous instead, as after a join_failed_marker."""
    return temporary_dir / f"{_joining_prefix(agent_pid)}{pid}"


def joining_markers(temporary_dir: Path, agent_pid: int) -> list[Path]:
    """The joining_marker files that processes of torchrun ``agent_pid`` left behind."""
    return sorted(temporary_dir.glob(f"{_joining_prefix(agent_pid)}*"))


def _joining_prefix(agent_pid: int) -> str:
    return f"dlsub-join-failed.{agent_pid}.joining."


def left_in_process_marker(temporary_dir: Path, agent_pid: int) -> Path:
    """Made by a training process that left its group in process (issue 52), for its torchrun (``agent_pid``, in
    the same container, whose temporary folder is ``temporary_dir``): its group goes on without this node, so
    torchrun neither waits for the others at its exit barrier nor closes their rendezvous; it takes this node out
    of it."""
    return temporary_dir / f"dlsub-left-in-process.{agent_pid}"


# Output lines (OUTPUT_PATTERN). With several training processes every line says where it came from, as
# torchrun's --tee labels it: ``[<global rank>]:`` on one node, ``[<node>/<global rank>]:`` in a gang; the
# launcher's and torchrun's own lines carry LAUNCHER_SOURCE for a rank. A process alone is not labelled.
# dlsub labels every line it hands on, so a line's first label is dlsub's (a script may print fake ones).
OUTPUT_LABEL = "[{source}]:"
OUTPUT_GANG_LABEL = "[{node}/{source}]:"
LAUNCHER_SOURCE = "dlsub"
OUTPUT_LABEL_RE = re.compile(rb"\A\[(?:(?P<node>[A-Za-z0-9._-]{1,64})/)?(?P<source>[0-9]{1,7}|dlsub)\]:")
#: In the container: the launcher's socket, to which each training process hands its stdout and stderr.
ENV_OUTPUT_SOCKET = "DLSUB_OUTPUT_SOCKET"


# Progress events (``PROGRESS_FILE``) and attempt events (``ATTEMPTS_FILE``).
EVENT_START = "start"
EVENT_PROGRESS = "progress"
EVENT_CHECKPOINT = "checkpoint"
EVENT_RESTORE = "restore"
EVENT_EXIT_FOR_RESUME = "exit_for_resume"
EVENT_FINISHED = "finished"
EVENT_END = "end"
#: The training asked ``should_stop()`` for the first time since its start: its loop handles dlsub's stop, and
#: the documented loops save when it says so. The agent takes it, as a framework adapter's ``saves`` on its
#: start event, as saving whenever asked: such a job is moved or continued before its first checkpoint.
EVENT_POLLS = "polls"
#: The group re-formed in process (a member left or joined, issue 52): the processes that stay did not restart.
#: Its ``world_size`` is the new size, ``paused_s`` how long rank 0 stood still.
EVENT_REGROUPED = "regrouped"
#: The events that set the size the training runs at: its starts, and its re-formations in process.
SIZE_EVENTS = (EVENT_START, EVENT_REGROUPED)
#: In a start event: :func:`application_digest` of the training's command. The
#: agent keeps what a user's runs of one command measured (their throughput
#: at each size), so that the next run starts at the size it scales to.
APPLICATION_FIELD = "application"
_APPLICATION_DIGEST = re.compile(r"^[0-9a-f]{32}\Z")


#: A script bigger than this is not read to name its command (a Python script is kilobytes).
MAX_SCRIPT_BYTES = 16 << 20


def application_digest(script: bytes, args: Sequence[str]) -> str:
    """Which command a training is: its script's bytes and its arguments (a
    different model or batch size is another command), as 32 hex digits."""
    digest = hashlib.sha256(script)
    for arg in args:
        digest.update(b"\0" + arg.encode("utf-8", "surrogateescape"))
    return digest.hexdigest()[:32]


#: A GPU type's name, as Slurm's GRES gives one (gpu:a100:4): the batch script's reading of a node's GRES
#: (slurm_plugins/batch.sh) and the agent's checks of what a job says share it.
GPU_TYPE_PATTERN = r"[A-Za-z0-9._-]{1,64}"
_GPU_TYPE = re.compile(GPU_TYPE_PATTERN + r"\Z")


def valid_gpu_type(value: object) -> str | None:
    """A GPU type as Slurm's GRES names one (``a100``); None for anything else (a start event is the job's word,
    and the type becomes part of the agent's keys)."""
    return value if isinstance(value, str) and _GPU_TYPE.match(value) else None


def valid_application(value: object) -> str | None:
    """A start event's application digest if it is one (the event is the job's word); None otherwise."""
    return value if isinstance(value, str) and _APPLICATION_DIGEST.match(value) else None


#: How an attempt ended, in an ``end`` event's ``action``: requeued to resume
#: where it was, or requeued held for the agent to move.
ACTION_REQUEUE = "requeue"
ACTION_MOVE = "move"
#: A worker of an elastic job left the group (shrink, or the group stopped)
#: and went back to its held pool.
ACTION_LEAVE = "leave"
#: An attempt on CPUs of a job that asked for GPUs died of torch's no-GPU error (immediate mode): requeued held
#: for the agent to send it to wait for its GPU partition, as ideal mode would have; once per job.
ACTION_NEEDS_GPU = "needs-gpu"
#: The attempt was superseded (a newer attempt of the job started while it still ran: its node was cut off or
#: its slurmd lost, and Slurm requeued the job elsewhere): it stopped and left Slurm alone.
ACTION_SUPERSEDED = "superseded"
ATTEMPT_ACTIONS = (ACTION_REQUEUE, ACTION_MOVE, ACTION_LEAVE, ACTION_NEEDS_GPU, ACTION_SUPERSEDED)

# ---------------------------------------------------------------- fencing (issue 53)
# Every attempt of a job is ``<slurm job id>-<restart count>`` (ENV_ATTEMPT), and attempts are ordered by the
# two numbers: Slurm's ids and restart counts only grow. The batch launcher of each attempt writes its
# ``start`` record (ATTEMPTS_FILE, role ``main``) before its container starts. An attempt that sees the start
# of a newer one is superseded: it publishes nothing more (no checkpoint, no seal, no progress record), its
# launcher stops its training, and its batch launcher leaves the Slurm job alone. A checkpoint records the
# attempt that wrote it and when (``attempt``, ``time``); one written after a newer attempt began (a node cut
# off that kept writing, a write that landed late) is never restored.

_ATTEMPT = re.compile(r"\A([0-9]{1,12})-([0-9]{1,9})\Z")


def attempt_order(attempt: object) -> tuple[int, int] | None:
    """``(slurm job id, restart count)`` of an attempt's name, for ordering attempts; None for anything else
    (``local``, a run outside Slurm, is never fenced)."""
    match = _ATTEMPT.match(attempt) if isinstance(attempt, str) else None
    return (int(match.group(1)), int(match.group(2))) if match else None


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def superseded_since(attempt: object, records: Iterable[Mapping[str, object]]) -> tuple[str, float] | None:
    """(the newer attempt, when it started) of the first attempt ordered after ``attempt`` among ``records``
    (ATTEMPTS_FILE's events, as read); None while ``attempt`` is the newest, or is not an attempt's name."""
    own = attempt_order(attempt)
    if own is None:
        return None
    first: tuple[str, float] | None = None
    for record in records:
        if record.get("event") != EVENT_START or record.get("role") != "main":
            continue
        job, restart, when = (_number(record.get("slurm_job_id")), _number(record.get("restart", 0)),
                              _number(record.get("time")))
        if job is None or restart is None or when is None:
            continue
        order = (int(job), int(restart))
        if order > own and (first is None or when < first[1]):
            first = (f"{order[0]}-{order[1]}", when)
    return first


def written_after_superseded(meta: Mapping[str, object], records: Iterable[Mapping[str, object]]) -> str | None:
    """Why a checkpoint whose record (``meta``: ``attempt``, ``time``) says it was written after a newer attempt
    of its job began is not the job's; None when it is (or it records no attempt: written outside Slurm or by an
    older dlsub)."""
    when = _number(meta.get("time"))
    newer = superseded_since(meta.get("attempt"), records) if when is not None else None
    if when is None or newer is None or when < newer[1]:
        return None
    return (f"written by attempt {meta.get('attempt')} after attempt {newer[0]} began (a superseded attempt's "
            "late write)")


# The events' schema: what the agent accepts (dlsub/jobdir.py checks each
# event against it and drops any that does not fit).
#: The events of a progress file and of an attempts file.
PROGRESS_EVENTS = (EVENT_START, EVENT_PROGRESS, EVENT_CHECKPOINT, EVENT_RESTORE, EVENT_EXIT_FOR_RESUME,
                   EVENT_FINISHED, EVENT_POLLS, EVENT_REGROUPED)
ATTEMPT_EVENTS = (EVENT_START, EVENT_END)
#: Sane bounds for the fields of an event.
MIN_TIME, MAX_TIME = 946_684_800.0, 4_102_444_800.0  # 2000-01-01 .. 2100-01-01
MAX_STEP = 10**12
MAX_SAMPLES = 10**15
MAX_EPOCH = 10**9
MAX_ABS_LOSS = 1e12
#: Most micro-steps per optimiser step a report may claim.
MAX_ACCUMULATION = 10**6
#: The largest global batch a report may claim (as dlsub.batch_split.MAX_BATCH).
MAX_REPORTED_BATCH = 10**9
#: Every event has ``event`` and ``time`` (seconds since the epoch, MIN_TIME..MAX_TIME). The optional fields
#: of a progress event: name, kind and bounds. Kinds: ``int`` and ``num`` (inclusive low, high), ``text`` (at
#: most 64 characters), ``one_of`` (the choices), ``batch_limits`` (a script's declared batch limits,
#: ``BatchLimits.to_event()``).
#: A start event's ``saves``: the training checkpoints whenever dlsub asks (its stop is handled in its loop).
SAVES_ON_REQUEST = "on_request"
#: A progress event's ``counted``: its step counts the loop's should_stop() calls, not a step it reported.
COUNTED = "polls"
PROGRESS_FIELDS: tuple[tuple[str, str, tuple[object, ...]], ...] = (
    ("step", "int", (0, MAX_STEP)),
    ("epoch", "num", (0, MAX_EPOCH)),
    ("loss", "num", (-MAX_ABS_LOSS, MAX_ABS_LOSS)),
    ("samples", "int", (0, MAX_SAMPLES)),
    ("total_steps", "int", (1, MAX_STEP)),
    ("total_epochs", "int", (1, MAX_EPOCH)),
    ("seq", "int", (0, MAX_STEP)),
    ("attempt", "text", ()),
    ("world_size", "int", (1, 10**6)),  # start events: the group's size (elastic jobs change it)
    ("nodes", "int", (1, 10**5)),
    # start events: the type of the GPUs the group trains on (ENV_GPU_TYPE, as the batch script read it from
    # Slurm's GRES); the agent keeps what a job measured on each kind apart (valid_gpu_type).
    ("gpu_type", "text", ()),
    # start events of a training that saves whenever dlsub asks, within its own loop (the framework adapters,
    # ``SAVES_ON_REQUEST``): the agent may move or continue it before its first checkpoint.
    ("saves", "one_of", ((SAVES_ON_REQUEST,),)),
    # start events: the training's command (APPLICATION_FIELD, application_digest): what the agent keys the
    # measurements earlier runs of the same command lend a job by (valid_application).
    (APPLICATION_FIELD, "text", ()),
    # A script that lets dlsub choose its batch size: its declared limits (start events), the global
    # batch and micro-steps per optimiser step it runs, where that batch came from (start events), and
    # Pollux's gradient-noise statistics at the initial batch's scale (progress reports).
    ("batch_limits", "batch_limits", ()),
    ("batch_size", "int", (1, MAX_REPORTED_BATCH)),
    ("accumulation_steps", "int", (1, MAX_ACCUMULATION)),
    ("batch_from", "one_of", (BATCH_SOURCES,)),
    ("grad_sqr", "num", (0, float("inf"))),
    ("grad_var", "num", (0, float("inf"))),
    # Progress events the library wrote for a loop that has not called report(): its step is a count of its
    # should_stop() calls (COUNTED). The agent never mixes such a point with a loop's own reports in one rate.
    ("counted", "one_of", ((COUNTED,),)),
)
# An attempt event (written by the batch script): ``slurm_job_id`` (required), ``restart`` (0 if absent),
# and, at its end, ``rc``, ``action`` (one of ATTEMPT_ACTIONS), ``signal``; where it ran: ``node``,
# ``partition``, ``nodes``, ``gpus``, ``gpu_type``, ``role``; at its start, ``dlsub_version``, the installation's.

# ---------------------------------------------------------------- ids and comment tags

# Patterns end in \Z, not $: Python's $ also matches before a final newline.

#: A dlsub job's own id: 8 lower-case hex digits.
DLSUB_ID = re.compile(r"^[0-9a-f]{8}\Z")
COMMENT_PREFIX = "dlsub:"
MODES = ("immediate", "ideal")
ROLES = ("main", "worker")
_PARTITION = re.compile(r"^[A-Za-z0-9._-]{1,64}\Z")
#: The most images a job's ``images=`` tag records (the site's partition_images may name no more).
MAX_PARTITION_IMAGES = 5


def valid_partition(value: object) -> bool:
    """Whether ``value`` is one partition's name as Slurm spells them (letters, digits, ``._-``): a plain word, safe
    in a tag and as a shell ``case`` pattern."""
    return isinstance(value, str) and _PARTITION.match(value) is not None
_TAG = re.compile(r"^([a-z_]{1,32})=([A-Za-z0-9._-]{0,64})\Z")
_TAG_KEYS = ("mode", "ideal", "gpus", "role", "nodes", "step", "script", "app", "gpu_type", "image", "images",
             "pin")
#: The image a job runs, in its tags: the first 12 hex digits of its ID, as `podman images` shows it.
_IMAGE_TAG = re.compile(r"^[0-9a-f]{12}\Z")
#: Most GPUs a tag may ask for; the admin's policy caps it further.
MAX_GPUS = 1024
#: Most nodes an elastic range may name.
MAX_NODES = 4096
_RANGE = re.compile(r"^(\d{1,4})-(\d{1,4})\Z")


class ContractError(ValueError):
    """Something claims to follow the contract and does not."""


@dataclass(frozen=True)
class Tags:
    """What a dlsub job says about itself in its Slurm ``--comment``.

    ``dlsub:<id>;mode=immediate;ideal=gpu;gpus=1``. Comments are public
    (``squeue -o %k``) and their owner may rewrite them at any time
    (``scontrol update Comment=``): the agent trusts only the copy that
    ``job_submit.lua`` froze at submit time (:class:`SubmitRecord`).
    """

    dlsub_id: str
    mode: str = "ideal"
    ideal: str | None = None  # the partition it should end up on (None: where it is)
    gpus: int = 0  # GPUs per node it asked for (immediate mode starts some jobs with none)
    role: str = "main"
    # An elastic job's range of members, (MIN, MAX) with MIN < MAX: the main job
    # holds MIN nodes, its held worker array the rest. None: a fixed size.
    nodes: tuple[int, int] | None = None
    step: int = 0  # GPUs of each worker of a job elastic in GPUs (--gpus MIN:MAX); 0: whole nodes
    # Submit read its script as one that uses no dlsub library (``script=plain``): the agent may restart it
    # from scratch on its GPUs, once its attempt also runs without the library's start event. A job without
    # the tag (submitted by hand, or by a dlsub before it) is never restarted so.
    plain: bool = False
    # The command it trains (application_digest of its script and arguments, as submit read them): before its
    # first start event says so, what lets the agent weigh an elastic job that waits by what its user's earlier
    # runs of the same command measured (``app=``). None: not said.
    application: str | None = None
    # The kind of GPU it asked for (``gpu_type=a100``), where it starts without it (immediate mode, on CPUs):
    # the agent's move onto its GPUs asks for that kind. None: any kind.
    gpu_type: str | None = None
    # The image it runs (``image=1673d281b98a``, its ID's first 12 hex digits, as submit found it): what
    # `dlsub doctor` counts to tell a site which versions of its images jobs still use. None: not said.
    image: str | None = None
    # The site's images per partition it may run (``images=1673d281b98a.88aa11bb22cc``: each ID's first 12 hex
    # digits, joined by '.'; the site's policy.toml [containers] partition_images, at most five): counted with
    # ``image`` by `dlsub doctor`. Empty: none.
    images: tuple[str, ...] = ()
    # Its user named its partition (``pin=partition``: ``-p``): the agent never places it (an elastic job that
    # waits) on another partition.
    pinned: bool = False

    def __post_init__(self) -> None:
        if not DLSUB_ID.match(self.dlsub_id):
            raise ContractError(f"dlsub id {self.dlsub_id!r} is not 8 hex digits")
        if self.mode not in MODES:
            raise ContractError(f"mode {self.mode!r}; valid modes: {', '.join(MODES)}")
        if self.ideal is not None and not _PARTITION.match(self.ideal):
            raise ContractError(f"partition name {self.ideal!r} has characters Slurm does not use")
        if not 0 <= self.gpus <= MAX_GPUS:
            raise ContractError(f"gpus={self.gpus} is outside 0..{MAX_GPUS}")
        if self.role not in ROLES:
            raise ContractError(f"role {self.role!r}; valid roles: {', '.join(ROLES)}")
        if self.nodes is not None and not 1 <= self.nodes[0] < self.nodes[1] <= MAX_NODES:
            raise ContractError(f"nodes={self.nodes[0]}-{self.nodes[1]} is not a range MIN-MAX with "
                                f"1 <= MIN < MAX <= {MAX_NODES}")
        if not 0 <= self.step <= MAX_GPUS or (self.step and self.nodes is None):
            raise ContractError(f"step={self.step}: a GPU step 1..{MAX_GPUS} of an elastic range")
        if self.application is not None and valid_application(self.application) is None:
            raise ContractError(f"app={self.application!r} is not an application digest (32 hex digits)")
        if self.gpu_type is not None and valid_gpu_type(self.gpu_type) is None:
            raise ContractError(f"gpu_type={self.gpu_type!r} is not a GPU type's name")
        if self.image is not None and not _IMAGE_TAG.match(self.image):
            raise ContractError(f"image={self.image!r} is not an image ID's first 12 hex digits")
        if len(self.images) > MAX_PARTITION_IMAGES or not all(_IMAGE_TAG.match(i) for i in self.images):
            raise ContractError(f"images={'.'.join(self.images)!r} is not up to {MAX_PARTITION_IMAGES} image IDs' "
                                "first 12 hex digits")

    def comment(self) -> str:
        parts = [f"{COMMENT_PREFIX}{self.dlsub_id}", f"mode={self.mode}"]
        if self.ideal:
            parts.append(f"ideal={self.ideal}")
        parts.append(f"gpus={self.gpus}")
        if self.role != "main":
            parts.append(f"role={self.role}")
        if self.nodes is not None:
            parts.append(f"nodes={self.nodes[0]}-{self.nodes[1]}")
        if self.step:
            parts.append(f"step={self.step}")
        if self.plain:
            parts.append("script=plain")
        if self.application:
            parts.append(f"app={self.application}")
        if self.gpu_type:
            parts.append(f"gpu_type={self.gpu_type}")
        if self.image:
            parts.append(f"image={self.image}")
        if self.images:
            parts.append(f"images={'.'.join(self.images)}")
        if self.pinned:
            parts.append("pin=partition")
        return ";".join(parts)

    @classmethod
    def parse(cls, comment: str | None) -> Tags | None:
        """The tags of a dlsub comment; None when it is not one, or is malformed in any way.

        Strict: one bad tag, an unknown key or a repeated key rejects the
        whole comment rather than trusting part of it.
        """
        text = comment or ""
        if not text.startswith(COMMENT_PREFIX) or len(text) > 512:
            return None
        head, *rest = text[len(COMMENT_PREFIX):].split(";")
        values: dict[str, str] = {}
        for part in rest:
            m = _TAG.match(part)
            if not m or m.group(1) in values or m.group(1) not in _TAG_KEYS:
                return None
            values[m.group(1)] = m.group(2)
        gpus, step = values.get("gpus", "0"), values.get("step", "0")
        if not (gpus + step).isdigit() or len(gpus) > 5 or len(step) > 5:
            return None
        nodes = None
        if "nodes" in values:
            m = _RANGE.match(values["nodes"])
            if not m:
                return None
            nodes = (int(m.group(1)), int(m.group(2)))
        if values.get("script", "plain") != "plain" or values.get("pin", "partition") != "partition":
            return None
        try:
            return cls(head, values.get("mode", "ideal"), values.get("ideal") or None, int(gpus),
                       values.get("role", "main"), nodes, int(step), "script" in values, values.get("app"),
                       values.get("gpu_type"), values.get("image"),
                       tuple(values["images"].split(".")) if values.get("images") else (), "pin" in values)
        except ContractError:
            return None


# ---------------------------------------------------------------- the submit record
# job_submit.lua (slurm_plugins/job_submit.lua) runs inside slurmctld at
# submit time and copies the job's request into its AdminComment, which
# users cannot update (only Slurm administrators can). The agent trusts
# this record, not the comment:
#
#   dlsub-submit:v1;uid=1001;partition=cpu;time=60;tres=gres:gpu:1|<comment as submitted>
#
# ``time`` is minutes (empty: the partition's default), ``tres`` is Slurm's
# TresPerNode (empty: no GRES), ``partition`` empty means the default one.

SUBMIT_RECORD_PREFIX = "dlsub-submit:v1;"
_RECORD_FIELD = re.compile(r"^(uid|partition|time|tres)=([A-Za-z0-9._:,/=-]{0,128})\Z")


@dataclass(frozen=True)
class SubmitRecord:
    """The request a dlsub job was submitted with, as job_submit.lua froze it."""

    uid: int
    partition: str | None
    time_limit_min: int | None
    gpus_per_node: int  # from Slurm's own TresPerNode at submit
    tags: Tags  # the comment as it was at submit
    gpu_type: str | None = None  # the one kind of GPU its TresPerNode named at submit (gres:gpu:a100:1); None: any

    @classmethod
    def parse(cls, admin_comment: str | None) -> SubmitRecord | None:
        text = admin_comment or ""
        if not text.startswith(SUBMIT_RECORD_PREFIX) or "|" not in text or len(text) > 1024:
            return None
        head, _, comment = text[len(SUBMIT_RECORD_PREFIX):].partition("|")
        values: dict[str, str] = {}
        for part in head.split(";"):
            m = _RECORD_FIELD.match(part)
            if not m or m.group(1) in values:
                return None
            values[m.group(1)] = m.group(2)
        tags = Tags.parse(comment)
        uid, time_text = values.get("uid", ""), values.get("time", "")
        if tags is None or not uid.isdigit() or (time_text and not time_text.isdigit()):
            return None
        partition = values.get("partition") or None
        if partition is not None and not all(_PARTITION.match(p) for p in partition.split(",")):
            return None
        return cls(int(uid), partition, int(time_text) if time_text else None,
                   gpus_in_tres(values.get("tres", "")), tags, gpu_type_in_gres(values.get("tres", "")))


def gpus_in_tres(tres: str | None) -> int:
    """GPUs in a GRES/TRES string: ``gpu:4``, ``gres:gpu:2``, ``gres/gpu=2``, ``gpu:a100:2(S:0)``."""
    total = 0
    for item in (tres or "").split(","):
        item = item.split("(")[0].replace("gres/", "gres:").replace("=", ":")
        parts = item.split(":")
        if parts and parts[0] == "gres":
            parts = parts[1:]
        if parts and parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
            total += int(parts[-1])
    return total


def gpu_type_in_gres(gres: str | None) -> str | None:
    """The one kind of GPU a GRES string names (``gpu:a100:4(S:0)`` -> ``a100``); None where it names none
    (``gpu:4``), several, or one that is not a GPU type's name (:data:`GPU_TYPE_PATTERN`)."""
    kinds = set()
    for item in (gres or "").split(","):
        parts = item.split("(")[0].replace("gres/", "gres:").replace("=", ":").split(":")
        if parts and parts[0] == "gres":
            parts = parts[1:]
        if len(parts) >= 3 and parts[0] == "gpu" and parts[-1].isdigit():
            kinds.add(parts[1])
        elif len(parts) == 2 and parts[0] == "gpu" and parts[1].isdigit():
            kinds.add("")  # untyped GPUs beside typed ones: no one kind
    kind = kinds.pop() if len(kinds) == 1 else None
    return valid_gpu_type(kind)


# ---------------------------------------------------------------- job states


class JobState(StrEnum):
    """A dlsub job's state, one model for the CLI, the stores and the agent.

    ::

        PENDING ──► RUNNING ──► COMPLETED | FAILED | CANCELLED | TIMEOUT | PREEMPTED
           ▲  │        │ ▲                         │
           │  │        ▼ │                         │ scontrol requeue of an ended batch job
           └──┼──── REQUEUED ◄─────────────────────┘
              │          (checkpointed: time limit, dlsub requeue, a move, a node failure; same Slurm job)
              └──► CANCELLED | FAILED   (ended before it ever ran)

    That is how a job moves in Slurm. What dlsub *sees* of it are samples
    (``dlsub status`` when the user looks, the agent every tick): a job may
    run and end between two looks, so a PENDING job is next seen COMPLETED,
    a REQUEUED one TIMEOUT. :func:`check_transition` therefore connects any
    live state to any other state; see there for what it still refuses.

    ``UNKNOWN`` is "cannot tell now" (Slurm has forgotten the job and it
    left no end record). ``PREEMPTED`` is final: Slurm shows it only for a
    job it ended by preemption; a job Slurm requeues on preemption shows
    ``REQUEUED``/``PENDING`` instead and carries on.
    """

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    REQUEUED = "REQUEUED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    PREEMPTED = "PREEMPTED"
    UNKNOWN = "UNKNOWN"

    @property
    def terminal(self) -> bool:
        return self in FINAL_STATES

    @property
    def live(self) -> bool:
        return self in _LIVE

    @classmethod
    def from_slurm(cls, slurm_state: str) -> JobState:
        """Slurm's job state (``squeue``/``sacct``; ``CANCELLED by 1001`` too) as a dlsub state."""
        word = (slurm_state or "").split()[0].upper() if (slurm_state or "").strip() else ""
        return _FROM_SLURM.get(word, cls.UNKNOWN)


FINAL_STATES = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT,
                          JobState.PREEMPTED})
_LIVE = frozenset({JobState.PENDING, JobState.RUNNING, JobState.REQUEUED})


class StateSource(StrEnum):
    """Where a job's state was seen. Only slurmctld knows a job's present; the others can only lag it."""

    #: slurmctld lists the job (``squeue``, ``scontrol``): its state now, requeues included.
    CONTROLLER = "controller"
    #: slurmdbd's record (``sacct``), read once slurmctld has forgotten the job (MinJobAge): it lags the
    #: controller (a job's end reaches it late, or not yet when slurmdbd was down) and never goes back.
    ACCOUNTING = "accounting"
    #: Slurm tells nothing: what the job's own directory says (its end records). dlsub's inference.
    JOB_FILES = "job files"


_WAITING = frozenset({JobState.PENDING, JobState.REQUEUED})


def _behind(current: JobState, new: JobState) -> bool:
    """Whether ``new`` is an earlier point of a job's life than ``current``, as one attempt runs: waiting,
    then running, then ended. Only a requeue goes back, and only slurmctld sees one."""
    order = {**dict.fromkeys(_WAITING, 0), JobState.RUNNING: 1, **dict.fromkeys(FINAL_STATES, 2)}
    return new in order and current in order and order[new] < order[current]


_FROM_SLURM = {
    **dict.fromkeys(("PENDING", "CONFIGURING", "RESV_DEL_HOLD"), JobState.PENDING),
    **dict.fromkeys(("RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "RESIZING", "SIGNALING", "STAGE_OUT"),
                    JobState.RUNNING),
    **dict.fromkeys(("REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "SPECIAL_EXIT"), JobState.REQUEUED),
    "COMPLETED": JobState.COMPLETED,
    "CANCELLED": JobState.CANCELLED,
    **dict.fromkeys(("TIMEOUT", "DEADLINE"), JobState.TIMEOUT),
    **dict.fromkeys(("FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"), JobState.FAILED),
    "PREEMPTED": JobState.PREEMPTED,
}


class IllegalTransition(ContractError):
    """A store was asked to record a state that cannot follow the one it holds, given where it was seen."""


def check_transition(old: JobState | str | None, new: JobState | str,
                     source: StateSource = StateSource.CONTROLLER) -> JobState:
    """``new`` as a JobState, if a job recorded ``old`` (None: never seen) may be seen in it next; else raise.

    Observed states are samples, so any live state may be followed by any other: a job seen PENDING may
    have run and ended before the next look (the user who submits, looks once and comes back an hour
    later). What this guards, and all it guards, is that nothing *less* informed than what was already
    seen replaces it:

    - an ended job is never shown UNKNOWN once Slurm forgets it (its final state stands);
    - only slurmctld itself can show a job going back: an ended job listed live again (``scontrol
      requeue`` of a finished batch job, a requeue dlsub did not see happen), or a running one waiting
      again. Slurm's accounting and the job's files only lag the controller, so from them an earlier
      point of the job's life than the recorded one is their lag, not the job's news;
    - the job's own files never overrule the final state Slurm gave (files say FAILED for what Slurm
      called TIMEOUT); Slurm's accounting may (it holds the last attempt's end).
    """
    target = JobState(new)
    if old is None:
        return target
    current = JobState(old)
    seen = StateSource(source)
    if target == current or not current.terminal and seen == StateSource.CONTROLLER:
        return target
    if target == JobState.UNKNOWN:
        if current.terminal:
            raise IllegalTransition(f"a {current.value} job is not shown UNKNOWN when Slurm forgets it "
                                    "(final states stand)")
        return target
    if seen != StateSource.CONTROLLER and _behind(current, target):
        raise IllegalTransition(f"{seen.value} showing {target.value} lags the {current.value} slurmctld "
                                "showed (only slurmctld sees a job go back)")
    if current.terminal and target.terminal and seen == StateSource.JOB_FILES:
        raise IllegalTransition(f"the job's files do not overrule the {current.value} Slurm gave it "
                                "(final states stand)")
    return target
