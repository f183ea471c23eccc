"""torchrun, run by dlsub's launcher: ``python3 -m dlsub.checkpointing.torchrun_main [--from-stdin] [ARGS]``.

It is torchrun itself (``torch.distributed.run``'s ``main``, which the
``torchrun`` script calls) with two differences that only change how fast
an elastic group re-forms after a member left, when the launcher starts
torchrun again (:mod:`dlsub.checkpointing.launch`):

* ``--from-stdin``: it imports torch first and only then reads its command
  line, one JSON list of strings, from standard input. The launcher starts
  it while the old group is still stopping, so the ~2 s of CPU the import
  costs overlap the old group's exit instead of following it. Standard
  input is then ``/dev/null``, as the training processes had it before.
* At exit it freezes Python's collector: its passes over torch's objects
  cost about a second of CPU, and the next torchrun cannot listen on the
  group's port before this one has exited.
* Its training processes are forked from it, where torch is already
  imported, rather than each a Python of its own
  (:mod:`dlsub.checkpointing.forked_rank`, through torchrun's own
  ``--run-path`` and ``--start-method fork``): when torchrun's command for
  them is dlsub's entry point, where this torch has ``--run-path``, unless
  CUDA is initialized here (a context does not survive a fork) or
  ``$DLSUB_RANK_START`` is ``exec``.

Anything the launcher could not hand over (no line, a line that is not a
list of strings) ends it with exit code 2 before torchrun runs.
"""

from __future__ import annotations

import gc
import json
import os
import sys

#: ``exec`` here: the training processes start as torchrun starts them, each a Python of its own.
ENV_RANK_START = "DLSUB_RANK_START"


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


def forking(args: list[str]) -> list[str]:
    """torchrun's arguments with the training processes forked (:mod:`dlsub.checkpointing.forked_rank`), where that
    is safe here and the command is dlsub's entry point; otherwise ``args`` as they are."""
    from dlsub.checkpointing.launch import ENTRY_POINT

    at = next((i for i in range(len(args) - 1) if args[i:i + 2] == ENTRY_POINT), None)
    if at is None or os.environ.get(ENV_RANK_START) == "exec":
        return args
    import torch
    import torch.distributed.run

    if torch.cuda.is_initialized() or not hasattr(torch.distributed.run, "run_script_path"):
        return args
    from dlsub.checkpointing import forked_rank

    return [*args[:at], "--run-path", "--start-method", "fork", os.path.abspath(forked_rank.__file__),
            *args[at + 2:]]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    from torch.distributed.run import main as torchrun

    if args[:1] == ["--from-stdin"]:
        handed = _argv_from_stdin()
        if handed is None:
            print("dlsub: torchrun_main: no command line came on standard input", file=sys.stderr, flush=True)
            return 2
        args = handed
    args = forking(args)
    sys.argv = ["torchrun", *args]  # torchrun's messages name itself, as from its own script
    try:
        torchrun(args)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        gc.freeze()
    return 0


if __name__ == "__main__":
    sys.exit(main())
