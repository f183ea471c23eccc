"""Unit tests (real files in a temporary folder; the file system's answer to getxattr faked where it says "no
ACLs"): policy.toml's [site] job_directories puts a user's job directories on another file system only where
their dlsub home keeps no POSIX ACLs (issue 50 item 2: homes on NFSv4 or sshfs), never over $DLSUB_HOME."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from dlsub.job import filesystems, settings
from dlsub.job.filesystems import posix_acls_work
from dlsub.job.settings import load_settings
from dlsub.site_config.policy_file import PolicyFileError, SitePaths, parse_policy


def _getxattr_fails(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    def getxattr(path: object, name: str) -> bytes:
        raise OSError(code, os.strerror(code))
    monkeypatch.setattr(filesystems.os, "getxattr", getxattr)


def test_a_folder_that_could_hold_an_acl_says_so(tmp_path: Path) -> None:
    # This machine's disk keeps POSIX ACLs (the live tests' setfacl relies on it): "no such attribute" here.
    assert posix_acls_work(tmp_path)


def test_not_supported_means_no_acls_asked_of_the_nearest_existing_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def getxattr(path: object, name: str) -> bytes:
        asked.append(str(path))
        if not Path(str(path)).exists():
            raise FileNotFoundError(errno.ENOENT, "No such file or directory")
        raise OSError(errno.ENOTSUP, "Operation not supported")
    monkeypatch.setattr(filesystems.os, "getxattr", getxattr)
    assert not posix_acls_work(tmp_path / "not" / "yet")
    assert asked == [str(tmp_path / "not" / "yet"), str(tmp_path / "not"), str(tmp_path)]


def test_a_folder_it_cannot_reach_counts_as_having_them(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _getxattr_fails(monkeypatch, errno.EACCES)
    assert posix_acls_work(tmp_path)


def test_job_directories_go_to_the_sites_folder_only_where_the_home_has_no_acls(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scratch = tmp_path / "scratch" / "alice" / "dlsub-jobs"
    home = {"HOME": str(tmp_path / "home")}
    monkeypatch.setenv("HOME", home["HOME"])
    with_acls = load_settings(home, job_directories=scratch)
    assert with_acls.jobs_dir == tmp_path / "home" / ".dlsub" / "jobs"
    monkeypatch.setattr(settings, "posix_acls_work", lambda path: False)
    without = load_settings(home, job_directories=scratch)
    assert without.jobs_dir == scratch
    assert without.db_path == tmp_path / "home" / ".dlsub" / "dlsub.db"  # the store stays in the home
    assert load_settings(home).jobs_dir == tmp_path / "home" / ".dlsub" / "jobs"  # no site folder: as before
    # $DLSUB_HOME is the user's own choice: the site's folder never overrides it.
    own = load_settings({**home, "DLSUB_HOME": str(tmp_path / "mine")}, job_directories=scratch)
    assert own.jobs_dir == tmp_path / "mine" / "jobs"


def test_the_key_is_read_per_user_and_checked() -> None:
    site = parse_policy({"site": {"job_directories": "/scratch/{user}/dlsub-jobs"}}).site
    assert site.job_directories_of("alice") == Path("/scratch/alice/dlsub-jobs")
    assert SitePaths().job_directories_of("alice") is None
    for bad in ("scratch/{user}", "/scratch/dlsub-jobs", "/scratch/{user}/../x", "/scratch/{user}/{job}"):
        with pytest.raises(PolicyFileError, match="job_directories"):
            parse_policy({"site": {"job_directories": bad}})
