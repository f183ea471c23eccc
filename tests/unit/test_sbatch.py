"""Unit: batch-script rendering (pure) — a golden file, shellcheck over the
template and a rendered script, and the rendered script run by bash with
stand-in `podman`/`scontrol` to prove its quoting, its resume protocol, its
continuation bound and its private runtime directory. No Slurm and no Podman
involved."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import NO_HANG_S

from dlsub import contract
from dlsub.containers.mounts import ORIGIN_SITE, Mount
from dlsub.containers.podman import ContainerSpec
from dlsub.slurm_plugins import sbatch
from dlsub.slurm_plugins.launcher import host
from dlsub.slurm_plugins.launcher.container import ContainerRun, podman_argv
from dlsub.slurm_plugins.launcher.gpus import gpu_setup
from dlsub.slurm_plugins.sbatch import BatchSpec, fill_template, render_sbatch

GOLDEN = Path(__file__).parent / "golden" / "train.sbatch"
LIBRARY = Path("/opt/dlsub/venv/lib/python3.11/site-packages/dlsub")
PYTHON = "/opt/dlsub/venv/bin/python"
NASTY_ARGS = ("--lr", "0.1", "a b", "it's", 'say "hi"', "x; touch /tmp/dlsub-pwned", "$(id)", "`id`", "*")


def spec(tmp: Path, script: Path, args: tuple[str, ...] = ("--epochs", "3"), gpus: int = 0,
         max_continuations: int = 20) -> BatchSpec:
    container = ContainerSpec(
        image="localhost/dlsub-torch:2.13.0-cpu",
        script=script,
        script_args=args,
        job_dir=tmp / "home" / ".dlsub" / "jobs" / "0123abcd",
        workdir=script.parent,
        library_dir=LIBRARY,
        nproc_per_node=max(1, gpus),
    )
    return BatchSpec(
        dlsub_id="0123abcd", job_name="train", partition="gpu", container=container,
        gpus_per_node=gpus, cpus_per_task=2, mem_mb=4096, time_limit_min=90, signal_grace_s=60,
        dlsub_version="0.1.0", max_continuations=max_continuations,
        python=sys.executable,  # the launcher the rendered script execs: this dlsub's (test_golden names a site's)
    )


def test_golden_batch_script() -> None:
    base = dataclasses.replace(spec(Path("/golden"), Path("/home/alice/proj/train.py"), gpus=2), python=PYTHON)
    # A site's read-write scratch behind a symbolic link, and a user's read-only data folder.
    mounts = (Mount(Path("/lustre/scratch"), Path("/scratch"), read_only=False, origin=ORIGIN_SITE),
              Mount(Path("/projects/alice/data"), Path("/projects/alice/data")))
    text = render_sbatch(dataclasses.replace(base, container=dataclasses.replace(base.container,
                                                                                 extra_mounts=mounts)))
    if os.environ.get("DLSUB_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "rendered script changed; review it, then DLSUB_UPDATE_GOLDEN=1 pytest"


def test_a_kind_of_gpu_is_asked_for_in_the_gres_line_and_checked() -> None:
    """Pure rendering: ``gpu_type`` names the kind in --gres; nothing else of the script changes; a name that
    is not a GRES type's (it would break the directive) is refused."""
    base = spec(Path("/golden"), Path("/home/alice/proj/train.py"), gpus=2)
    typed = render_sbatch(dataclasses.replace(base, gpu_type="a100"))
    assert "#SBATCH --gres=gpu:a100:2\n" in typed
    assert typed.replace("--gres=gpu:a100:2", "--gres=gpu:2") == render_sbatch(base)
    for bad in ("a100 --wrap=id", "a100:4", "a\nb"):
        with pytest.raises(ValueError, match="GPU type"):
            render_sbatch(dataclasses.replace(base, gpu_type=bad))


def _stub(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def _run_script(tmp_path: Path, script: Path, args: tuple[str, ...], container_rc: int, *,
                max_continuations: int = 20, env_extra: dict[str, str] | None = None,
                podman_body: str | None = None, after_start: object | None = None,
                text: str | None = None, scontrol_body: str = "exit 0\n", scontrol_first: str = "") -> tuple[int, Path]:
    """Run the batch script rendered for ``script`` (or ``text``, a rendered one) under bash, with stand-in
    ``podman`` and ``scontrol`` that record their argv; its exit status and the record."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "calls.jsonl"
    # Stand-ins record their argv as JSON; python3 keeps the record exact.
    record = f'python3 -c \'import json,sys; print(json.dumps(sys.argv[1:]))\' "$(basename "$0")" "$@" >> {log}\n'
    _stub(bin_dir, "podman",
          record + 'case "$1" in rm | kill) exit 0 ;; esac\n' + (podman_body or f"exit {container_rc}\n"))
    _stub(bin_dir, "scontrol", scontrol_first + record + scontrol_body)
    if text is None:
        text = render_sbatch(spec(tmp_path, script, args, max_continuations=max_continuations))
    # dlsub's package, which the container mounts, as a node has it (unless the test took it away).
    library = tmp_path / "site-packages" / "dlsub"
    (library / "checkpointing").mkdir(parents=True, exist_ok=True)
    (library / "checkpointing" / "launch.py").touch()
    text = text.replace(f"--library-dir {LIBRARY} ", f"--library-dir {shlex.quote(str(library))} ")
    batch = tmp_path / "job.sbatch"
    batch.write_text(text)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_JOB_ID="77", SLURM_RESTART_COUNT="0",
               SLURM_JOB_PARTITION="gpu", XDG_RUNTIME_DIR=str(tmp_path / "xdg"))
    env.update(env_extra or {})
    (tmp_path / "xdg").mkdir(mode=0o700, exist_ok=True)
    proc = subprocess.Popen(["bash", str(batch)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp_path)
    if callable(after_start):
        after_start(proc, log)
    _, err = proc.communicate(timeout=NO_HANG_S)
    (tmp_path / "stderr.txt").write_text(err)
    return proc.returncode, log


def _calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_nasty_paths_and_arguments_reach_the_container_intact(tmp_path: Path) -> None:
    weird_dir = tmp_path / "my dir; it's \"quoted\""
    weird_dir.mkdir()
    script = weird_dir / "train me;.py"
    script.write_text("print('hi')\n")
    rc, log = _run_script(tmp_path, script, NASTY_ARGS, container_rc=0)
    assert rc == 0
    assert not Path("/tmp/dlsub-pwned").exists()
    run = next(c for c in _calls(log) if c[:1] == ["podman"] and "run" in c)
    # The script and its arguments are the last words, exactly as given.
    assert run[-len(NASTY_ARGS) - 1:] == [str(script), *NASTY_ARGS]
    assert f"{weird_dir}:{weird_dir}" in run
    assert "dlsub.slurm_job_id=77" in run and "dlsub.attempt=77-0" in run
    assert not any(c[:2] == ["scontrol", "requeue"] for c in _calls(log))


def test_a_node_without_dlsubs_package_fails_the_attempt_saying_how_a_site_provides_it(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    missing = tmp_path / "not here"
    text = render_sbatch(spec(tmp_path, script, ())).replace(f"--library-dir {LIBRARY} ",
                                                             f"--library-dir {shlex.quote(str(missing))} ")
    rc, log = _run_script(tmp_path, script, (), 0, text=text)
    assert rc == 1
    assert not log.exists(), "neither podman nor scontrol ran"
    err = (tmp_path / "stderr.txt").read_text()
    assert f"{missing}, which the container mounts, is not on node" in err
    assert "shared software path" in err and "dlsub doctor" in err
    attempts = (tmp_path / "home/.dlsub/jobs/0123abcd" / contract.ATTEMPTS_FILE).read_text().splitlines()
    assert [e["rc"] for e in map(json.loads, attempts) if e["event"] == contract.EVENT_END] == [1]


def test_resume_exit_code_requeues_the_job(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    rc, log = _run_script(tmp_path, script, (), container_rc=85)
    assert rc == 0
    assert ["scontrol", "requeue", "77"] in _calls(log)
    attempts = (tmp_path / "home/.dlsub/jobs/0123abcd/attempts.jsonl").read_text().splitlines()
    assert json.loads(attempts[-1])["action"] == "requeue"


@pytest.mark.parametrize("podman_rc", [127, 140])
@pytest.mark.parametrize(("record", "requeued", "final_rc"), [
    ("85\n", True, 0),  # the launcher left with 85: the attempt is resumed as if podman had said so
    ("0\n", False, 0),  # the training finished
    ("85; rm -rf ~\n", False, None),  # not a status: podman's stands
    (None, False, None),  # no record (the launcher was killed): podman's stands
])
def test_an_exit_status_podman_lost_is_read_from_the_launchers_record(
        tmp_path: Path, record: str | None, requeued: bool, final_rc: int | None, podman_rc: int) -> None:
    """Unit (the batch script under bash; a stand-in podman that exits 127 as podman run does when a signal it
    proxies meets the container's exit, "container has already been removed", or 140 as when a second USR2,
    which `scancel --batch` sends the batch shell's children too, kills podman run itself): the launcher's own
    record of its exit status (contract.exit_record, checkpointing.launch.record_exit) counts then; junk never
    does."""
    script = tmp_path / "train.py"
    script.write_text("")
    write = (f'printf %s {shlex.quote(record)} > "$DLSUB_JOB_DIR/{contract.MARKERS_DIR}/$DLSUB_CONTAINER.exit"\n'
             if record is not None else "")
    rc, log = _run_script(tmp_path, script, (), 0, podman_body=write + f"exit {podman_rc}\n")
    assert rc == (podman_rc if final_rc is None else final_rc), (tmp_path / "stderr.txt").read_text()
    assert (["scontrol", "requeue", "77"] in _calls(log)) == requeued
    assert not list((tmp_path / "home/.dlsub/jobs/0123abcd" / contract.MARKERS_DIR).glob("*.exit")), "read once"
    run = next(c for c in _calls(log) if c[:1] == ["podman"] and "run" in c)
    assert contract.ENV_CONTAINER in _values(run, "--env"), "the container knows its name"


def test_failure_exit_code_is_kept_and_not_requeued(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    rc, log = _run_script(tmp_path, script, (), container_rc=3)
    assert rc == 3
    assert not any(c[:2] == ["scontrol", "requeue"] for c in _calls(log))
    assert any(c[:2] == ["podman", "rm"] for c in _calls(log)), "the EXIT trap removes the container"


def test_a_gang_runs_one_task_per_node_under_one_rendezvous(tmp_path: Path) -> None:
    """Unit (the batch script under bash, its launcher, a stand-in srun): a job of two nodes renders one
    rendezvous for torchrun, and its batch step runs the script's node part once per node through srun,
    publishing the rendezvous for late joiners."""
    script = tmp_path / "t.py"
    script.write_text("")
    s = spec(tmp_path, script, ())
    text = render_sbatch(BatchSpec(**{**s.__dict__, "nodes": 2, "gpus_per_node": 2}))
    assert "#SBATCH --nodes=2" in text and "#SBATCH --gres=gpu:2" in text
    assert "--gang 1" in text and "torchrun --standalone" not in text
    assert "torchrun --nnodes 2 --nproc-per-node" in text
    assert "--rdzv-backend c10d --rdzv-endpoint \"${DLSUB_RDZV_ENDPOINT}\" --rdzv-id 0123abcd" in text
    assert "--max-restarts 0" in text and "--elastic" not in text
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    seen = tmp_path / "srun-env"
    calls = tmp_path / "calls.jsonl"
    record = f'python3 -c \'import json,sys; print(json.dumps(sys.argv[1:]))\' srun "$@" >> {calls}\n'
    _stub(bin_dir, "srun", f'echo "$DLSUB_RDZV_ENDPOINT $DLSUB_ATTEMPT" > {seen}\n' + record)
    rc, log = _run_script(tmp_path, script, (), 0, text=text, env_extra={"SLURM_NNODES": "2"})
    assert rc == 0, (tmp_path / "stderr.txt").read_text()
    job_dir = s.container.job_dir
    assert ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=0", "bash",
            str(job_dir / contract.BATCH_SCRIPT), "node"] in _calls(log)
    assert not any(c[:1] == ["podman"] and "run" in c for c in _calls(log)), "the nodes run the containers"
    endpoint, attempt = seen.read_text().split()
    assert attempt == "77-0" and endpoint.rsplit(":", 1)[1].isdigit()
    rendezvous = (job_dir / contract.MARKERS_DIR / contract.RENDEZVOUS_FILE).read_text()
    assert rendezvous == f"{endpoint} 77-0 77\n"


def test_an_elastic_job_renders_a_main_and_a_held_worker_array(tmp_path: Path) -> None:
    s = spec(tmp_path, tmp_path / "t.py")
    main = render_sbatch(BatchSpec(**{**s.__dict__, "elastic": (1, 3), "worker_array": 4242}))
    assert "#SBATCH --nodes=1" in main and "torchrun --nnodes 1:3" in main and "--max-restarts 3" in main
    assert "dlsub.checkpointing.launch --grace" in main and "--elastic --" in main
    assert "--worker-array 4242" in main and "#SBATCH --array" not in main
    worker = render_sbatch(BatchSpec(**{**s.__dict__, "elastic": (1, 3), "role": "worker"}))
    assert "#SBATCH --array=0-1" in worker and "#SBATCH --hold" in worker and "role=worker" in worker
    assert "--elastic --follow" in worker and "--follow" not in main, "a worker re-forms only with its main job"
    with pytest.raises(ValueError, match="worker script belongs to an elastic job"):
        render_sbatch(BatchSpec(**{**s.__dict__, "role": "worker"}))
    with pytest.raises(ValueError, match="nodes must be 1 or more"):
        render_sbatch(BatchSpec(**{**s.__dict__, "nodes": 0}))


def test_template_and_rendered_script_pass_shellcheck(tmp_path: Path, shellcheck: str) -> None:
    checker = shellcheck
    rendered = tmp_path / "job.sbatch"
    weird = tmp_path / "it's a dir; $(x)"
    rendered.write_text(render_sbatch(spec(tmp_path, weird / "train.py", NASTY_ARGS, gpus=1)))
    template = Path(sbatch.__file__).with_name(sbatch.TEMPLATE)
    for path in (template, rendered, GOLDEN):
        result = subprocess.run([checker, str(path)], capture_output=True, text=True, check=False)
        assert result.returncode == 0, f"shellcheck {path}:\n{result.stdout}{result.stderr}"


def test_every_placeholder_is_filled_and_every_value_used() -> None:
    with pytest.raises(KeyError, match="@NEW@"):
        fill_template("x=@NEW@\n", {}, {})
    with pytest.raises(KeyError, match="lacks @GONE@"):
        fill_template("x=1\n", {"GONE": "1"}, {})
    # A user string that looks like a placeholder stays as it is.
    assert fill_template("a=@A@ b=@B@\n", {"A": "@B@", "B": "2"}, {}) == "a=@B@ b=2\n"


def test_contract_names_reach_the_script(tmp_path: Path) -> None:
    """The script's own words from the contract; the launcher imports the rest (exit code, files, events)."""
    text = render_sbatch(spec(tmp_path, tmp_path / "t.py", max_continuations=7))
    assert f"--signal=B:{contract.CHECKPOINT_SIGNAL}@60" in text
    assert "--max-continuations 7" in text
    assert f"/{contract.OUTPUT_PATTERN}" in text


def _counter(tmp_path: Path) -> Path:
    return tmp_path / "home/.dlsub/jobs/0123abcd" / contract.MARKERS_DIR / contract.REQUEUE_COUNT_FILE


def test_resume_requeues_are_counted_and_bounded(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    rc, log = _run_script(tmp_path, script, (), container_rc=85, max_continuations=2)
    assert rc == 0 and ["scontrol", "requeue", "77"] in _calls(log)
    assert _counter(tmp_path).read_text().strip() == "1"
    log.unlink()
    _counter(tmp_path).write_text("2\n")
    rc, log = _run_script(tmp_path, script, (), container_rc=85, max_continuations=2)
    assert rc == 85, "past the bound the job ends with the resume code"
    assert not any(c[:2] == ["scontrol", "requeue"] for c in _calls(log))
    assert "used its 2 continuations" in (tmp_path / "stderr.txt").read_text()
    attempts = (tmp_path / "home/.dlsub/jobs/0123abcd/attempts.jsonl").read_text().splitlines()
    last = json.loads(attempts[-1])
    assert last["event"] == "end" and last["rc"] == 85 and "action" not in last


def test_no_continuations_when_the_policy_turns_them_off(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    rc, log = _run_script(tmp_path, script, (), container_rc=85, max_continuations=0)
    assert rc == 85 and not any(c[:1] == ["scontrol"] for c in _calls(log))
    assert "used its 0 continuations" in (tmp_path / "stderr.txt").read_text()


def test_a_garbled_counter_reads_as_zero(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    _counter(tmp_path).parent.mkdir(parents=True)
    _counter(tmp_path).write_text("$(touch /tmp/dlsub-pwned) 99x\n")
    rc, log = _run_script(tmp_path, script, (), container_rc=85, max_continuations=1)
    assert rc == 0 and ["scontrol", "requeue", "77"] in _calls(log)
    assert _counter(tmp_path).read_text().strip() == "1"


def _send_when_started(sig: signal.Signals):  # type: ignore[no-untyped-def]
    def send(proc: subprocess.Popen[str], log: Path) -> None:
        deadline = time.monotonic() + 10
        ready = log.with_name("container-ready")  # the stand-in container has its trap
        while time.monotonic() < deadline and not ready.exists():
            time.sleep(0.05)
        proc.send_signal(sig)
    return send


def test_a_move_requeues_held_and_does_not_count(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    # The stand-in container checkpoints (exit 85) when the batch shell forwards USR1.
    body = ("sleep 20 &\npid=$!\ntrap 'kill $pid; exit 85' USR1\n"
            f"touch {tmp_path / 'container-ready'}\nwait $pid\nexit 0\n")
    rc, log = _run_script(tmp_path, script, (), container_rc=0, max_continuations=0, podman_body=body,
                          after_start=_send_when_started(signal.SIGUSR2))
    assert rc == 0, (tmp_path / "stderr.txt").read_text()
    assert ["scontrol", "requeuehold", "77"] in _calls(log)
    container = "dlsub-0123abcd-77-0-trainer0"
    assert ["podman", "kill", "--signal", "USR1", container] in _calls(log), "said to the container too"
    assert not _counter(tmp_path).exists(), "a move is not a continuation"


def test_a_move_signal_sent_again_after_the_container_ended_changes_nothing(tmp_path: Path) -> None:
    """Unit (the batch script under bash and its launcher; stand-ins for podman and scontrol): the move signal
    arrives a second time after the container checkpointed and ended, while the launcher requeues the job, as
    when the agent restarts and asks again. `scancel --batch` signals the batch step and its children, so the
    stand-in `scontrol requeuehold` sends it to both. The attempt still ends as a move, with whole records,
    and is requeued held (the request is ignored by the launcher and, inherited, by scontrol)."""
    script = tmp_path / "train.py"
    script.write_text("")
    ended = tmp_path / "container-ended"
    body = (f"sleep 20 &\npid=$!\ntrap 'kill $pid; touch {ended}; exit 85' USR1\n"
            f"touch {tmp_path / 'container-ready'}\nwait $pid\nexit 0\n")
    again = f'[ "$1" = requeuehold ] && [ -e {ended} ] && kill -s USR2 "$PPID" "$$"\n'
    rc, log = _run_script(tmp_path, script, (), container_rc=0, max_continuations=0, podman_body=body,
                          after_start=_send_when_started(signal.SIGUSR2), scontrol_body="exit 0\n",
                          scontrol_first=again)
    err = (tmp_path / "stderr.txt").read_text()
    assert rc == 0, err
    assert ["scontrol", "requeuehold", "77"] in _calls(log), err
    attempts = tmp_path / "home/.dlsub/jobs/0123abcd" / contract.ATTEMPTS_FILE
    records = [json.loads(line) for line in attempts.read_text().splitlines()]
    assert [r["event"] for r in records] == [contract.EVENT_START, contract.EVENT_END], records
    assert records[-1]["action"] == contract.ACTION_MOVE and records[-1]["rc"] == 85, records
    assert err.count("received SIGUSR1") == 1, err


def test_a_squatted_runtime_directory_is_refused_before_podman(tmp_path: Path) -> None:
    """Unit (the launcher's runtime directory, real directories): with no usable XDG_RUNTIME_DIR and no
    /run/user/UID, a fallback another user could have made (a symbolic link to theirs) is refused, and the
    message says what to do."""
    uid = os.getuid()
    if os.access(f"/run/user/{uid}", os.W_OK):
        pytest.skip(f"/run/user/{uid} exists here, so the fallback is not used")
    elsewhere = tmp_path / "attacker"
    elsewhere.mkdir(mode=0o777)
    fallback = tmp_path / f"xdg-fallback-{uid}"
    fallback.symlink_to(elsewhere)
    with pytest.raises(host.RuntimeDirRefused, match="is not a directory of yours with mode 700"):
        host.runtime_dir({"XDG_RUNTIME_DIR": ""}, uid, fallback)
    assert host.runtime_dir({"XDG_RUNTIME_DIR": str(elsewhere)}, uid, fallback) is None, "the job's own wins"


def test_the_runtime_directory_fallback_is_made_private(tmp_path: Path) -> None:
    uid = os.getuid()
    if os.access(f"/run/user/{uid}", os.W_OK):
        pytest.skip(f"/run/user/{uid} exists here, so the fallback is not used")
    fallback = tmp_path / f"xdg-fallback-{uid}"
    old = os.umask(0o277)  # even a umask that takes the owner's bits: `mkdir -m 700`
    try:
        assert host.runtime_dir({}, uid, fallback) == str(fallback)
    finally:
        os.umask(old)
    made = fallback.lstat()
    assert stat.S_ISDIR(made.st_mode) and made.st_mode & 0o777 == 0o700 and made.st_uid == uid


def test_a_cpu_component_makes_one_heterogeneous_job(tmp_path: Path) -> None:
    """Rendering, then the batch script under bash with its launcher and a stand-in srun: the two parts start
    together, the CPU part without the GPU component's GPU variables and as role cpu."""
    script = tmp_path / "t.py"
    script.write_text("")
    s = spec(tmp_path, script, ())
    text = render_sbatch(BatchSpec(**{**s.__dict__, "gpus_per_node": 2, "cpu_nodes": 1, "cpu_partition": "cpu"}))
    head = text.split("#SBATCH hetjob", 1)
    assert len(head) == 2, "sbatch's separator between the two components"
    assert "#SBATCH --gres=gpu:2" in head[0] and "#SBATCH --partition=cpu" in head[1]
    assert "--gres" not in head[1].split("\n\n")[0], "the CPU component asks for no GPUs"
    assert "--het 1" in text and "DLSUB_ROLE=cpu" in text and "python3 /" in text, "the CPU part runs the script "
    with pytest.raises(ValueError, match="cannot be job arrays"):
        render_sbatch(BatchSpec(**{**s.__dict__, "cpu_nodes": 1, "cpu_partition": "cpu", "elastic": (1, 2)}))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # The launcher stops the CPU part once the trainers' part ends: the trainers' stand-in ends only once the CPU
    # part's has written its line (or after 10 s), so the test does not race the CPU part's start.
    parts_file = tmp_path / "parts"
    _stub(bin_dir, "srun", f'echo "$1 ${{DLSUB_ROLE-}} ${{CUDA_VISIBLE_DEVICES-unset}} $DLSUB_TRAINER_NODES '
                           f'$DLSUB_CPU_NODES" >> {parts_file}\n'
                           f'if [ "$1" = --het-group=0 ]; then for _ in $(seq 200); do '
                           f'grep -q het-group=1 {parts_file} && break; sleep 0.05; done; fi\n')
    parts_env = {"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_JOB_NODELIST_HET_GROUP_0": "gpu1",
                 "SLURM_JOB_NODELIST_HET_GROUP_1": "cpu1"}
    rc, log = _run_script(tmp_path, script, (), 0, text=text, env_extra=parts_env)
    assert rc == 0, (tmp_path / "stderr.txt").read_text()
    parts = sorted((tmp_path / "parts").read_text().splitlines())
    assert parts == ["--het-group=0 trainer 0,1 gpu1 cpu1", "--het-group=1 cpu unset gpu1 cpu1"]


@pytest.mark.parametrize(("env", "devices", "inside"), [
    # task/cgroup with ConstrainDevices=yes: CUDA_VISIBLE_DEVICES counts within the job; Slurm's ids are global.
    ({"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_JOB_GPUS": "2,3"}, ["nvidia.com/gpu=2", "nvidia.com/gpu=3"], "0,1"),
    # The same in an srun step (a gang's node): the step's ids win over the batch step's.
    ({"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_JOB_GPUS": "0,1,2,3", "SLURM_STEP_GPUS": "1,3"},
     ["nvidia.com/gpu=1", "nvidia.com/gpu=3"], "0,1"),
    # No device constraint: every variable holds the global ids.
    ({"CUDA_VISIBLE_DEVICES": "2,3", "SLURM_JOB_GPUS": "2,3"}, ["nvidia.com/gpu=2", "nvidia.com/gpu=3"], "0,1"),
    # A Slurm that sets neither (or garbage in them): CUDA_VISIBLE_DEVICES, as before.
    ({"CUDA_VISIBLE_DEVICES": "3", "SLURM_JOB_GPUS": "3;x"}, ["nvidia.com/gpu=3"], "0"),
])
def test_cdi_devices_come_from_slurms_global_gpu_ids(tmp_path: Path, env: dict[str, str], devices: list[str],
                                                     inside: str) -> None:
    run = _podman_run_with_gpus(tmp_path, env, cdi=True)
    assert _values(run, "--device") == devices
    assert f"CUDA_VISIBLE_DEVICES={inside}" in _values(run, "--env")
    assert set(_values(run, "--nproc-per-node")) == {str(len(devices))}  # the launcher's and torchrun's


def test_without_a_cdi_spec_the_gpus_pass_through_as_slurm_numbered_them(tmp_path: Path) -> None:
    run = _podman_run_with_gpus(tmp_path, {"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_JOB_GPUS": "2,3"}, cdi=False)
    assert _values(run, "--device") == []
    assert "CUDA_VISIBLE_DEVICES=0,1" in _values(run, "--env")
    assert set(_values(run, "--nproc-per-node")) == {"2"}


def test_the_container_stays_in_the_jobs_cgroup_whatever_the_users_podman_config(tmp_path: Path) -> None:
    run = _podman_run_with_gpus(tmp_path, {}, cdi=False)
    # No --runtime: the node's Podman default, unless the site or the user names one (below).
    assert run[:run.index("run")] == ["podman", "--cgroup-manager", "cgroupfs"]
    assert _values(run, "--cgroupns") == ["host"]


def test_a_runtime_the_site_names_goes_before_run(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    base = spec(tmp_path, script, ())
    text = render_sbatch(dataclasses.replace(base, container=dataclasses.replace(base.container, runtime="crun")))
    rc, log = _run_script(tmp_path, script, (), 0, text=text)
    assert rc == 0, (tmp_path / "stderr.txt").read_text()
    run = next(c for c in _calls(log) if c[:1] == ["podman"] and "run" in c)
    assert run[:run.index("run")] == ["podman", "--runtime", "crun", "--cgroup-manager", "cgroupfs"]


def test_mounts_with_spaces_quotes_and_semicolons_reach_podman_as_one_word_each(tmp_path: Path) -> None:
    """Unit, with a stand-in podman: the batch script hands each --volume over whole, read-only ones with :ro,
    a mount behind a symbolic link from its real path, and runs nothing the paths say."""
    (tmp_path / "proj").mkdir()
    script = tmp_path / "proj" / "train.py"
    script.write_text("")
    shared = tmp_path / "shared"  # outside the script's, submit and job directories
    data = shared / "data; touch pwned 'x' \"y\" $(id)"
    out = shared / "out dir"
    real = shared / "real scratch"
    mounts = (Mount(data, data), Mount(out, out, read_only=False), Mount(real, shared / "scratch link"))
    base = spec(tmp_path, script, ())
    text = render_sbatch(dataclasses.replace(base, container=dataclasses.replace(base.container,
                                                                                 extra_mounts=mounts)))
    rc, log = _run_script(tmp_path, script, (), 0, text=text)
    assert rc == 0, (tmp_path / "stderr.txt").read_text()
    run = next(c for c in _calls(log) if c[:1] == ["podman"] and "run" in c)
    volumes = _values(run, "--volume")
    assert f"{data}:{data}:ro" in volumes
    assert f"{out}:{out}" in volumes
    assert f"{real}:{shared / 'scratch link'}:ro" in volumes
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()


def _podman_run_with_gpus(tmp_path: Path, env: dict[str, str], cdi: bool) -> list[str]:
    """Unit (the launcher's GPU setup, then the rendered script's container part under bash, a stand-in
    podman): the ``podman run`` argv for a node with Slurm's GPU variables ``env``, with or without a CDI
    spec for its GPUs (gpus.node_has_cdi_gpus, tested apart)."""
    script = tmp_path / "train.py"
    script.write_text("")
    base = spec(tmp_path, script, ())
    # The count of processes left to the script, as for a job that may move between CPU and GPU nodes.
    text = render_sbatch(dataclasses.replace(base, container=dataclasses.replace(base.container, nproc_per_node=0)))
    batch = tmp_path / "job.sbatch"
    batch.write_text(text)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.jsonl"
    _stub(bin_dir, "podman", f'python3 -c \'import json,sys; print(json.dumps(sys.argv[1:]))\' podman "$@" >> {log}\n')
    run = ContainerRun(batch, "dlsub-0123abcd-77-0-trainer0", tmp_path / "exit", LIBRARY, "is_host=1")
    argv = podman_argv(run, gpu_setup(env, has_cdi=lambda: cdi))
    child_env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_JOB_ID="77",
                     DLSUB_CONTAINER="dlsub-0123abcd-77-0-trainer0")
    subprocess.run(argv, env=child_env, check=True)
    return _calls(log)[0]


def _values(argv: list[str], option: str) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv[:-1]) if word == option]


def _gpu_type_seen(tmp_path: Path, gres: str, env: dict[str, str]) -> tuple[str, dict[str, object]]:
    """Unit (the batch script under bash, a stand-in scontrol answering `scontrol -o show node` with a node whose
    GRES is ``gres``): DLSUB_GPU_TYPE as podman saw it, and the attempt's start record."""
    script = tmp_path / "train.py"
    script.write_text("")
    seen = tmp_path / "seen.txt"
    node = f'[ "$1 $2 $3" = "-o show node" ] && echo "NodeName=$4 Arch=x86_64 CoresPerSocket=1 Gres={gres} OS=Linux"\n'
    rc, log = _run_script(tmp_path, script, (), 0, env_extra={"SLURMD_NODENAME": "gpu7", **env},
                          podman_body=f'echo "${{DLSUB_GPU_TYPE-unset}}" > {seen}\nexit 0\n',
                          scontrol_body=node + "exit 0\n")
    assert rc == 0, (tmp_path / "stderr.txt").read_text()
    run = next(c for c in _calls(log) if c[:1] == ["podman"] and "run" in c)
    assert "DLSUB_GPU_TYPE" in _values(run, "--env")
    starts = [json.loads(line) for line in (tmp_path / "home/.dlsub/jobs/0123abcd" / contract.ATTEMPTS_FILE)
              .read_text().splitlines()]
    return seen.read_text().strip(), next(a for a in starts if a["event"] == "start")


@pytest.mark.parametrize(("gres", "gpu_type"), [
    ("gpu:a100:4(S:0)", "a100"),
    ("gpu:4", ""),  # untyped GPUs
    ("gpu:a100:2(S:0),gpu:v100:2(S:1),gpu:a100:1", "a100,v100"),  # one node, two kinds: both, once each
    ("gpu:a\"1:4", ""),  # a name JSON or a shell would read otherwise: left out
    (f"gpu:{'x' * 65}:4", ""),  # longer than contract.GPU_TYPE_PATTERN allows: left out, as the agent would
    (f"gpu:{'x' * 64}:4", "x" * 64),
    ("(null)", ""),
])
def test_the_gpu_type_comes_from_the_nodes_gres(tmp_path: Path, gres: str, gpu_type: str) -> None:
    seen, start = _gpu_type_seen(tmp_path, gres, {"CUDA_VISIBLE_DEVICES": "0", "SLURM_JOB_GPUS": "0"})
    assert seen == gpu_type and start["gpu_type"] == gpu_type and start["node"] == "gpu7"


def test_a_job_without_gpus_asks_slurm_for_no_gpu_type(tmp_path: Path) -> None:
    seen, start = _gpu_type_seen(tmp_path, "gpu:a100:4", {"CUDA_VISIBLE_DEVICES": "", "SLURM_JOB_GPUS": ""})
    assert seen == "" and start["gpu_type"] == ""
    assert not any(c[:2] == ["scontrol", "-o"] for c in _calls(tmp_path / "calls.jsonl"))


def _socket_ifnames(tmp_path: Path, site: str = "", env: dict[str, str] | None = None) -> tuple[list[str], str]:
    """Unit (the batch script under bash, stand-ins for podman, getent and ip as on a node whose name resolves
    to 10.9.8.7 on ib0): the podman line's --env names, and GLOO_SOCKET_IFNAME NCCL_SOCKET_IFNAME as podman
    saw them."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _stub(bin_dir, "getent", 'echo "10.9.8.7      STREAM node7"\n')
    _stub(bin_dir, "ip", "printf '1: lo    inet 127.0.0.1/8 scope host lo\\n'\n"
                         "printf '3: ib0    inet 10.9.8.7/24 brd 10.9.8.255 scope global ib0\\n'\n"
                         "printf '4: eth0    inet 192.168.1.7/24 scope global eth0\\n'\n")
    script = tmp_path / "train.py"
    script.write_text("")
    base = spec(tmp_path, script, ())
    text = render_sbatch(dataclasses.replace(base, container=dataclasses.replace(base.container, socket_ifname=site)))
    seen = tmp_path / "seen.txt"
    rc, log = _run_script(tmp_path, script, (), 0, text=text, env_extra=env,
                          podman_body=f'echo "${{GLOO_SOCKET_IFNAME:-}} ${{NCCL_SOCKET_IFNAME:-}}" > {seen}\nexit 0\n')
    assert rc == 0, (tmp_path / "stderr.txt").read_text()
    run = next(c for c in _calls(log) if c[:1] == ["podman"] and "run" in c)
    return _values(run, "--env"), seen.read_text().strip()


def test_gloo_and_nccl_use_the_interface_of_the_nodes_own_address(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
    names, seen = _socket_ifnames(tmp_path)
    assert "GLOO_SOCKET_IFNAME" in names and "NCCL_SOCKET_IFNAME" in names
    assert seen == "ib0 ib0", "the interface holding the address the node's name resolves to, not eth0 nor lo"


def test_the_sites_socket_interface_wins_over_the_nodes_and_the_users_own_over_both(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
    (tmp_path / "site").mkdir()
    assert _socket_ifnames(tmp_path / "site", site="eth0,eth1")[1] == "eth0,eth1 eth0,eth1"
    (tmp_path / "user").mkdir()
    assert _socket_ifnames(tmp_path / "user", site="eth0", env={"GLOO_SOCKET_IFNAME": "lo"})[1] == "lo eth0"


@pytest.mark.parametrize(("launcher_rc", "leaves"), [(0, False), (85, True), (1, True)])
def test_a_worker_ends_only_when_its_launcher_says_the_training_finished(
        tmp_path: Path, launcher_rc: int, leaves: bool) -> None:
    """Unit (the worker's batch script under bash; stand-ins for podman, scontrol and squeue): a worker whose
    launcher exits 0 (its group's training finished: checkpointing/launch.py decides, test_launch.py) ends
    with the job; 85 (the group stopped or re-formed without it) or a failure sends it back to the held pool
    (scontrol requeuehold)."""
    script = tmp_path / "train.py"
    script.write_text("")
    base = spec(tmp_path, script, ())
    text = render_sbatch(dataclasses.replace(base, elastic=(1, 3), role="worker"))
    job_dir = base.container.job_dir
    (job_dir / contract.MARKERS_DIR).mkdir(parents=True)
    (job_dir / contract.MARKERS_DIR / contract.RENDEZVOUS_FILE).write_text("gpu1:29500 900-0 900\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _stub(bin_dir, "squeue", "echo RUNNING\n")
    rc, log = _run_script(tmp_path, script, (), 0, text=text,
                          env_extra={"SLURM_ARRAY_JOB_ID": "950", "SLURM_ARRAY_TASK_ID": "1"},
                          podman_body=f"exit {launcher_rc}\n")
    assert rc == 0, (tmp_path / "stderr.txt").read_text()
    calls = _calls(log)
    assert any(c[:1] == ["podman"] and "run" in c for c in calls), "the worker ran its container"
    assert any(c[:2] == ["scontrol", "requeuehold"] for c in calls) == leaves, calls
