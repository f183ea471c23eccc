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
import sys
import traceback

#: The signals torchrun's agent handles, which a fresh Python leaves at their defaults (SIGINT: KeyboardInterrupt).
AGENT_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


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


def become_a_fresh_process() -> None:
    for signum in AGENT_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    atexit._clear()  # torchrun's own: its agent's, not this process's
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


def main() -> None:
    become_a_fresh_process()
    code = exit_code_of(sys.argv[1:])
    if code:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    main()
