"""torchrun's entry point for each training process: ``python -u -m dlsub.checkpointing.rank_output SCRIPT ARGS``.

With ``$DLSUB_OUTPUT_SOCKET`` (the launcher sets it when the job has several
processes), it hands this process's stdout and stderr, one pipe for both (as
Slurm's output file without ``--error`` has them: in the order written), to the
launcher's :class:`~dlsub.checkpointing.output_mux.OutputMux` with the global
rank torchrun gave it (``$RANK``), which labels each of their lines. Then,
with or without, it runs SCRIPT with ARGS in this process, as ``python -u
SCRIPT ARGS`` would (``__main__``, ``sys.argv``, ``sys.path[0]``, unbuffered:
torchrun started it with ``-u``): the same pid, so torchrun's and the
launcher's signals reach the training itself. Nothing is printed on the way.
A script that imports Horovod has Horovod's variables set first, so that its
``hvd.init()`` joins torchrun's group (:mod:`dlsub.checkpointing.horovod_env`).

In this process rather than by ``exec`` so that a process group the script
leaves alive is destroyed at exit, after the script's own exit handlers and
before the interpreter finalizes; without that a gloo process can die of
SIGABRT after training that succeeded
(:func:`dlsub.checkpointing.run_support.end_process_group` says why).

If the handover fails (no launcher listening), the lines go unlabelled
straight to the container's output, as before; one line on stderr says so.
Standard library and dlsub's container-side library (torch where a process joins a running group).
"""

from __future__ import annotations

import json
import os
import runpy
import socket
import sys
from pathlib import Path
from typing import NoReturn

from dlsub.checkpointing import horovod_env, regroup_join
from dlsub.checkpointing.run_support import end_process_group_at_exit
from dlsub.contract import (
    ENV_ATTEMPT,
    ENV_JOB_DIR,
    ENV_NVML_CHECK_SET,
    ENV_OUTPUT_SOCKET,
    ENV_SAFE_PATH_SET,
    ENV_WATCH_NO_GPU,
    NO_GPU_ERRORS,
    NVML_CUDA_CHECK,
    no_gpu_error_marker,
)

#: How long to wait for the launcher to take the pipes.
HANDOVER_TIMEOUT_S = 10.0


def hand_over_output(socket_path: str, rank: int) -> None:
    """Make fds 1 and 2 one pipe read by the launcher at ``socket_path``; raise OSError if it does not take it.

    One pipe, not two: two are read apart, and a stderr line could then come out after stdout lines written
    after it (seen in CI when the launcher was slow to read)."""
    read_end, write_end = os.pipe()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(HANDOVER_TIMEOUT_S)
            conn.connect(socket_path)
            socket.send_fds(conn, [json.dumps({"rank": rank}).encode()], [read_end])
            if conn.recv(1) != b"k":
                raise OSError(f"the launcher at {socket_path} did not take the output pipe")
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(write_end, 1)
        os.dup2(write_end, 2)
    finally:
        os.close(read_end)
        os.close(write_end)


def main(argv: list[str]) -> NoReturn:
    if not argv:
        print("usage: python -m dlsub.checkpointing.rank_output SCRIPT [ARGS...]", file=sys.stderr)
        sys.exit(2)
    # A worker's process that joins a running group in process: before its script, and before its output is
    # labelled with its rank (the group's, once joined).
    regroup_join.join_if_told()
    socket_path = os.environ.pop(ENV_OUTPUT_SOCKET, "")
    if socket_path:
        rank = os.environ.get("RANK", "")
        try:
            hand_over_output(socket_path, int(rank))
        except (OSError, ValueError) as exc:
            print(f"dlsub: rank {rank}: its output goes unlabelled ({exc})", file=sys.stderr, flush=True)
    try:
        horovod_env.prepare(argv[0])  # a Horovod script's hvd.init() joins torchrun's group
    except horovod_env.HorovodSetupError as exc:
        print(f"dlsub: rank {os.environ.get('RANK', '')}: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
    run_script(argv[0], argv[1:])
    sys.exit(0)


def run_script(script: str, args: list[str]) -> None:
    """Run ``script`` as ``python SCRIPT ARGS`` runs it, in this process, its process group ended at exit."""
    end_process_group_at_exit()  # registered before the script's own handlers, so it runs after them
    sys.argv = [script, *args]
    here = os.path.dirname(os.path.abspath(script))  # what ``python SCRIPT`` puts first
    if os.environ.pop(ENV_NVML_CHECK_SET, None) == "1":  # set for torchrun's process alone (torchrun_main)
        os.environ.pop(NVML_CUDA_CHECK, None)
    ours = os.environ.pop(ENV_SAFE_PATH_SET, None) == "1"
    if ours:  # dlsub's launcher set PYTHONSAFEPATH: sys.path[0] is not the working directory but Python's own
        os.environ.pop("PYTHONSAFEPATH", None)  # nor do the script's own subprocesses get it
        sys.path.insert(0, here)
    elif not getattr(sys.flags, "safe_path", False):  # the user's own PYTHONSAFEPATH: as ``python -P SCRIPT``
        sys.path[0] = here
    try:
        runpy.run_path(script, run_name="__main__")
    except Exception as exc:
        note_no_gpu_error(exc)
        raise


def note_no_gpu_error(exc: BaseException) -> None:
    """If ``exc`` is torch's no-GPU error, leave the attempt's marker for the launcher (a CPU attempt of a job that
    asked for GPUs is then sent back to wait for them). Only where the batch script watches for it
    (``$DLSUB_WATCH_NO_GPU``: such an attempt); no other attempt reads a marker. Never in the way of the error."""
    text = str(exc)
    job_dir, attempt = os.environ.get(ENV_JOB_DIR), os.environ.get(ENV_ATTEMPT)
    watched = os.environ.get(ENV_WATCH_NO_GPU) == "1"
    if not (watched and job_dir and attempt and any(error in text for error in NO_GPU_ERRORS)):
        return
    first = text.strip().splitlines()[0][:200]  # non-empty: it holds one of NO_GPU_ERRORS
    try:
        marker = no_gpu_error_marker(Path(job_dir), attempt)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(f"{type(exc).__name__}: {first}\n")
    except OSError:
        pass


if __name__ == "__main__":
    main(sys.argv[1:])
