"""A training process forked by torchrun: ``torchrun --run-path --start-method fork .../forked_rank.py SCRIPT ARGS``.

:mod:`dlsub.checkpointing.torchrun_main` has torchrun fork each training
process from itself, where torch is already imported, instead of starting a
Python for it: each process so skips the interpreter's start and ``import
torch`` (seconds of CPU each, and a re-formed group starts all of them at
once). torchrun runs this file in the child with ``runpy.run_path``
(its ``--run-path``); it makes the child the process torchrun would otherwise
have started (``python -u -m dlsub.checkpointing.rank_output SCRIPT ARGS``) and
then runs dlsub's entry point there:

* the signals torchrun's agent handles get their defaults back;
* torch's CPU threads follow ``OMP_NUM_THREADS`` as torchrun set it for the
  process (1 when there are several): OpenMP read its count when torchrun
  imported torch, before that;
* standard output and error are unbuffered, as under ``python -u``;
* torchrun's exit handlers are dropped, and the script's and the library's
  run when it ends (a forked child of multiprocessing runs none);
* torchrun's sockets are closed in it (its rendezvous and worker stores
  listen, and their accepted and client connections): a fresh process has
  none, and one holding them would keep the stores' ports taken and their
  connections open for as long as it outlives torchrun;
* one that torchrun stopped with SIGTERM and that then ended (the training
  took it as "checkpoint and stop") leaves at once: a forked process that
  returns waits until torchrun has read every process's return value, which
  torchrun closing the group never does (each grow waited out its 30 s
  before SIGKILL); one that returns gets SIGTERM's default back;
* its exit code is the script's: a script that ends or calls
  ``sys.exit(0)`` returns to torchrun, which takes that as success; any
  other exit leaves the process with that code, an uncaught error printed
  as Python prints it, with 1.

Standard library and dlsub's container-side library only.
"""

from __future__ import annotations

import atexit
import io
import logging
import os
import signal
import socket
import stat
import sys
import traceback
from collections.abc import Callable

#: The signals torchrun's agent handles, which a fresh Python leaves at their defaults (SIGINT: KeyboardInterrupt).
AGENT_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


#: The exit handlers the modules torchrun imports for its processes registered (:mod:`.torchrun_main`): func, args,
#: keyword args, in order.
HANDLERS_OF_IMPORTS: list[tuple[Callable[..., object], tuple[object, ...], dict[str, object]]] = []


def _unbuffered(fd: int, errors: str) -> io.TextIOWrapper:
    """A text stream on ``fd`` as ``python -u`` makes it: every write reaches the file at once."""
    return io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding=sys.stdout.encoding or "utf-8",
                            errors=errors, write_through=True)


def _threads_from_environment() -> None:
    """torch's CPU threads as a fresh process's torch takes them from its environment (OpenMP's variables)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        try:
            threads = int(os.environ.get(name, ""))
        except ValueError:
            continue
        if threads > 0:
            torch.set_num_threads(threads)
            return


def _close_inherited_sockets() -> None:
    """Close the internet sockets the process inherited from torchrun (standard streams, pipes and Unix sockets
    are kept: multiprocessing's pipes to torchrun are among them). Only this process's copy of each is closed;
    torchrun's go on."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return
    for name in names:
        fd = int(name)
        try:
            if fd <= 2 or not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            sock = socket.socket(fileno=fd)
        except OSError:
            continue  # the listing's own descriptor, closed since
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.close()
        else:
            sock.detach()


def become_a_fresh_process() -> None:
    _close_inherited_sockets()
    for signum in AGENT_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    atexit._clear()  # torchrun's own: its agent's, not this process's
    # Those of the modules torchrun imported for its processes (torchrun_main), which a fresh process that imported
    # them itself would have: this file runs as __main__, the handlers were kept on the module torchrun imported.
    imported = sys.modules.get("dlsub.checkpointing.forked_rank")
    for func, args, kwargs in getattr(imported, "HANDLERS_OF_IMPORTS", ()):
        atexit.register(func, *args, **kwargs)
    sys.stdout, sys.stderr = _unbuffered(1, "strict"), _unbuffered(2, "backslashreplace")
    _threads_from_environment()


def exit_code_of(argv: list[str]) -> int:
    """Run dlsub's entry point on ``argv`` (SCRIPT ARGS), then the exit handlers; the process's exit code."""
    from dlsub.checkpointing import rank_output

    code: int | str | None = 0
    interrupted = False
    try:
        rank_output.main(argv)
    except SystemExit as exc:
        code = exc.code
    except KeyboardInterrupt:  # printed, and then the interpreter dies of SIGINT
        traceback.print_exc()
        interrupted = True
    except Exception:  # noqa: BLE001 - any error, reported as the interpreter reports an uncaught one
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()  # what the interpreter's exit runs
    logging.shutdown()
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    if code is None:
        return 0
    if not isinstance(code, int):
        print(code, file=sys.stderr)
        return 1
    return code & 0xFF


def stopped_by_torchrun() -> bool:
    """The training took a SIGTERM as "checkpoint and stop": only torchrun sends one to its processes (dlsub's
    launcher asks with SIGUSR1), when it closes the group to re-form it or to end."""
    run = sys.modules.get("dlsub.checkpointing.run")
    return run is not None and signal.SIGTERM in run.STOP_SIGNALS_TAKEN


def main() -> None:
    become_a_fresh_process()
    code = exit_code_of(sys.argv[1:])
    if code or stopped_by_torchrun():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    # Returned to torchrun, which reads the return value and then lets the process exit. A SIGTERM from now on
    # is torchrun closing the group instead (another process failed, or a member joined): it ends the process,
    # as it would have ended one that torchrun started.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


if __name__ == "__main__":
    main()
