"""The user's cache of profiles and saved estimates, under ``~/.dlsub/estimates`` (0700).

A profile is keyed by the sha256 of what decides it: the script's content,
its arguments (the batch-size argument included), the image, the
partition and the kind of GPU, the batch size, GPUs and nodes, and the profiling rule. Change
any and the profile is measured again. Saved estimates are what ``dlsub
submit --from-estimate ID`` reads back.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dlsub.estimate.partition_fit import ProfileRun

#: Bumped when what a profile measures changes: older entries are then not reused.
CACHE_VERSION = 2
_ESTIMATE_ID = re.compile(r"^[0-9a-f]{8}\Z")


def profile_key(script_text: bytes, args: Sequence[str], image: str, partition: str, batch_size: int, *,
                gpus: int = 0, nodes: int = 1, rule: str = "", gpu_type: str = "", environment: str = "") -> str:
    """The cache key of one profile: sha256 over everything that decides it (the kind of GPU too, where one
    is named, and the user's environment, where --export or --venv give one; a profile without either keeps
    the key it had)."""
    parts: dict[str, object] = {
        "v": CACHE_VERSION, "script": hashlib.sha256(script_text).hexdigest(), "args": list(args),
        "image": image, "partition": partition, "batch_size": int(batch_size), "gpus": int(gpus),
        "nodes": int(nodes), "rule": rule}
    if gpu_type:
        parts["gpu_type"] = gpu_type
    if environment:
        parts["environment"] = environment
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _write_private(path: Path, payload: Any) -> None:
    """Write JSON owner-only, through a temp file and a rename (no half-written entry)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(payload, f)
    os.replace(tmp, path)


class EstimateCache:
    def __init__(self, home: Path) -> None:
        self.root = home / "estimates"
        self.profiles = self.root / "profiles"

    def _dirs(self) -> None:
        for d in (self.root.parent, self.root, self.profiles):
            d.mkdir(mode=0o700, exist_ok=True)

    def get(self, key: str) -> ProfileRun | None:
        path = self.profiles / f"{key}.json"
        try:
            return ProfileRun.from_json(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError):
            return None  # absent or unreadable: measure again

    def put(self, key: str, profile: ProfileRun) -> None:
        self._dirs()
        _write_private(self.profiles / f"{key}.json", profile.to_json())

    def save_estimate(self, estimate_id: str, payload: dict[str, Any]) -> Path:
        self._dirs()
        path = self.root / f"{estimate_id}.json"
        _write_private(path, payload)
        return path

    def load_estimate(self, estimate_id: str) -> dict[str, Any]:
        if not _ESTIMATE_ID.match(estimate_id):
            raise LookupError(f"estimate id {estimate_id!r} is not 8 hex digits; `dlsub estimate --json` prints it")
        path = self.root / f"{estimate_id}.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise LookupError(f"no estimate {estimate_id} in {self.root}; run `dlsub estimate` first") from None
        except (OSError, ValueError) as exc:
            raise LookupError(f"estimate {estimate_id} cannot be read ({exc}); run `dlsub estimate` again") from None
        if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
            raise LookupError(f"estimate {estimate_id} is malformed; run `dlsub estimate` again")
        return data
