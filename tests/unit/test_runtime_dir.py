"""Unit: Podman's runtime-directory fallback is private (real directories,
no Slurm, no Podman): made 0700 when missing, refused when it is a symlink,
someone else's, or open to others."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dlsub.containers.podman import RuntimeDirError, private_runtime_dir


def test_made_private_when_missing(tmp_path: Path) -> None:
    path = private_runtime_dir(tmp_path / "xdg")
    assert path.stat().st_mode & 0o777 == 0o700


def test_kept_when_already_ours_and_private(tmp_path: Path) -> None:
    (tmp_path / "xdg").mkdir(mode=0o700)
    assert private_runtime_dir(tmp_path / "xdg") == tmp_path / "xdg"


@pytest.mark.parametrize("squat", ["symlink", "open", "file"])
def test_refused_when_squatted(tmp_path: Path, squat: str) -> None:
    path = tmp_path / "xdg"
    if squat == "symlink":
        (tmp_path / "theirs").mkdir(mode=0o700)
        path.symlink_to(tmp_path / "theirs")
    elif squat == "open":
        path.mkdir()
        os.chmod(path, 0o777)
    else:
        path.write_text("")
    with pytest.raises(RuntimeDirError, match="not a directory of yours with mode 700"):
        private_runtime_dir(path)


def test_refused_when_owned_by_another_user(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give the directory to another user")
    path = tmp_path / "xdg"
    path.mkdir(mode=0o700)
    os.chown(path, 65534, 65534)
    with pytest.raises(RuntimeDirError):
        private_runtime_dir(path)
