"""Unit: what `dlsub submit` promises users, against the fake Slurm: everything
after SCRIPT is the script's, #DLSUB lines in the script, a private job
directory (ACLs for the agent, or the 0711/0644 fallback), and the user
store's job states (checked transitions, a tested migration)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sqlite3
import stat
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import WEIRD_NAME

from dlsub.cli.main import main
from dlsub.contract import (
    AGENT_MAILBOX_DIR,
    ATTEMPTS_FILE,
    BATCH_SCRIPT,
    PROGRESS_FILE,
    IllegalTransition,
    JobState,
    StateSource,
)
from dlsub.job.user_store import JobRecord, JobStore, UnknownJob
from dlsub.slurm_plugins.fake import FakeSlurm


def invoke(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "main.py"
    path.write_text("print('training')\n")
    return path


def _script_words(fake: FakeSlurm) -> str:
    (job,) = fake.submitted()
    return Path(job.script).read_text()


# ---------------------------------------------------------------- arguments after SCRIPT


def test_flags_after_the_script_are_the_scripts(cli_env: FakeSlurm, script: Path) -> None:
    result = invoke(str(script), "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    assert len(cli_env.submitted()) == 1, "dlsub SCRIPT --dry-run submits: --dry-run is the script's"
    assert f"{script} --dry-run --json\n" in _script_words(cli_env)
    assert "submitted job" in result.stdout, "--json after SCRIPT is not dlsub's"


def test_a_third_party_script_keeps_its_own_dry_run(cli_env: FakeSlurm, script: Path) -> None:
    assert invoke(str(script), "--epochs", "1", "--dry-run").exit_code == 0
    assert f"{script} --epochs 1 --dry-run\n" in _script_words(cli_env)


def test_a_double_dash_after_the_script_is_passed_literally(cli_env: FakeSlurm, script: Path) -> None:
    assert invoke("--json", str(script), "a", "--", "--json").exit_code == 0
    assert f"{script} a -- --json\n" in _script_words(cli_env)


def test_options_before_the_script_are_dlsubs(cli_env: FakeSlurm, script: Path) -> None:
    result = invoke("--dry-run", str(script), "--gpus", "3")
    assert result.exit_code == 0 and cli_env.submitted() == []
    assert "--gres" not in result.stdout and f"{script} --gpus 3" in result.stdout


# ---------------------------------------------------------------- #DLSUB lines


def test_dlsub_lines_set_options_and_the_command_line_wins(cli_env: FakeSlurm, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("#!/usr/bin/env python3\n# -*- coding: utf-8 -*-\n#DLSUB --gpus 2 --time 30\n\n"
                      "#DLSUB -J 'from script'   # a comment\n\"\"\"Doc.\"\"\"\n#DLSUB --gpus 4\nprint(1)\n")
    out = json.loads(invoke("--json", "--time", "45", str(script)).stdout)
    job = cli_env.jobs[out["slurm_job_id"]]
    assert job.options["gres"] == "gpu:2", "#DLSUB --gpus 2 applies; the line after the docstring does not"
    assert job.options["time"] == "00:45:00", "the command line wins"
    assert job.options["job-name"] == "from_script"


def test_a_dlsub_line_sets_any_submit_option_the_command_line_takes(cli_env: FakeSlurm, tmp_path: Path) -> None:
    """--target-loss on a #DLSUB line reaches the job as on the command line (it was parsed, then dropped)."""
    script = tmp_path / "train.py"
    script.write_text("#DLSUB --target-loss 0.25 --mount-rw /tmp\nprint(1)\n")
    out = json.loads(invoke("--json", "--mount-rw", str(tmp_path), str(script)).stdout)
    text = Path(cli_env.jobs[out["slurm_job_id"]].script).read_text()
    assert "DLSUB_TARGET_LOSS=0.25" in text, "the script's --target-loss"
    assert [m["source"] for m in out["mounts"] if not m["read_only"]][-2:] == ["/tmp", str(tmp_path)], out["mounts"]


def test_every_submit_option_is_a_field_of_the_typed_record() -> None:
    """A new option of `dlsub submit` must be added to SubmitOptions, or submitting raises (never drops it)."""
    from dlsub.cli.main import submit
    from dlsub.cli.submit_options import SubmitOptions

    taken = {p.name for p in submit.params} - {"from_estimate", "choice", "script", "args"}
    assert taken == SubmitOptions.names()
    with pytest.raises(TypeError, match="not submit options: gpu"):
        SubmitOptions.from_params({"gpu": 1})


@pytest.mark.parametrize("line,message", [
    ("#DLSUB --gpus two", "--gpus 'two': give a number (2) or an elastic range MIN:MAX"),
    ("#DLSUB --gpu 2", "unknown option --gpu"),
    ("#DLSUB train.py", "'train.py' is not an option"),
    ("#DLSUB --time 1h30", "is not a time limit"),
    ("#DLSUB --gpus-per-node -1", "--gpus-per-node must be 0 or more"),
    ("#DLSUB --mem lots", "is not a memory size"),
    ("#DLSUB -J 'open", "No closing quotation"),
    ("#dlsub --gpus 1", "write #DLSUB in capitals"),
    ("#DLSUB--gpus 1", "put a space after #DLSUB"),
    ("#DLSUB --help", "does not belong on a #DLSUB line"),
    ("#DLSUB --from-estimate e1", "--from-estimate does not belong on a #DLSUB line"),
    ("#DLSUB --choice=2", "--choice=2 does not belong on a #DLSUB line"),
])
def test_a_bad_dlsub_line_exits_2_naming_the_line(cli_env: FakeSlurm, tmp_path: Path, line: str, message: str) -> None:
    script = tmp_path / "train.py"
    script.write_text(f"#!/usr/bin/env python3\n#DLSUB --cpus 1\n{line}\nprint(1)\n")
    result = invoke(str(script))
    assert result.exit_code == 2, result.output
    assert "train.py line 3" in result.output and message in result.output
    assert cli_env.submitted() == []
    jobs = tmp_path / "dlsub-home" / "jobs"
    assert not jobs.exists() or not any(jobs.iterdir())


# ---------------------------------------------------------------- private files


def _acl(path: Path) -> str:
    return subprocess.run(["getfacl", "-p", "--omit-header", str(path)],
                          capture_output=True, text=True, check=False).stdout


needs_acl = pytest.mark.skipif(shutil.which("setfacl") is None, reason="setfacl is not installed")


@needs_acl
def test_job_directory_is_private_with_acls_for_the_agent(cli_env: FakeSlurm, tmp_path: Path, script: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from dlsub.cli import main as cli
    from dlsub.site_config.policy_file import AgentPolicy

    monkeypatch.setattr(cli, "load_policy", lambda: AgentPolicy(agent_user="nobody"))
    umasks: list[int] = []
    original = cli_env._sbatch

    def sbatch(argv: list[str]):  # type: ignore[no-untyped-def]
        umasks.append(os.umask(0o077))
        os.umask(umasks[-1])
        return original(argv)

    monkeypatch.setattr(cli_env, "_sbatch", sbatch)
    out = json.loads(invoke("--json", str(script)).stdout)
    job_dir = Path(out["job_dir"])
    assert umasks == [0o077], "Slurm's output file takes sbatch's umask: owner-only"
    assert stat.S_IMODE(job_dir.stat().st_mode) & 0o707 == 0o700
    assert "user:nobody:--x" in _acl(job_dir) and "other::---" in _acl(job_dir)
    for name in (PROGRESS_FILE, ATTEMPTS_FILE):
        assert "user:nobody:r--" in _acl(job_dir / name) and "other::---" in _acl(job_dir / name)
    mailbox = job_dir / AGENT_MAILBOX_DIR  # the one place the agent may write: its batch-size choice
    assert "user:nobody:rwx" in _acl(mailbox) and "other::---" in _acl(mailbox) and "group::---" in _acl(mailbox)
    assert stat.S_IMODE((job_dir / BATCH_SCRIPT).stat().st_mode) == 0o600
    for parent in (job_dir.parent, job_dir.parent.parent):
        assert "user:nobody:--x" in _acl(parent) and "other::---" in _acl(parent)
    assert stat.S_IMODE((job_dir.parent.parent / "dlsub.db").stat().st_mode) == 0o600


def test_without_acls_falls_back_to_0711_and_0644_and_says_so(cli_env: FakeSlurm, script: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from dlsub.job.private_files import AgentAccess

    monkeypatch.setattr(AgentAccess, "_setfacl",
                        lambda self, path, perms: "setfacl: /x: Operation not supported")
    result = invoke("--json", str(script))
    assert result.exit_code == 0
    warnings = [line for line in result.output.splitlines() if "warning: no POSIX ACLs" in line]
    assert len(warnings) == 1 and "Operation not supported" in warnings[0] and "no mailbox" in warnings[0]
    job_dir = Path(json.loads(result.stdout)["job_dir"])
    assert not (job_dir / AGENT_MAILBOX_DIR).exists()
    assert stat.S_IMODE(job_dir.stat().st_mode) == 0o711
    assert stat.S_IMODE((job_dir / PROGRESS_FILE).stat().st_mode) == 0o644
    assert stat.S_IMODE(job_dir.parent.stat().st_mode) & 0o011 == 0o011


def test_a_home_the_agent_cannot_enter_is_pointed_out(cli_env: FakeSlurm, tmp_path: Path, script: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from dlsub.job import private_files

    closed = tmp_path / "closed"
    monkeypatch.setattr(private_files, "agent_can_traverse", lambda path, user: path != closed)
    monkeypatch.setenv("DLSUB_HOME", str(closed / ".dlsub"))
    result = invoke(str(script))
    assert result.exit_code == 0
    assert f"cannot enter {closed}" in result.output and "DLSUB_HOME" in result.output


@needs_acl
def test_a_home_of_the_users_own_that_lets_no_one_in_is_opened_to_the_agent_alone(
        cli_env: FakeSlurm, tmp_path: Path, script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 0700 home (pam_mkhomedir's default, common with directory users): submit lets the agent's account pass
    through it by ACL (x: enter, never list), as it passes ~/.dlsub, and says so with how to take it back; no
    other user gains anything; the next submit finds it open and says nothing."""
    from dlsub.cli import main as cli
    from dlsub.job import private_files
    from dlsub.site_config.policy_file import AgentPolicy

    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    real = private_files.agent_can_traverse
    # Only the home is judged (the test's own temporary folders above it are not this test's to open).
    monkeypatch.setattr(private_files, "agent_can_traverse",
                        lambda path, user: real(path, user) if path == home else True)
    monkeypatch.setattr(cli, "load_policy", lambda: AgentPolicy(agent_user="nobody"))
    monkeypatch.setenv("DLSUB_HOME", str(home / ".dlsub"))
    first = invoke(str(script))
    assert first.exit_code == 0, first.output
    assert f"{home} let no one else in: dlsub let the agent (user nobody) pass through it" in first.output
    assert f"setfacl -x u:nobody {home}" in first.output and "cannot enter" not in first.output
    acl = _acl(home)
    assert "user:nobody:--x" in acl and "group::---" in acl and "other::---" in acl, "nobody else gains anything"
    second = invoke(str(script))
    assert second.exit_code == 0 and "let no one else in" not in second.output


# ---------------------------------------------------------------- job states in the user's store


def _record(job_id: str = "0123abcd") -> JobRecord:
    return JobRecord(id=job_id, name="t", user="u", script="/t.py", args=[], job_dir="/j", partition="cpu",
                     gpus_per_node=0, nodes=1, cpus=1, mem_mb=100, time_limit_min=None, image="i")


def test_store_records_states_and_keeps_a_final_one_from_unknown_and_lag(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "dlsub.db")
    store.add(_record())
    assert store.observe("0123abcd", "PENDING") is JobState.PENDING
    assert store.observe("0123abcd", JobState.RUNNING) is JobState.RUNNING
    assert store.observe("0123abcd", JobState.PREEMPTED) is JobState.PREEMPTED
    with pytest.raises(IllegalTransition, match="final"):
        store.observe("0123abcd", JobState.UNKNOWN)
    with pytest.raises(IllegalTransition, match="lags"):
        store.observe("0123abcd", JobState.RUNNING, source=StateSource.ACCOUNTING)
    assert store.observed("0123abcd", JobState.UNKNOWN) is JobState.PREEMPTED
    assert store.get("0123abcd").state == "PREEMPTED"
    with pytest.raises(ValueError, match="observe"):
        store.update("0123abcd", state="RUNNING")


def test_a_number_is_a_slurm_job_id_never_a_prefix_of_a_dlsub_id(tmp_path: Path) -> None:
    """`dlsub cancel 904` for Slurm job 904 (not one of the store's) must not reach the caller's job 904a1b2c."""
    store = JobStore(tmp_path / "dlsub.db")
    store.add(_record("904a1b2c"))
    store.add(_record("12345678"))
    store.update("12345678", slurm_job_id=77)
    with pytest.raises(UnknownJob, match="Slurm job id 904"):
        store.get("904")
    assert store.get("904a").id == "904a1b2c", "a prefix with a letter still finds the job"
    assert store.get("77").id == "12345678" and store.get("12345678").id == "12345678"
    with pytest.raises(UnknownJob, match="Slurm job id 1234"):
        store.get("1234")


def test_weird_paths_submit_as_any_other(cli_env: FakeSlurm, weird_dir: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A script, its arguments and DLSUB_HOME with spaces, quotes, ;, $, non-ASCII and a leading dash; a line
    break is carried in the script's path and refused, with a message, only where #SBATCH --output needs it."""
    script = weird_dir / "-train; 'é' $x.py"
    script.write_text("print('training')\n")
    home = weird_dir.parent / WEIRD_NAME.replace("\n", " ") / "dlsub-home"
    monkeypatch.setenv("DLSUB_HOME", str(home))
    result = invoke("--json", str(script), "--note", "it's $HOME; `id`")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    record = JobStore(home / "dlsub.db").get(out["id"])
    assert record.script == str(script) and record.args == ["--note", "it's $HOME; `id`"]
    assert Path(record.job_dir).parent == home / "jobs"
    batch = Path(cli_env.submitted()[-1].script)
    text = batch.read_text()
    assert shlex.quote(str(script)) in text and shlex.quote("it's $HOME; `id`") in text
    assert subprocess.run(["bash", "-n", str(batch)], capture_output=True).returncode == 0
    # Relative, from the script's parent: after `--` a leading dash is the script's name, not an option.
    monkeypatch.chdir(weird_dir.parent)
    relative = invoke("submit", "--dry-run", "--", f"{WEIRD_NAME}/{script.name}")
    assert relative.exit_code == 0, relative.output
    assert shlex.quote(str(script)) in relative.output
    monkeypatch.setenv("DLSUB_HOME", str(weird_dir / "dlsub-home"))
    refused = invoke(str(script))
    assert refused.exit_code == 2 and "line break" in refused.output and "DLSUB_HOME" in refused.output


def test_status_keeps_a_completed_job_completed_after_slurm_forgets_it(cli_env: FakeSlurm, script: Path) -> None:
    out = json.loads(invoke("--json", str(script)).stdout)
    cli_env.set_job_state(out["slurm_job_id"], "COMPLETED", nodes="cpu1")
    assert json.loads(invoke("status", out["id"], "--json").stdout)["state"] == "COMPLETED"
    cli_env.jobs.pop(out["slurm_job_id"])  # purged, and no accounting either
    assert json.loads(invoke("status", out["id"], "--json").stdout)["state"] == "COMPLETED"


def test_a_store_made_by_the_previous_schema_keeps_working(tmp_path: Path) -> None:
    path = tmp_path / "dlsub.db"
    db = sqlite3.connect(path)
    # The jobs table exactly as main's first schema made it.
    db.execute("CREATE TABLE [jobs] ([id] TEXT PRIMARY KEY, [name] TEXT, [user] TEXT, [script] TEXT, [args] TEXT, "
               "[job_dir] TEXT, [partition] TEXT, [gpus_per_node] INTEGER, [nodes] INTEGER, [cpus] INTEGER, "
               "[mem_mb] INTEGER, [time_limit_min] INTEGER, [image] TEXT, [slurm_job_id] INTEGER, "
               "[submitted_at] FLOAT, [cancelled_at] FLOAT)")
    db.execute("CREATE INDEX [idx_jobs_slurm_job_id] ON [jobs] ([slurm_job_id])")
    db.execute("INSERT INTO jobs VALUES ('0123abcd','t','u','/t.py','[\"--lr\"]','/j','cpu',0,1,1,100,NULL,'i',"
               "42,1.0,NULL)")
    db.commit()
    db.close()
    store = JobStore(path)
    old = store.get("42")
    assert old.id == "0123abcd" and old.args == ["--lr"] and old.state is None and old.mounts == []
    assert store.observe("0123abcd", "RUNNING") is JobState.RUNNING
    store.add(_record("89abcdef"))
    assert [r.id for r in JobStore(path).all()] == ["0123abcd", "89abcdef"]
