"""Unit tests (pure: a mount table given as text, no Podman): a job whose mounted paths lie on a network file
system runs with the container's root as the user (--userns host), since a file server refuses the user's
subordinate ids in a 0700 home (issue 50 item 2; Podman's rootless.md); elsewhere the user's uid is kept."""

from __future__ import annotations

from pathlib import Path

import pytest

import dlsub.job.submit as submit
from dlsub.containers.podman import ContainerSpec, Raw, podman_run_lines

LOCAL = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
SSHFS_HOME = LOCAL + "60 22 0:50 / /home/alice rw,nosuid,nodev - fuse.sshfs root@head:alice rw,user_id=0\n"


def _spec(home: Path) -> ContainerSpec:
    return ContainerSpec(image="img", script=home / "proj" / "train.py", script_args=(),
                         job_dir=Path("/scratch/alice/j/1"), workdir=home / "proj",
                         library_dir=Path("/opt/dlsub/lib/dlsub"))


def _userns(spec: ContainerSpec) -> str:
    lines = podman_run_lines(spec, Raw("name"), Raw(""), [])
    return next(line[1] for line in lines if line[0] == "--userns")


@pytest.mark.parametrize(("table", "kept"), [(LOCAL, True), (SSHFS_HOME, False)])
def test_the_users_uid_is_kept_unless_a_mount_is_on_a_network_file_system(
        monkeypatch: pytest.MonkeyPatch, table: str, kept: bool) -> None:
    monkeypatch.setattr(submit, "mount_table", lambda: table)
    spec, note = submit._userns_for_mounts(_spec(Path("/home/alice")))
    assert spec.keep_id is kept and _userns(spec) == ("keep-id" if kept else "host")
    if kept:
        assert note == ""
    else:
        assert "/home/alice/proj" in note and "fuse.sshfs" in note and "root" in note
