"""torchrun, run by dlsub's launcher: ``python3 -m dlsub.checkpointing.torchrun_main [--from-stdin] [ARGS]``.

It is torchrun itself (``torch.distributed.run``'s ``main``, which the
``torchrun`` script calls) with differences that only change how fast a
group starts and re-forms (a member joined, or left and the launcher
starts torchrun again: :mod:`dlsub.checkpointing.launch`):

* ``--from-stdin``: it imports torch first and only then reads its command
  line, one JSON list of strings, from standard input. The launcher starts
  it while the old group is still stopping, so the ~2 s of CPU the import
  costs overlap the old group's exit instead of following it. Standard
  input is then ``/dev/null``, as the training processes had it before.
* Each training process gets the CPUs Slurm gave the job on the node,
  shared among them, as its OpenMP threads (``OMP_NUM_THREADS``; where
  nothing set it already): torch alone would take the whole node's cores.
* At exit it freezes Python's collector: its passes over torch's objects
  cost about a second of CPU, and the next torchrun cannot listen on the
  group's port before this one has exited.
* Its training processes are forked from it, where torch is already
  imported, rather than each a Python of its own
  (:mod:`dlsub.checkpointing.forked_rank`, through torchrun's own
  ``--run-path`` and ``--start-method fork``): when torchrun's command for
  them is dlsub's entry point, or a script that runs as one process alone
  (the launcher leaves the entry point out there: its output needs no
  labels), where this torch has ``--run-path``, unless CUDA is initialized
  here (a context does not survive a fork) or ``$DLSUB_RANK_START`` is
  ``exec``. torchrun's heap is frozen before each fork, and each process
  ends as soon as it has handed torchrun its return value
  (:mod:`dlsub.checkpointing.fork_context`). For a group of several it
  first imports what each would import when it wraps its model in
  DistributedDataParallel
  (``IMPORTS_FOR_THE_PROCESSES``; with ``--from-stdin`` before the command
  comes, as torch).

* Where its group may span nodes (c10d rendezvous), a node that stops
  answering restarts the group without it, and a node dropped so ends
  instead of joining again (:mod:`dlsub.checkpointing.group_membership`;
  exit code ``LEFT_THE_GROUP``).

Anything the launcher could not hand over (no line, a line that is not a
list of strings) ends it with exit code 2 before torchrun runs.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import gc
import importlib
import io
import json
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dlsub.checkpointing import group_membership
from dlsub.contract import (
    ENV_JOIN_IN_PROCESS,
    ENV_NVML_CHECK_SET,
    ENV_REGROUP_JOIN,
    NVML_CUDA_CHECK,
    join_failed_marker,
    joining_markers,
)

#: ``exec`` here: the training processes start as torchrun starts them, each a Python of its own.
ENV_RANK_START = "DLSUB_RANK_START"
#: Its exit code when this node was dropped from its group while cut off (group_membership.LeftTheGroup).
LEFT_THE_GROUP = 3


def _argv_from_stdin() -> list[str] | None:
    line = sys.stdin.readline()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # the training processes inherit it: they read EOF, as under plain torchrun
    os.close(null)
    try:
        argv = json.loads(line) if line else None
    except ValueError:
        return None
    if not isinstance(argv, list) or not all(isinstance(word, str) for word in argv):
        return None
    return argv


#: What each training process would import when it wraps its model in DistributedDataParallel (torch._dynamo, and
#: through it inductor, sympy: about 800 modules, 3 s of CPU a process, 8 s for four on a node's two cores between
#: a re-formed group's start and its first step): imported once here, forked processes start with it.
IMPORTS_FOR_THE_PROCESSES = ("torch._dynamo",)


def _import_for_the_processes() -> None:
    """Import IMPORTS_FOR_THE_PROCESSES; the exit handlers they register are kept apart
    (:data:`dlsub.checkpointing.forked_rank.HANDLERS_OF_IMPORTS`): a forked process drops torchrun's own and
    registers these again, as a process that imported them itself has them."""
    from dlsub.checkpointing import forked_rank

    register = atexit.register

    def kept(func: Callable[..., object], *args: object, **kwargs: object) -> Callable[..., object]:
        forked_rank.HANDLERS_OF_IMPORTS.append((func, args, kwargs))
        return register(func, *args, **kwargs)

    atexit.register = kept  # type: ignore[assignment]
    try:
        for name in IMPORTS_FOR_THE_PROCESSES:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - an optimisation: a torch without it, or failing to import it, runs as is
                continue
    finally:
        atexit.register = register


def _torchrun_options(args: list[str]) -> argparse.Namespace | None:
    """torchrun's own reading of ``args`` (None where it would refuse them: torchrun then says why itself)."""
    from torch.distributed.run import get_args_parser

    try:
        with contextlib.redirect_stderr(io.StringIO()):
            return get_args_parser().parse_args(args)
    except SystemExit:
        return None


def _one_process(options: argparse.Namespace) -> bool:
    """torchrun starts one training process, and no other node's can join its group."""
    return str(options.nproc_per_node) == "1" and str(options.nnodes) in ("1", "1:1")


def _across_nodes(options: argparse.Namespace) -> bool:
    """The group may span nodes (``--nnodes MIN:MAX`` or more than one) through torch's c10d rendezvous."""
    return str(options.rdzv_backend) == "c10d" and str(options.nnodes) not in ("1", "1:1")


def _name_the_script(run_module: Any, script: str) -> None:
    """torchrun names the function it runs its ``--run-path`` script with in its report of a failed process
    ("run_script_path FAILED"); started with ``python SCRIPT``, a process alone was named by its script. The
    function it looks up is given the script's name, so that the report names what the user ran."""
    original = run_module.run_script_path

    def run_script_path(training_script: str, *training_script_args: str) -> object:
        return original(training_script, *training_script_args)

    run_script_path.__name__ = run_script_path.__qualname__ = script
    run_module.run_script_path = run_script_path


def forking(args: list[str], options: argparse.Namespace | None = None) -> list[str]:
    """torchrun's arguments with the training processes forked (:mod:`dlsub.checkpointing.forked_rank`), where that
    is safe here and the command is dlsub's entry point or one process's script; otherwise ``args`` as they are.
    ``options``: torchrun's reading of ``args``, where the caller has it already."""
    from dlsub.checkpointing.launch import ENTRY_POINT

    if os.environ.get(ENV_RANK_START) == "exec":
        return args
    if options is None:
        options = _torchrun_options(args)
    if options is None or options.run_path or options.no_python:
        return args
    at = next((i for i in range(len(args) - 1) if args[i:i + 2] == ENTRY_POINT), None)
    if at is not None:
        script_at = at + 2
    elif not options.module and _one_process(options):
        # A process alone runs its script without the entry point (launch.main): forked, the entry point runs it
        # as it would have (no output socket for one process: its lines go out unlabelled, as they did).
        script_at = len(args) - len(options.training_script_args) - 1
        if script_at < 0 or args[script_at] != options.training_script:
            return args
        if "PYTHONSAFEPATH" not in os.environ:
            from dlsub.contract import ENV_SAFE_PATH_SET

            # This torchrun runs with -P; `python SCRIPT` would put the script's folder first on sys.path, and the
            # entry point does so where it is told that the safe path is dlsub's, not the user's.
            os.environ[ENV_SAFE_PATH_SET] = "1"
    else:
        return args
    import torch
    import torch.distributed.run

    if torch.cuda.is_initialized() or not hasattr(torch.distributed.run, "run_script_path"):
        return args
    if not cuda_checks_fork_safe(torch):
        return args
    from dlsub.checkpointing import fork_context, forked_rank

    fork_context.install()  # the heap frozen before each fork; a process ends once torchrun has its value
    if not _one_process(options):  # DistributedDataParallel is for groups of several
        _import_for_the_processes()
    _name_the_script(torch.distributed.run, args[script_at])
    prefix = args[:at] if at is not None else args[:script_at]
    return [*prefix, "--run-path", "--start-method", "fork", os.path.abspath(forked_rank.__file__), *args[script_at:]]


def threads_per_process(environ: Mapping[str, str], nproc_per_node: str) -> int | None:
    """OpenMP threads for each training process: the CPUs Slurm gave the job on this node shared among its
    processes there. None where the environment already sets them (the user's --export, the site's policy, the
    image) or says nothing to share. Left to torch, a process alone takes a thread per core of the whole node,
    whatever share of it the job was given, and torchrun gives each of several one thread."""
    if "OMP_NUM_THREADS" in environ:
        return None
    try:
        cpus, processes = int(environ.get("SLURM_CPUS_ON_NODE", "")), int(nproc_per_node)
    except ValueError:  # no allocation to read, or torchrun's "auto"/"gpu": torchrun decides
        return None
    return max(1, cpus // processes) if cpus > 0 and processes > 0 else None


def _set_threads(options: argparse.Namespace | None) -> None:
    threads = None if options is None else threads_per_process(os.environ, str(options.nproc_per_node))
    if threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(threads)


def cuda_checks_fork_safe(torch: Any) -> bool:
    """Whether torchrun's own questions about GPUs leave this process able to fork training processes that use CUDA;
    True after asking torch to answer them through NVML (for this process only: :data:`ENV_NVML_CHECK_SET`).

    Why: torchrun's launch configuration asks ``torch.cuda.is_available()`` and ``device_count()`` (for its NUMA
    binding) in this process before it starts the training processes. Asked through CUDA, that initializes CUDA's
    driver here, and every forked process then fails at its first CUDA call ("Cannot re-initialize CUDA in forked
    subprocess"): seen on an H200 with torch 2.11, every GPU job through dlsub's launcher. Through NVML it does not.
    A CPU build of torch has nothing to initialize; where NVML does not answer (no ``libnvidia-ml``), or the user's
    environment asks torch for the other check, torchrun starts each process itself (a fresh Python), as before."""
    if not torch.backends.cuda.is_built():
        return True
    nvml_device_count = getattr(torch.cuda, "_device_count_nvml", None)  # what device_count() asks first
    if nvml_device_count is None or nvml_device_count() < 0:
        return False
    if os.environ.get(NVML_CUDA_CHECK) is None:
        os.environ[NVML_CUDA_CHECK] = "1"
        os.environ[ENV_NVML_CHECK_SET] = "1"
    return os.environ[NVML_CUDA_CHECK] == "1"


def _joining_in_process(args: list[str], options: argparse.Namespace | None) -> list[str] | None:
    """A worker's torchrun whose group re-forms in process and takes joiners now: its arguments for one node of its
    own, the group's record in the environment its processes inherit (:mod:`dlsub.checkpointing.regroup_join`).
    None: it joins through the rendezvous, as every member did before (a restart of the group)."""
    if os.environ.pop(ENV_JOIN_IN_PROCESS, "") != "1" or options is None or not _across_nodes(options):
        return None
    from dlsub.checkpointing import regroup_join

    point, why_not = regroup_join.worth_joining()
    if point is None:
        print(f"dlsub: joining the group through torchrun's rendezvous (a restart): {why_not}", file=sys.stderr,
              flush=True)
        return None
    os.environ[ENV_REGROUP_JOIN] = point.to_json()
    return regroup_join.standalone(args, len(args) - len(options.training_script_args) - 1)


#: The loggers of torch's elastic agent, whose errors about a process that failed as it joined are left out.
ELASTIC_LOGGERS = "torch.distributed.elastic"


@contextlib.contextmanager
def _quiet_join_failures(failed: Path) -> Any:
    """Leave out torch's elastic agent's errors (a traceback of the process it lost) while a joining process has
    failed or died joining (its marker, ``failed``, or one of the joining markers): that process fails by design
    where it cannot join, and the traceback would read as the training's error. Its other errors, and any once
    every process has joined, pass as they are."""

    def keep(record: logging.LogRecord) -> bool:
        return not (record.name.startswith(ELASTIC_LOGGERS) and record.levelno >= logging.ERROR
                    and (failed.exists() or bool(joining_markers(failed.parent, os.getpid()))))

    handlers: list[logging.Handler] = []
    logger: logging.Logger | None = logging.getLogger(ELASTIC_LOGGERS)
    while logger is not None:  # the handlers its records reach: torch gives torch.distributed one of its own
        handlers += logger.handlers
        logger = logger.parent if logger.propagate else None
    for handler in handlers:
        handler.addFilter(keep)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(keep)


def _failure(exc: Exception) -> str:
    """How the first failed process ended, in words (torch's ChildFailedError)."""
    try:
        _, first = exc.get_first_failure()  # type: ignore[attr-defined]
        return f"killed by {first.signal_name()}" if first.exitcode < 0 else f"exit code {first.exitcode}"
    except Exception:  # noqa: BLE001 - a torch without these: say only that it failed
        return "failed"


def _joined(torchrun: Callable[[list[str]], object], args: list[str]) -> bool:
    """Run the processes that join in process; whether they ran (False: one could not join, and the caller joins
    through the rendezvous instead)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    print("dlsub: joining the running group in process (its ranks go on; no restart)", file=sys.stderr, flush=True)
    failed = join_failed_marker(Path(tempfile.gettempdir()), os.getpid())
    try:
        with _quiet_join_failures(failed):
            torchrun(args)
    except ChildFailedError as exc:
        # A process that said it could not join, or one killed while it joined (its marker left behind); any
        # other failure is the training's own, after it joined.
        died_joining = joining_markers(failed.parent, os.getpid())
        could_not = failed.exists()
        if not could_not and not died_joining:
            raise
        for marker in (failed, *died_joining):
            marker.unlink(missing_ok=True)
        os.environ.pop(ENV_REGROUP_JOIN, None)
        how = "could not join" if could_not else "died as it joined"
        print(f"dlsub: a process {how} ({_failure(exc)}); joining through the rendezvous instead (the group "
              "restarts)", file=sys.stderr, flush=True)
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    from torch.distributed.run import main as torchrun

    if args[:1] == ["--from-stdin"]:
        if os.environ.get(ENV_RANK_START) != "exec":
            _import_for_the_processes()  # as torch is: while the old group stops, before the command comes
        handed = _argv_from_stdin()
        if handed is None:
            print("dlsub: torchrun_main: no command line came on standard input", file=sys.stderr, flush=True)
            return 2
        args = handed
    options = _torchrun_options(args)  # read once, for the threads and the fork
    _set_threads(options)
    args = forking(args, options)
    sys.argv = ["torchrun", *args]  # torchrun's messages name itself, as from its own script
    joining = _joining_in_process(args, options)
    if joining is not None and _joined(torchrun, joining):
        return 0
    if options is not None and _across_nodes(options):
        group_membership.install()
    try:
        torchrun(args)
    except group_membership.LeftTheGroup as left:
        print(f"dlsub: {left}", file=sys.stderr, flush=True)
        return LEFT_THE_GROUP
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        gc.freeze()
    return 0


if __name__ == "__main__":
    sys.exit(main())
