"""What the Lightning and Hugging Face adapters share: a run, the framework's checkpoints sealed and
recorded, the one to resume agreed by every rank, and the values a framework hands its callbacks."""

from __future__ import annotations

import math
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dlsub import contract
from dlsub.checkpointing.run import Run, init
from dlsub.checkpointing.run_support import barrier
from dlsub.checkpointing.sealed import agreed_newest, manifest, manifest_path, seal


class Adapter:
    """One training's dlsub run, seen from a framework's callback; its checkpoints under ``subdir`` of the
    job's checkpoint folder (or a folder of the framework's, ``directory=``)."""

    def __init__(self, subdir: str, keep: int, init_kwargs: dict[str, Any], directory: Path | None = None) -> None:
        # The adapter answers dlsub's stop in the framework's own loop, always: the job may be moved or
        # continued before its first checkpoint (the stop's save is then its first).
        self.run: Run = init(**{"saves_on_request": True, **init_kwargs})
        self.keep = keep
        self.directory = directory if directory is not None else self.run.checkpoint_dir / subdir
        if self.run.is_main:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)

    @property
    def owner(self) -> str:
        """Whose checkpoints these are, as their seals say: the job's directory (``$DLSUB_JOB_DIR``, one per
        dlsub job; off-cluster the local ``./dlsub-run``), so that a folder two jobs share is told apart."""
        return str(self.run.job_dir)

    def resume_candidate(self, candidates: list[tuple[int, Path]]) -> Path | None:
        """The newest of ``(step, checkpoint)`` that is sealed and verifies, the same on every rank (None when
        there is none); recorded as the run's restore."""
        step, chosen, skipped = agreed_newest(sorted(candidates, reverse=True))
        for reason in skipped:
            print(f"dlsub: skipped checkpoint: {reason}", file=sys.stderr, flush=True)
        run = self.run
        if chosen is None:
            return None
        before = manifest(chosen).get("world_size")
        run._resized = isinstance(before, int) and before != run.world_size
        run._last_step = step
        run.restored_from = chosen
        run._event(contract.EVENT_RESTORE, path=str(chosen), skipped=len(skipped), step=step, seq=step)
        print(f"dlsub: resuming from {chosen} (step {step}"
              f"{f', written by {before} processes, now {run.world_size}' if run._resized else ''})",
              file=sys.stderr, flush=True)
        return chosen

    def checkpointed(self, checkpoint: Path, step: int, older: Iterable[Path] = (), **meta: Any) -> None:
        """Every rank, once the framework has written ``checkpoint``: rank 0 seals and records it, and keeps
        the newest ``keep`` of it and ``older`` (newest first; the one just sealed is the newest good). ``meta``
        goes into the seal."""
        barrier()
        run = self.run
        if run.is_main:
            seal(checkpoint, step=step, world_size=run.world_size, job=self.owner, **meta)
            run._last_step = step
            run._event(contract.EVENT_CHECKPOINT, step=step, path=str(checkpoint), seq=step)
            for old in list(older)[max(self.keep - 1, 0):]:
                remove(old)
        barrier()


def remove(checkpoint: Path) -> None:
    """A checkpoint (file or folder) and its seal."""
    marker = manifest_path(checkpoint)
    if checkpoint.is_dir():
        shutil.rmtree(checkpoint, ignore_errors=True)
    else:
        checkpoint.unlink(missing_ok=True)
    marker.unlink(missing_ok=True)


def batch_length(batch: Any) -> int:
    """Samples in a batch as a data loader yields it: a tensor, or a tuple, list or dict of them."""
    if isinstance(batch, (list, tuple)) and batch:
        return batch_length(batch[0])
    if isinstance(batch, dict) and batch:
        return batch_length(next(iter(batch.values())))
    shape = getattr(batch, "shape", None)
    return int(shape[0]) if shape else 0


def loss_value(outputs: Any) -> float | None:
    """The loss in what a training step returned (a tensor, or a dict with ``loss``)."""
    if isinstance(outputs, dict):
        outputs = outputs.get("loss")
    try:
        value = outputs.detach().float().item() if hasattr(outputs, "detach") else outputs
    except (RuntimeError, ValueError):
        return None
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None
