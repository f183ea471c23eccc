"""Checkpoints written by someone else's code (DCP, Lightning, the Hugging Face Trainer), sealed by dlsub.

A framework writes a checkpoint its own way, a file or a folder, and not
always crash-safely. Once it has returned (and every rank has), rank 0
*seals* it: a manifest of each file's size and SHA-256, with what dlsub
knows (the step, the world size), written atomically last. Only a sealed
checkpoint whose files still match counts: a save killed midway is never
restored, and the newest sealed one that verifies is the one resumed.

The manifest of a folder is ``<folder>/dlsub-manifest.json``; of a file,
``<file>.dlsub.json`` beside it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dlsub.checkpointing import fence
from dlsub.checkpointing.run_support import collectives
from dlsub.checkpointing.storage import _fsync_dir, _write_atomic, file_sha256

MANIFEST = "dlsub-manifest.json"
FILE_MANIFEST_SUFFIX = ".dlsub.json"


def manifest_path(checkpoint: Path) -> Path:
    return checkpoint / MANIFEST if checkpoint.is_dir() else checkpoint.with_name(checkpoint.name +
                                                                                  FILE_MANIFEST_SUFFIX)


def _files(checkpoint: Path) -> list[Path]:
    if not checkpoint.is_dir():
        return [checkpoint]
    return sorted(p for p in checkpoint.rglob("*") if p.is_file() and p.name != MANIFEST)


def seal(checkpoint: Path, **meta: Any) -> None:
    """Record ``checkpoint`` (a file or a folder the framework has finished writing) as complete. Rank 0.
    Never once a newer attempt of the job has begun (:func:`fence.check`): its checkpoint stays unsealed."""
    base = checkpoint if checkpoint.is_dir() else checkpoint.parent
    files = {str(p.relative_to(base)): [p.stat().st_size, file_sha256(p)] for p in _files(checkpoint)}
    target = manifest_path(checkpoint)
    fence.check("its checkpoint's seal")
    _write_atomic(target, json.dumps({"files": files, **meta, **fence.written_by()}).encode())
    _fsync_dir(target.parent)


def manifest(checkpoint: Path) -> dict[str, Any]:
    """What the seal recorded ({} for a checkpoint never sealed, or an unreadable manifest)."""
    try:
        data = json.loads(manifest_path(checkpoint).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def problem(checkpoint: Path) -> str | None:
    """None when the checkpoint is sealed and every file matches its seal; else what is wrong."""
    sealed = manifest(checkpoint)
    files = sealed.get("files")
    if not isinstance(files, dict) or not files:
        return f"{checkpoint.name}: not sealed (the save did not complete)"
    late = fence.stale(sealed)
    if late is not None:
        return f"{checkpoint.name}: {late}"
    base = checkpoint if checkpoint.is_dir() else checkpoint.parent
    for name, entry in files.items():
        path = base / name
        try:
            size, sha = entry
            if path.stat().st_size != size or file_sha256(path) != sha:
                return f"{checkpoint.name}: {name} does not match its checksum (corrupt or truncated)"
        except OSError as exc:
            return f"{checkpoint.name}: {name}: {exc.strerror}"
        except (TypeError, ValueError):
            return f"{checkpoint.name}: a bad manifest"
    return None


def newest_good(candidates: Iterable[Path]) -> tuple[Path | None, list[str]]:
    """The first of ``candidates`` (newest first) that verifies, and why those before it did not."""
    skipped: list[str] = []
    for checkpoint in candidates:
        trouble = problem(checkpoint)
        if trouble is None:
            return checkpoint, skipped
        skipped.append(trouble)
    return None, skipped


def agreed_newest(candidates: list[tuple[int, Path]]) -> tuple[int, Path | None, list[str]]:
    """(number, checkpoint) of :func:`newest_good` of ``(number, checkpoint)`` newest first, as rank 0 sees
    them, on every rank (one broadcast of the number; -1 and None when none verifies); and why newer ones
    were passed over (rank 0's list; empty on the others)."""
    group = collectives()
    picks = group is None or group.rank == 0
    chosen, skipped = newest_good(path for _, path in candidates) if picks else (None, [])
    number = next((n for n, path in candidates if path == chosen), -1)
    if group is not None:
        (number,) = group.from_rank0([number])
    chosen = next((path for n, path in candidates if n == number), None)
    if number >= 0 and chosen is None:
        raise RuntimeError(f"rank 0 restores checkpoint {number}, which this rank does not see")
    return number, chosen, skipped
