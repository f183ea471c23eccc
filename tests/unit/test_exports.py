"""Unit: `dlsub submit --export` and `--venv` (issue 49, item 3): sbatch's syntax and meaning, read against the
shell's environment; pure functions first, then the command against the fake Slurm (its batch script's podman
line, run through bash's own parser)."""

from __future__ import annotations

import json
import shlex
import stat
import subprocess
from pathlib import Path, PurePosixPath

import pytest
from click.testing import CliRunner, Result

from dlsub.cli.main import main
from dlsub.containers.exports import (
    Exported,
    ExportError,
    Exports,
    exported,
    parse_exports,
    seen_entries,
    with_site_variables,
)
from dlsub.job.venv import VenvError, site_packages
from dlsub.slurm_plugins.fake import FakeSlurm

SHELL = {"HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "PATH": "/usr/bin", "HOME": "/home/alice",
         "LD_LIBRARY_PATH": "/nowhere/lib64", "SLURM_JOB_ID": "7", "DLSUB_HOME": "/x",
         "PYTHONPATH": "/home/alice/lib:rel",
         "CUDA_VISIBLE_DEVICES": "0", "XDG_RUNTIME_DIR": "/run/user/1", "TOKEN": "it's $HOME; `id`"}


@pytest.mark.parametrize("text", [None, "", "NONE", "NIL"])
def test_none_is_the_default_and_passes_nothing(text: str | None) -> None:
    assert exported(parse_exports(text), SHELL) == Exported()


def test_all_passes_the_shell_but_the_hosts_slurms_and_dlsubs_and_says_so() -> None:
    got = exported(parse_exports("ALL"), SHELL)
    assert dict(got.env) == {"HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "TOKEN": "it's $HOME; `id`"}
    assert got.python_path == ("/home/alice/lib", "rel"), "merged by the caller, never passed as it is"
    (note,) = got.notes
    assert "3 variable(s)" in note and "7 left out" in note


def test_names_and_values_as_sbatch_writes_them() -> None:
    exports = parse_exports("ALL,WANDB_MODE=disabled,EXTRA=a=b")
    assert exports == Exports(True, (), (("WANDB_MODE", "disabled"), ("EXTRA", "a=b")))
    got = exported(exports, SHELL)
    assert dict(got.env)["WANDB_MODE"] == "disabled" and dict(got.env)["EXTRA"] == "a=b", "a value set wins"
    only = exported(parse_exports("HF_HUB_OFFLINE,SEED=3,UNSET_ONE"), SHELL)
    assert only.env == (("HF_HUB_OFFLINE", "1"), ("SEED", "3"))
    assert only.python_path == () and only.notes == ("--export UNSET_ONE: UNSET_ONE is not set in your shell; "
                                                     "the job gets none",)
    assert exported(parse_exports("PYTHONPATH"), SHELL).python_path == ("/home/alice/lib", "rel")
    assert exported(parse_exports("PYTHONPATH=/a:/b"), SHELL).python_path == ("/a", "/b")


@pytest.mark.parametrize(("text", "says"), [
    ("LD_PRELOAD", "LD_PRELOAD never enters the container"),
    ("ALL,PATH=/opt/bin", "PATH never enters"),
    ("SLURM_JOB_ID=1", "SLURM_JOB_ID never enters"),
    ("DLSUB_JOB_DIR", "DLSUB_JOB_DIR never enters"),
    ("1BAD", "is not NAME or NAME=value"),
    ("A B", "is not NAME or NAME=value"),
    ("FOO,ALL", "comes first and alone"),
    ("FOO;rm", "is not NAME or NAME=value"),
])
def test_what_cannot_be_honoured_is_refused_naming_it(text: str, says: str) -> None:
    with pytest.raises(ExportError, match=says):
        parse_exports(text)


def test_a_value_with_a_nul_byte_is_refused() -> None:
    with pytest.raises(ExportError, match="NUL"):
        exported(parse_exports("BAD"), {"BAD": "a\0b"})


def test_only_the_pythonpath_entries_the_container_sees_are_kept() -> None:
    mounted = [PurePosixPath("/home/alice/proj"), PurePosixPath("/scratch/alice")]
    kept, left = seen_entries(["/home/alice/proj/src", "/scratch/alice", "/home/alice/other", "rel",
                               "/home/alice/proj/../other"], mounted)
    assert kept == ("/home/alice/proj/src", "/scratch/alice")
    assert left == ("/home/alice/other", "rel", "/home/alice/proj/../other")


# ---------------------------------------------------------------- the command, with the fake Slurm


def _submit(*args: str) -> Result:
    return CliRunner().invoke(main, ["submit", *args], catch_exceptions=False)


def _podman_words(batch_text: str) -> list[str]:
    """The batch script's podman line, as bash parses it."""
    lines = batch_text.split("exec podman ", 1)[1].splitlines()
    command: list[str] = []
    for line in lines:
        command.append(line.rstrip("\\"))
        if not line.endswith("\\"):
            break
    return shlex.split(" ".join(command))


def _podman_env(batch_text: str) -> dict[str, str]:
    """What the container's environment gets from the podman line: its --env-file's lines, then its --env words
    (which win, as podman reads them after the file)."""
    words = _podman_words(batch_text)
    pairs = [line for i, w in enumerate(words[:-1]) if w == "--env-file"
             for line in Path(words[i + 1]).read_text().splitlines()]
    pairs += [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--env"]
    return dict(p.split("=", 1) for p in pairs if "=" in p)


def test_submit_passes_what_export_names_quoted_and_keeps_pythonpath_entries_on_mounted_paths(
        cli_env: FakeSlurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = tmp_path / "proj"
    (project / "src").mkdir(parents=True)
    script = project / "train.py"
    script.write_text("#DLSUB --export ALL,SEED=3\nprint(1)\n")
    monkeypatch.chdir(project)
    for name, value in SHELL.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PYTHONPATH", f"{project / 'src'}:/nowhere/lib")
    result = _submit("--json", str(script))
    assert result.exit_code == 0, result.output
    batch = Path(cli_env.submitted()[-1].script).read_text()
    assert subprocess.run(["bash", "-n"], input=batch, text=True).returncode == 0
    env = _podman_env(batch)
    assert env["HF_HUB_OFFLINE"] == "1" and env["SEED"] == "3" and env["TOKEN"] == "it's $HOME; `id`"
    assert "TOKEN" not in batch and "offline" not in batch, "no value on the podman command line (ps shows it)"
    env_file = Path(json.loads(result.stdout)["job_dir"]) / "container.env"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert "LD_LIBRARY_PATH" not in env and "HOME" not in env and env.get("PATH") is None
    assert env["PYTHONPATH"].split(":")[1:] == [str(project / "src")], env["PYTHONPATH"]
    assert "PYTHONPATH: /nowhere/lib left out" in result.stderr
    # The default passes nothing of the shell.
    script.write_text("print(1)\n")
    assert _submit("--json", str(script)).exit_code == 0
    batch = Path(cli_env.submitted()[-1].script).read_text()
    env = _podman_env(batch)
    assert "HF_HUB_OFFLINE" not in env and "TOKEN" not in env and ":" not in env["PYTHONPATH"]
    assert "--env-file" not in batch


def test_no_name_dlsub_sets_in_the_container_can_be_exported(cli_env: FakeSlurm, tmp_path: Path) -> None:
    """Every --env of the podman line (dlsub's, torchrun's, Slurm's) is refused by name, or comes from the
    batch step as the user's own (the socket interfaces): a user's value never stands in for one of them."""
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    assert _submit("--nodes", "2", "--json", str(script)).exit_code == 0
    words = _podman_words(Path(cli_env.submitted()[-1].script).read_text())
    names = {words[i + 1].split("=", 1)[0] for i, w in enumerate(words[:-1]) if w == "--env"}
    assert {"PYTHONPATH", "CUDA_VISIBLE_DEVICES", "SLURM_JOB_ID", "DLSUB_JOB_DIR"} <= names
    for name in names - {"PYTHONPATH"}:
        with pytest.raises(ExportError):
            parse_exports(f"{name}=x")


@pytest.mark.parametrize(("text", "values"), [
    ("MSG='hello, world',B=2", (("MSG", "hello, world"), ("B", "2"))),
    ('MSG="a,b"', (("MSG", "a,b"),)),
    ("MSG=it's", (("MSG", "it's"),)),
])
def test_a_quoted_value_keeps_its_commas_as_slurms_export_does(text: str, values: tuple[tuple[str, str]]) -> None:
    assert parse_exports(text).values == values


@pytest.mark.parametrize(("text", "says"), [
    ("A=x\ny", "line break"), ("A=x\ry", "line break"), ("A=" + "x" * (65 * 1024), "over 64 KiB"),
    ("MSG='open", "quote is not closed"), ("NCCL_SOCKET_IFNAME=ib1", "from your shell's own at submit"),
    ("NVIDIA_DRIVER_CAPABILITIES=all", "never enters"), ("BASH_ENV=/x", "never enters"),
])
def test_values_no_env_file_line_holds_and_the_batch_steps_names_are_refused(text: str, says: str) -> None:
    with pytest.raises(ExportError, match=says):
        parse_exports(text)


def test_what_all_cannot_carry_is_left_out_and_named_and_too_much_is_refused() -> None:
    shell = {"GOOD": "1", "LINES": "a\nb", "LATIN": "caf\udce9"}
    got = exported(parse_exports("ALL"), shell)
    assert got.env == (("GOOD", "1"),)
    assert "left out too, as no env file line can hold them: LATIN, LINES" in got.notes[0]
    with pytest.raises(ExportError, match="not UTF-8"):
        exported(parse_exports("LATIN"), shell)
    big = {f"V{i}": "x" * 60_000 for i in range(5)}
    with pytest.raises(ExportError, match="over 256 KiB"):
        exported(parse_exports("ALL"), big)


def test_a_refused_export_submits_nothing(cli_env: FakeSlurm, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    result = _submit("--export", "LD_PRELOAD=/x.so", str(script))
    assert result.exit_code == 2 and "LD_PRELOAD never enters the container" in result.output
    script.write_text("#DLSUB --export 'A B'\nprint(1)\n")
    result = _submit(str(script))
    assert result.exit_code == 2 and "line 1" in result.output and "is not NAME" in result.output
    assert cli_env.submitted() == []


# ---------------------------------------------------------------- --venv


def _venv(root: Path, *versions: str) -> Path:
    for version in versions:
        (root / "lib" / f"python{version}" / "site-packages").mkdir(parents=True)
    (root / "bin").mkdir(exist_ok=True)
    (root / "pyvenv.cfg").write_text("home = /usr/bin\n")
    return root


def test_a_venvs_site_packages_are_those_of_the_images_python(tmp_path: Path) -> None:
    env = _venv(tmp_path / "env", "3.11")
    assert site_packages(env, "3.11.2") == env / "lib" / "python3.11" / "site-packages"
    assert site_packages(env, None) == env / "lib" / "python3.11" / "site-packages", "unknown: its only one"
    with pytest.raises(VenvError, match=r"for Python 3\.11, the image runs Python 3\.13: make the environment "):
        site_packages(env, "3.13.0")
    with pytest.raises(VenvError, match="not a virtualenv or conda environment"):
        site_packages(tmp_path, "3.11.2")
    (env / "pyvenv.cfg").unlink()
    with pytest.raises(VenvError, match="no pyvenv.cfg nor conda-meta"):
        site_packages(env, "3.11.2")
    (env / "conda-meta").mkdir()
    assert site_packages(env, "3.11.2") == env / "lib" / "python3.11" / "site-packages", "conda's"
    two = _venv(tmp_path / "two", "3.11", "3.12")
    assert site_packages(two, "3.12.1") == two / "lib" / "python3.12" / "site-packages"
    with pytest.raises(VenvError, match="of a version not known here"):
        site_packages(two, None)


def test_submit_mounts_the_venv_read_only_and_puts_its_packages_first_on_pythonpath(
        cli_env: FakeSlurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = _venv(tmp_path / "my env; it's", "3.11")
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    monkeypatch.chdir(tmp_path)
    result = _submit("--json", "--venv", str(env), "--export", f"PYTHONPATH={tmp_path}", str(script))
    assert result.exit_code == 0, result.output
    batch = Path(cli_env.submitted()[-1].script).read_text()
    assert f"--volume {shlex.quote(f'{env}:{env}:ro')}" in batch
    assert _podman_env(batch)["PYTHONPATH"].split(":")[1:] == [str(env / "lib/python3.11/site-packages"),
                                                               str(tmp_path)]
    refused = _submit("--venv", str(tmp_path / "nowhere"), str(script))
    assert refused.exit_code == 2 and f"--venv {tmp_path / 'nowhere'}" in refused.output, refused.output
    _venv(tmp_path, "3.11")  # the submit directory itself, which the job writes to
    refused = _submit("--venv", ".", str(script))
    assert refused.exit_code == 2 and "which the job writes to" in refused.output, refused.output
    assert len(cli_env.submitted()) == 1


def test_a_venv_for_the_jobs_python_is_refused_where_a_partitions_image_runs_another(tmp_path: Path) -> None:
    """Pure (no Slurm): with the site's image per partition, the one site-packages on PYTHONPATH must fit the
    Python of every image the job may run (a move); a partition whose Python is not known is not held against
    it."""
    from dlsub.job.submit import SubmitError, SubmitRequest
    from dlsub.job.submit import _venv as checked_venv

    env = _venv(tmp_path / "env", "3.11", "3.12")
    script = tmp_path / "sub" / "train.py"
    script.parent.mkdir()
    script.write_text("print(1)\n")
    req = SubmitRequest(script=script, args=(), gpus_per_node=0, nodes=1, cpus=None, mem_mb=None,
                        time_limit_min=None, partition=None, image=None, name=None, workdir=script.parent,
                        venv=str(env))
    jobs = tmp_path / "jobs"
    mount, packages = checked_venv(req, "3.11.2", jobs, [("cpu", "3.11.9"), ("gpu", None)]) or (None, None)
    assert packages == env / "lib" / "python3.11" / "site-packages"
    with pytest.raises(SubmitError, match=r"for the Python of your job's image \(3\.11\.2\), but the site's image "
                                          r"for partition gpu runs Python 3\.12\.1.*--image"):
        checked_venv(req, "3.11.2", jobs, [("cpu", "3.11.2"), ("gpu", "3.12.1")])


def test_the_sites_variables_reach_every_job_and_an_export_of_the_same_name_wins(
        cli_env: FakeSlurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit (fake Slurm): policy.toml [containers] environment in the container's env file, under --export."""
    policy = tmp_path / "policy.toml"
    policy.write_text('[containers]\nenvironment = { OMP_NUM_THREADS = "1", HF_HOME = "/scratch/hf cache" }\n')
    monkeypatch.setenv("DLSUB_POLICY", str(policy))
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    monkeypatch.chdir(tmp_path)
    assert _submit("--json", str(script)).exit_code == 0
    env = _podman_env(Path(cli_env.submitted()[-1].script).read_text())
    assert env["OMP_NUM_THREADS"] == "1" and env["HF_HOME"] == "/scratch/hf cache"
    result = _submit("--json", "--export", "OMP_NUM_THREADS=3", str(script))
    assert result.exit_code == 0, result.output
    env = _podman_env(Path(cli_env.submitted()[-1].script).read_text())
    assert env["OMP_NUM_THREADS"] == "3" and env["HF_HOME"] == "/scratch/hf cache"


def test_site_variables_merge_under_the_users() -> None:
    """Unit, pure."""
    assert with_site_variables([("B", "site"), ("A", "site")], [("B", "user"), ("C", "user")]) == (
        ("A", "site"), ("B", "user"), ("C", "user"))
    assert with_site_variables([], []) == ()
