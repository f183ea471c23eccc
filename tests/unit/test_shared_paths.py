"""Unit (the fake Slurm behind the client's _run seam, cli_env): a job whose files its nodes would not see (a
login node's /tmp is its own) is refused at submit, exit 2, naming the path and the file systems to use, before
anything reaches Slurm; the site names what its hosts share in policy.toml ``[site]``.

pytest's tmp_path lies in /tmp: these tests put dlsub's shipped node-local folders back (``shipped``), which the
other unit tests leave /tmp out of (conftest.py).
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import NODE_LOCAL_AS_SHIPPED, WEIRD_NAME

from dlsub.cli.main import main
from dlsub.site_config import policy_file
from dlsub.site_config.policy_file import PolicyFileError, SitePaths, parse_policy
from dlsub.slurm_plugins.fake import FakeSlurm


@pytest.fixture
def shipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(policy_file, "NODE_LOCAL_PATHS", NODE_LOCAL_AS_SHIPPED)


def invoke(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    (tmp_path / "policy.toml").write_text(body)
    monkeypatch.setenv("DLSUB_POLICY", str(tmp_path / "policy.toml"))


def script_in(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "train me; 'now'.py"
    script.write_text("print('training')\n")
    return script


# ---------------------------------------------------------------- the rule


@pytest.mark.parametrize(("shared", "local", "path", "unseen"), [
    ((), None, "/tmp/me/train.py", "/tmp"),
    ((), None, "/tmp", "/tmp"),
    ((), None, "/tmpfoo/train.py", None),  # a folder's name, not a prefix of the text
    ((), None, "/run/user/1000/x.py", "/run"),
    ((), None, "/home/me/train.py", None),  # nothing declared: what is not node-local counts as shared
    (("/home", "/scratch"), None, "/home/me/train.py", None),
    (("/home", "/scratch"), None, "/opt/me/train.py", ""),  # declared: on none of them
    (("/home",), None, "/tmp/x.py", "/tmp"),
    (("/tmp/shared",), None, "/tmp/shared/me/x.py", None),  # the nearer folder decides
    (("/",), ("/local",), "/local/x.py", "/local"),
    ((), (), "/tmp/x.py", None),  # a site that says nothing is node-local
])
def test_the_nearest_folder_named_says_whether_the_nodes_see_a_path(
        shipped: None, shared: tuple[str, ...], local: tuple[str, ...] | None, path: str, unseen: str | None) -> None:
    assert SitePaths(shared, local).unseen_by_nodes(Path(path)) == unseen


@pytest.mark.parametrize(("table", "message"), [
    ('shared_paths = ["home"]', "expected an absolute, normal path"),
    ('shared_paths = ["/home/../tmp"]', "expected an absolute, normal path"),
    ('node_local_paths = ["/a:b"]', "contains ':'"),
    ('shared_path = ["/home"]', "shared_path"),
    ('shared_paths = "/home"', "expected a list of strings"),
])
def test_a_bad_site_table_is_refused_naming_the_key(table: str, message: str) -> None:
    with pytest.raises(PolicyFileError, match=message):
        parse_policy(tomllib.loads(f"[site]\n{table}\n"))


def test_the_site_table_is_read() -> None:
    policy = parse_policy(tomllib.loads('[site]\nshared_paths = ["/home", "/scratch"]\nnode_local_paths = ["/tmp"]\n'))
    assert policy.site == SitePaths(("/home", "/scratch"), ("/tmp",))
    assert parse_policy({}).site.node_local == policy_file.NODE_LOCAL_PATHS


# ---------------------------------------------------------------- at submit, through the CLI and the fake Slurm


def test_a_script_in_tmp_is_refused_before_anything_reaches_slurm(
        cli_env: FakeSlurm, shipped: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's case: accepted, it failed on its node ("couldn't change working dir to /tmp/...")."""
    site(tmp_path, monkeypatch, '[site]\nshared_paths = ["/home", "/scratch"]\n')
    script = script_in(tmp_path / WEIRD_NAME)
    monkeypatch.chdir(script.parent)
    result = invoke("--mode", "immediate", "--gpus", "1", str(script))
    assert result.exit_code == 2, result.output
    assert repr(str(script)) in result.stderr, result.stderr  # the path, whole, as Python quotes it
    assert "is in /tmp, which each host of the cluster has of its own (node-local)" in result.stderr
    assert "put it on a shared file system (/home, /scratch: policy.toml [site] shared_paths)" in result.stderr
    assert cli_env.calls == [], "nothing reached Slurm, not even a ping"
    assert not (tmp_path / "dlsub-home" / "jobs").exists() or not any((tmp_path / "dlsub-home" / "jobs").iterdir())


def test_without_shared_paths_the_message_says_where_to_go_and_what_the_site_could_say(
        cli_env: FakeSlurm, shipped: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site(tmp_path, monkeypatch, "")
    script = script_in(tmp_path / "proj")
    monkeypatch.chdir(script.parent)
    result = invoke(str(script))
    assert result.exit_code == 2 and "the script (" in result.stderr, result.output
    assert "such as your home directory" in result.stderr and "[site] shared_paths" in result.stderr
    assert cli_env.calls == []


@pytest.mark.parametrize("what", ["submit folder", "job directories", "mount"])
def test_every_path_the_node_needs_is_checked(
        cli_env: FakeSlurm, shipped: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: str) -> None:
    """The script on a shared path is not enough: the folder submitted from (the job's working directory), the
    job directories and a --mount are the node's too."""
    shared = tmp_path / "shared fs"
    site(tmp_path, monkeypatch, f'[site]\nshared_paths = ["{shared}"]\n')
    script = script_in(shared / "proj")
    monkeypatch.chdir(script.parent)
    args: list[str] = []
    if what == "submit folder":
        monkeypatch.chdir(tmp_path)
        expected = "the folder you submit from"
    elif what == "job directories":
        expected = "dlsub's job directories ($DLSUB_HOME)"  # cli_env's DLSUB_HOME is in tmp_path, not shared
    else:
        data = tmp_path / "data; rm -rf ~"
        data.mkdir()
        args = ["--mount", str(data)]
        expected = f"--mount {str(data)!r}"
    if what != "job directories":
        monkeypatch.setenv("DLSUB_HOME", str(shared / "dlsub-home"))
    result = invoke(*args, str(script))
    assert result.exit_code == 2, result.output
    assert expected in result.stderr and "is in /tmp" in result.stderr, result.stderr
    assert cli_env.calls == []


def test_a_path_on_a_shared_folder_the_site_names_inside_tmp_is_submitted(
        cli_env: FakeSlurm, shipped: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The nearer folder decides; the weird path reaches Slurm as one argument (no shell)."""
    site(tmp_path, monkeypatch, f'[site]\nshared_paths = ["{tmp_path}"]\n')
    script = script_in(tmp_path / WEIRD_NAME.replace("\n", " "))
    monkeypatch.chdir(script.parent)
    result = invoke("--json", str(script))
    assert result.exit_code == 0, result.output
    (job,) = cli_env.submitted()
    assert json.loads(result.stdout)["slurm_job_id"] == job.job_id
    sbatch = next(c for c in cli_env.calls if c[0] == "sbatch")
    assert any(os.path.basename(a).endswith(".sbatch") or a.endswith(".sh") for a in sbatch), sbatch
