"""Crash-safe checkpoint files: write to a temp file, fsync, rename; verify on read.

Layout of a checkpoint directory::

    ckpt-00000120.pt          the state (torch.save, or pickle without torch)
    ckpt-00000120.pt.sha256   its checksum, written and renamed *before* the data

A checkpoint counts only when its data and checksum agree, so a file cut
short by a crash, a full disk or a bad copy is passed over and the previous
one restored. Only the newest ``keep`` checkpoints are kept, and never at the
cost of the newest one that verifies: when the ``keep`` newest are all
corrupt, the newest good one older than them stays too.

A number is never used twice, nor a file replaced (:func:`save_checkpoint`): a
superseded attempt still writing must not land on the newer attempt's name.

The checksum file's first line is the data's SHA-256; a second line, when
present, is JSON about the checkpoint (``{"step": N}``), so a restore knows
the training step it resumes at even when ``save()`` was given none.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import pickle
import re
from pathlib import Path
from typing import Any

from dlsub.checkpointing import fence

_NAME = re.compile(r"^ckpt-(\d{8,})\.pt$")


def _serialize(state: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    try:
        import torch
    except ImportError:  # the library works without torch (off-cluster, plain Python state)
        pickle.dump(state, buf, protocol=pickle.HIGHEST_PROTOCOL)
    else:
        torch.save(state, buf)
    return buf.getvalue()


def _deserialize(data: bytes, map_location: Any) -> Any:
    """Whatever the file holds (the caller checks that it is a dict)."""
    if data[:2] == b"PK":  # torch.save's zip container
        import torch

        # weights_only=False: the file is the user's own and its checksum matched.
        return torch.load(io.BytesIO(data), map_location=map_location, weights_only=False)
    return pickle.loads(data)


def _write_temp(path: Path, data: bytes) -> Path:
    """``data`` written and fsynced beside ``path``, under a temporary name, to be given ``path`` next."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return tmp


def _write_atomic(path: Path, data: bytes) -> None:
    os.replace(_write_temp(path, data), path)


def _write_new(path: Path, data: bytes) -> None:
    """Like :func:`_write_atomic`, but never replacing a file already at ``path``: the name is taken with a hard
    link, which fails with FileExistsError when it exists (atomic on a network filesystem too, where the server
    decides). On a filesystem without hard links, a rename once the name was seen free."""
    tmp = _write_temp(path, data)
    try:
        try:
            os.link(tmp, path)
        except OSError as exc:
            if isinstance(exc, FileExistsError) or exc.errno not in _NO_HARD_LINKS:
                raise
            if path.exists():
                raise FileExistsError(errno.EEXIST, "a checkpoint of that name exists", str(path)) from exc
            os.rename(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# What link(2) says where a filesystem has no hard links.
_NO_HARD_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK, errno.ENOSYS}


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def checkpoint_files(directory: Path) -> list[tuple[int, Path]]:
    """(sequence number, path) of every checkpoint data file, newest first."""
    if not directory.is_dir():
        return []
    found = []
    for p in directory.iterdir():
        m = _NAME.match(p.name)
        if m:
            found.append((int(m.group(1)), p))
    return sorted(found, reverse=True)


def checkpoint_path(directory: Path, seq: int) -> Path:
    return directory / f"ckpt-{seq:08d}.pt"


def checkpoint_seq(path: Path) -> int:
    """The sequence number in a checkpoint's file name."""
    m = _NAME.match(path.name)
    if m is None:
        raise ValueError(f"{path.name!r} is not a checkpoint's file name")
    return int(m.group(1))


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def save_checkpoint(directory: Path, seq: int, state: dict[str, Any], keep: int, step: int | None = None,
                    meta: dict[str, Any] | None = None) -> Path:
    """Write a checkpoint atomically as ``seq``, or past every checkpoint already in ``directory`` (its path
    says which), and prune to the newest ``keep`` (see :func:`prune`).

    A name is never reused: two attempts of a job may write at once (a node cut off while its attempt trains
    on, issue 53), and the older one's late rename must not replace the newer's checkpoint of the same
    number. So each save takes a number past those on disk, and takes the name with a link that fails where
    it exists (then the next number)."""
    # Owner-only whatever the job directory grants (the agent may traverse
    # that one; it never reads checkpoints).
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    data = _serialize(state)
    sidecar = hashlib.sha256(data).hexdigest() + "\n"
    info = dict(meta or {})
    if step is not None:
        info["step"] = int(step)
    # Its writer (attempt, time), so that a restore can pass over a superseded attempt's late write; and
    # nothing published once a newer attempt of the job has begun (issue 53).
    info.update(fence.written_by())
    fence.check("its checkpoint")
    if info:
        sidecar += json.dumps(info) + "\n"
    on_disk = checkpoint_files(directory)
    seq = max(seq, on_disk[0][0] + 1) if on_disk else seq
    for _ in range(_NAME_TRIES):
        path = checkpoint_path(directory, seq)
        try:
            _write_new(_sidecar(path), sidecar.encode())
        except FileExistsError:  # another writer's, since the look above: the next number
            seq += 1
            continue
        _write_new(path, data)
        break
    else:
        raise FileExistsError(errno.EEXIST, f"no free checkpoint name after {_NAME_TRIES} tries", str(directory))
    _fsync_dir(directory)
    prune(directory, keep)
    return path


# Names taken by other writers between one save's look and its link, in a row, before it gives up.
_NAME_TRIES = 100


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's contents, read a MiB at a time (checkpoints are large)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verifies(path: Path) -> bool:
    """Whether a checkpoint's data matches its checksum (what a restore checks first)."""
    try:
        expected = _sidecar(path).read_text().split("\n", 1)[0].strip()
        actual = file_sha256(path)
    except OSError:
        return False
    return bool(expected) and actual == expected


def prune(directory: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints, never the newest one that verifies (and is the job's:
    not a superseded attempt's late write, :func:`fence.stale`).

    Verifies newest-first and stops at the first good one, so the usual
    case (the checkpoint just written is good) reads one file. Returns what
    it deleted.
    """
    files = [p for _, p in checkpoint_files(directory)]
    kept = set(files[:max(keep, 1)])
    for path in files:
        if verifies(path) and fence.stale(checkpoint_meta(path)) is None:
            kept.add(path)
            break
    deleted = []
    for old in files:
        if old in kept:
            continue
        for victim in (old, _sidecar(old)):
            victim.unlink(missing_ok=True)
        deleted.append(old)
    return deleted


def checkpoint_meta(path: Path) -> dict[str, Any]:
    """What was recorded with a checkpoint (``step``, ``world_size``); {} when nothing was."""
    try:
        lines = _sidecar(path).read_text().splitlines()
        meta = json.loads(lines[1]) if len(lines) > 1 else {}
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def checkpoint_step(path: Path) -> int | None:
    """The training step recorded with a checkpoint (None for ones written before steps were)."""
    step = checkpoint_meta(path).get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def load_verified(path: Path, map_location: Any = "cpu") -> dict[str, Any]:
    """Load one checkpoint; raise ``ValueError`` when it is missing, cut short or corrupt."""
    try:
        expected = _sidecar(path).read_text().split("\n", 1)[0].strip()
    except OSError as exc:
        raise ValueError(f"{path.name}: no checksum file ({exc.strerror})") from exc
    data = path.read_bytes()
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        raise ValueError(f"{path.name}: checksum mismatch (file is {len(data)} bytes; corrupt or truncated)")
    state = _deserialize(data, map_location)
    if not isinstance(state, dict):
        raise ValueError(f"{path.name}: holds a {type(state).__name__}, not a dict")
    return state


def restore_latest(directory: Path, map_location: Any = "cpu") -> tuple[dict[str, Any] | None, Path | None, list[str]]:
    """(state, path) of the newest checkpoint that verifies, and why newer ones were skipped.

    ``(None, None, skipped)`` when no checkpoint verifies.
    """
    skipped: list[str] = []
    for _, path in checkpoint_files(directory):
        late = fence.stale(checkpoint_meta(path))
        if late is not None:
            skipped.append(f"{path.name}: {late}")
            continue
        try:
            return load_verified(path, map_location), path, skipped
        except Exception as exc:  # noqa: BLE001 - any unreadable checkpoint means: try the previous one
            skipped.append(str(exc))
    return None, None, skipped
