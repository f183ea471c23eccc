"""What :mod:`dlsub.checkpointing.run` needs around a run: the profiling budget of an estimate, memory
peaks, checked values from the environment and the training script, and
``torch.distributed`` or Horovod when the script has set it up (never imported otherwise).
"""

from __future__ import annotations

import atexit
import math
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

from dlsub import contract

PROFILE_STEPS_ENV = contract.ENV_PROFILE_STEPS
PROFILE_SECONDS_ENV = contract.ENV_PROFILE_SECONDS
#: Set by ``dlsub submit --target-loss X``; ``init(target_loss=)`` wins over it.
TARGET_LOSS_ENV = contract.ENV_TARGET_LOSS
LOSS_WINDOW = 3


def env_float(name: str) -> float | None:
    try:
        value = float(os.environ.get(name, ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def peak_rss_mb() -> float:
    """This process's peak resident memory, MB (Linux reports ru_maxrss in KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def cuda_peak_mb() -> float | None:
    """``torch.cuda.max_memory_allocated()`` in MB where torch has CUDA in use; None elsewhere."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return None
        return round(float(torch.cuda.max_memory_allocated()) / 2**20, 1)
    except (RuntimeError, AttributeError):  # a broken CUDA set-up must not cost the training its report
        return None


class Profile:
    """A profiling run's stop rule: at least N steps and S seconds after the first report."""

    def __init__(self, steps: int, seconds: float) -> None:
        self.steps, self.seconds = steps, seconds
        self.first: float | None = None

    @classmethod
    def from_env(cls) -> Profile | None:
        steps = env_float(PROFILE_STEPS_ENV)
        if steps is None or steps < 1:
            return None
        return cls(int(steps), max(0.0, env_float(PROFILE_SECONDS_ENV) or 0.0))

    def done(self, step: int) -> bool:
        now = time.monotonic()
        if self.first is None:
            self.first = now
        return step >= self.steps and now - self.first >= self.seconds


def non_negative(value: Any) -> float | None:
    """A finite number >= 0 (a float, a 0-d tensor) as a float; None for anything else."""
    try:
        number = float(value) if value is not None and not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number >= 0 else None


def as_step(value: Any) -> int | None:
    """An integral step (``int``, ``7.0``, a 0-d tensor) as an int; None for anything else."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(number) or number != int(number):
        return None
    return int(number)


def initialized_dist() -> Any:
    if "torch" not in sys.modules:
        return None
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def collective_device(dist: Any) -> str:
    """Where a small tensor for a collective must live: NCCL moves only CUDA tensors; gloo (and MPI) CPU ones."""
    import torch

    return f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"


class Collectives:
    """The few collectives the library needs, over whichever the script set up: torch.distributed (first), or
    Horovod (``hvd.init()`` without ``init_process_group``; :mod:`dlsub.checkpointing.horovod_env`)."""

    def __init__(self, dist: Any = None, hvd: Any = None) -> None:
        self._dist, self._hvd = dist, hvd
        self.rank: int = int(dist.get_rank() if dist is not None else hvd.rank())

    def _tensor(self, values: list[int], dtype: Any) -> Any:
        import torch

        device = collective_device(self._dist) if self._dist is not None else "cpu"  # Horovod: CPU ops on gloo
        return torch.tensor(values, dtype=dtype, device=device)

    def max(self, value: int) -> int:
        """The largest of every rank's ``value``."""
        import torch

        flag = self._tensor([value], torch.int32)
        if self._dist is not None:
            self._dist.all_reduce(flag, op=self._dist.ReduceOp.MAX)
        else:
            flag = self._hvd.allreduce(flag, op=self._hvd.Max, name="dlsub.max")
        return int(flag.item())

    def max_each(self, values: list[int]) -> list[int]:
        """The largest of every rank's value at each place of ``values`` (one all-reduce)."""
        import torch

        flags = self._tensor(values, torch.int64)
        if self._dist is not None:
            self._dist.all_reduce(flags, op=self._dist.ReduceOp.MAX)
        else:
            flags = self._hvd.allreduce(flags, op=self._hvd.Max, name=f"dlsub.max_each.{len(values)}")
        return [int(v) for v in flags.tolist()]

    def from_rank0(self, values: list[int]) -> list[int]:
        """Rank 0's ``values`` on every rank (one broadcast)."""
        import torch

        tensor = self._tensor(values, torch.int64)
        if self._dist is not None:
            self._dist.broadcast(tensor, src=0)
        else:
            tensor = self._hvd.broadcast(tensor, root_rank=0, name=f"dlsub.from_rank0.{len(values)}")
        return [int(v) for v in tensor.tolist()]

    def barrier(self) -> None:
        if self._dist is not None:
            self._dist.barrier()
        else:
            self._hvd.barrier()


def initialized_horovod() -> Any:
    """``horovod.torch`` where the script has imported it and called ``hvd.init()``; None otherwise."""
    hvd = sys.modules.get("horovod.torch")
    try:
        return hvd if hvd is not None and hvd.is_initialized() else None
    except (AttributeError, ValueError):  # not Horovod's module as we know it; or its library not loaded
        return None


def collectives() -> Collectives | None:
    """The ranks' collectives (torch.distributed's, else Horovod's); None where neither is set up."""
    dist = initialized_dist()
    if dist is not None:
        return Collectives(dist=dist)
    hvd = initialized_horovod()
    return Collectives(hvd=hvd) if hvd is not None else None


def from_rank0(values: list[int]) -> list[int] | None:
    """Rank 0's ``values`` on every rank (one broadcast); None where no group is set up."""
    group = collectives()
    return group.from_rank0(values) if group is not None else None


def barrier() -> None:
    group = collectives()
    if group is not None:
        group.barrier()


def end_process_group() -> None:
    """Destroy the default process group if the script left it alive: registered with ``atexit`` by the
    rank entry point and by :func:`dlsub.checkpointing.init`, so it runs after the script's own exit
    handlers and before the interpreter finalizes.

    Why: a gloo collective's work object is released by one of the group's worker threads, which needs the
    GIL to drop the tensors it holds. A process that exits with the group alive races that thread against
    ``Py_FinalizeEx``: a thread that asks for the GIL during finalization is ended with ``pthread_exit``,
    whose unwinding through the work's (noexcept) destructor calls ``std::terminate``. The process dies of
    SIGABRT ("terminate called without an active exception") after training that succeeded, and torchrun
    reports the job failed. Destroying the group first joins those threads while Python is still whole.
    """
    dist = initialized_dist()
    if dist is None:
        return
    try:
        dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 - at exit: say it, never turn a finished run into a failure
        print(f"dlsub: could not destroy the process group at exit ({exc})", file=sys.stderr, flush=True)


_ending_at_exit = False


def end_process_group_at_exit() -> None:
    """Have :func:`end_process_group` run at exit, once a process however often asked: the first to ask
    (the rank entry point, before the script runs) sets its place, after every handler the script adds."""
    global _ending_at_exit
    if not _ending_at_exit:
        atexit.register(end_process_group)
        _ending_at_exit = True


def application() -> dict[str, str]:
    """The start event's digest of the command this process runs (none when its script cannot be read):
    the agent sizes the next run of the same command on what this one measured."""
    try:
        script = Path(sys.argv[0])
        if not script.is_file() or script.stat().st_size > contract.MAX_SCRIPT_BYTES:
            return {}
        return {contract.APPLICATION_FIELD: contract.application_digest(script.read_bytes(), sys.argv[1:])}
    except (OSError, IndexError, ValueError):
        return {}
