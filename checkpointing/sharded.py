"""Sharded checkpoints: every rank writes its own shards with ``torch.distributed.checkpoint`` (DCP).

For models no one rank holds whole (FSDP2, tensor parallel: DTensor state
dicts), and for a cheap periodic checkpoint (``asynchronous=True``: DCP's
``async_save`` copies the state to CPU memory, then writes it in a thread
while the training goes on). DCP loads into the state dict the script
passes, resharding to however the tensors in it are laid out now: a
checkpoint written by 2 ranks restores into 4, or into 1 process with no
process group at all. Used through :meth:`dlsub.checkpointing.Run.save_sharded`
and :meth:`~dlsub.checkpointing.Run.restore_sharded`.

Layout, beside the plain ``ckpt-*.pt`` files of ``run.save()``::

    dcp-00000120.partial/   a save in progress (or killed): never restored
    dcp-00000120/           a complete one: DCP's files plus dlsub-manifest.json

Rank 0 finishes a save only after DCP has gathered every rank's write
results and written its ``.metadata`` (so every shard is on disk, fsynced):
it writes the manifest (each file's size and SHA-256, the step, the world
size) and renames the folder into place. A checkpoint counts only when
complete and its files match the manifest; the newest ``keep`` are kept, and
never at the cost of the newest one that verifies (as in :mod:`.storage`).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.stateful import Stateful

from dlsub import contract
from dlsub.checkpointing.run_support import barrier, from_rank0, initialized_dist
from dlsub.checkpointing.sealed import MANIFEST, agreed_newest, manifest, newest_good, seal
from dlsub.checkpointing.storage import _fsync_dir

if TYPE_CHECKING:
    from torch.distributed.checkpoint.metadata import Metadata
    from torch.distributed.checkpoint.storage import WriteResult

    from dlsub.checkpointing.run import Run

_NAME = re.compile(r"^dcp-(\d{8,})$")
_PARTIAL = re.compile(r"^dcp-(\d{8,})\.partial$")
__all__ = ["MANIFEST", "ModelState", "Sharded", "newest_world_size", "prune", "sharded_checkpoints"]


def sharded_path(directory: Path, seq: int) -> Path:
    return directory / f"dcp-{seq:08d}"


def _partial(final: Path) -> Path:
    return final.with_name(final.name + ".partial")


def sharded_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """(sequence number, folder) of every complete-looking sharded checkpoint, newest first (not verified)."""
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name)) and p.is_dir()]
    return sorted(found, reverse=True)


def prune(directory: Path, keep: int, good: Path | None = None) -> list[Path]:
    """Delete all but the newest ``keep`` sharded checkpoints, never the newest one that verifies (``good``
    when the caller knows it: the one just written), and every leftover ``.partial`` folder of a killed save.
    Call only when no save is in progress."""
    folders = [p for _, p in sharded_checkpoints(directory)]
    kept = set(folders[:max(keep, 1)])
    if good is None:
        good, _ = newest_good(folders)
    if good is not None:
        kept.add(good)
    deleted = [p for p in folders if p not in kept]
    for victim in deleted:
        shutil.rmtree(victim, ignore_errors=True)
    return deleted + clear_partials(directory)


def clear_partials(directory: Path) -> list[Path]:
    """Remove the ``.partial`` folders of killed saves. Call only when no save is in progress."""
    partials = [p for p in directory.iterdir() if _PARTIAL.match(p.name)]
    for partial in partials:
        shutil.rmtree(partial, ignore_errors=True)
    return partials


class _Writer(dcp.FileSystemWriter):
    """DCP's file writer that, on the coordinating rank, completes the checkpoint once DCP has finished it."""

    def __init__(self, partial: Path, complete: Any) -> None:
        super().__init__(partial)
        self._complete = complete

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        super().finish(metadata, results)
        self._complete()


class ModelState(Stateful):
    """A model and its optimizer as one entry of a sharded state: ``{"app": ModelState(model, optim)}``.

    Goes through ``torch.distributed.checkpoint.state_dict`` (``get_state_dict`` / ``set_state_dict``), so
    FSDP2 (``fully_shard``) and DTensor models save their shards and load whatever layout they have now.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        if self.optimizer is None:
            return {"model": get_model_state_dict(self.model)}
        model, optim = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optim": optim}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        if self.optimizer is None:
            set_model_state_dict(self.model, state_dict["model"])
        else:
            set_state_dict(self.model, self.optimizer, model_state_dict=state_dict["model"],
                           optim_state_dict=state_dict["optim"])


class Sharded:
    """One run's sharded saves: the one in flight (asynchronous), and the process group async saves use."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.pending: Future[Any] | None = None
        self._group: Any = None

    def wait(self) -> None:
        """Until the save in flight (if any) is complete; raises what it raised."""
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.result()

    def _next_seq(self, given: int | None) -> int:
        """Past every plain or sharded checkpoint and every killed save on disk (rank 0's view, for all)."""
        run = self.run
        seq = given if given is not None and given > run._seq else run._seq + 1
        directory = run.checkpoint_dir
        if run.is_main and directory.is_dir():
            on_disk = [int(m.group(1)) for p in directory.iterdir() if (m := _NAME.match(p.name) or
                                                                        _PARTIAL.match(p.name))]
            seq = max([seq, *(s + 1 for s in on_disk)])
        (agreed,) = from_rank0([seq]) or [seq]
        return agreed

    def save(self, state: dict[str, Any], given: int | None, asynchronous: bool) -> Path:
        run = self.run
        self.wait()  # DCP saves one at a time; and the previous one must finish before pruning
        seq = self._next_seq(given)
        run._seq = seq
        if given is not None:
            run._last_step = given
        step = run._last_step if run._last_step is not None else seq
        final = sharded_path(run.checkpoint_dir, seq)
        partial = _partial(final)
        if run.is_main:
            run.checkpoint_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            clear_partials(run.checkpoint_dir)  # leftovers of a killed save (no save is in flight now)
            partial.mkdir()
        barrier()
        world_size = run.world_size

        def complete() -> None:  # rank 0 only (DCP's coordinator), every shard on disk
            seal(partial, step=step, seq=seq, world_size=world_size)
            os.replace(partial, final)
            _fsync_dir(run.checkpoint_dir)
            prune(run.checkpoint_dir, run.keep, good=final)
            run._event(contract.EVENT_CHECKPOINT, step=step, path=str(final), seq=seq)

        writer = _Writer(partial, complete)
        if not asynchronous:
            dcp.save(state, storage_writer=writer, no_dist=initialized_dist() is None)
            barrier()
            return final
        if initialized_dist() is not None and self._group is None:
            # The write thread's collectives must not interleave with the training's on the same group.
            self._group = dist.new_group(backend="gloo")
        result = dcp.async_save(state, storage_writer=writer, process_group=self._group,
                                no_dist=initialized_dist() is None)
        self.pending = result.upload_completion if isinstance(result, dcp.state_dict_saver.AsyncSaveResponse) \
            else result
        return final

    def restore(self, state: dict[str, Any]) -> Path | None:
        run = self.run
        self.wait()
        chosen, folder, skipped = agreed_newest(sharded_checkpoints(run.checkpoint_dir))
        for reason in skipped:
            print(f"dlsub: skipped checkpoint: {reason}", file=sys.stderr, flush=True)
        if folder is None:
            barrier()
            return None
        dcp.load(state, checkpoint_id=folder, no_dist=initialized_dist() is None)
        barrier()  # nobody saves (and prunes) before all have read it
        meta = manifest(folder)
        run._seq = max(run._seq, chosen)
        run._last_step = meta.get("step") if isinstance(meta.get("step"), int) else None
        before = meta.get("world_size")
        run._resized = isinstance(before, int) and before != run.world_size
        run.restored_from = folder
        step = run._last_step if run._last_step is not None else chosen
        run._event(contract.EVENT_RESTORE, path=str(folder), skipped=len(skipped), step=step, seq=chosen)
        return folder


def newest_world_size(directory: Path) -> int | None:
    """The world size that wrote the newest complete sharded checkpoint (not verified: a hint for ``resized``)."""
    for _, folder in sharded_checkpoints(directory):
        size = manifest(folder).get("world_size")
        if isinstance(size, int):
            return size
    return None
