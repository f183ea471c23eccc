"""A GPU job started on CPUs (immediate mode) whose script dies of torch's no-GPU error is sent back, once, to
wait for its GPUs (issue 49, item 5).

Pure tests of the launcher's policy and the agent's rule; the entry point's marker with real files; the agent's
whole path (send-for-gpu, retarget, release, finish) against the stateful fake Slurm behind the client's ``_run``
seam (unit: no Slurm, no Podman).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from agent_world import NOW, OTHER, World, policy
from move_jobs import job_info
from test_rank_output import container_command, environment, spec_for

from dlsub import contract
from dlsub.checkpointing import rank_output
from dlsub.policies.actions import move_rules as m
from dlsub.policies.actions.kinds import ActionKind as K
from dlsub.policies.actions.move_views import Rules
from dlsub.policies.actions.partition_view import PartitionView
from dlsub.policies.api import IdleNode
from dlsub.slurm_plugins.launcher import policy as launcher_policy
from dlsub.slurm_plugins.launcher.policy import MainEnding, Stopped

RESUME = contract.RESUME_EXIT_CODE
RULES = Rules(restart_cost_s=60, min_saving_s=60, checkpoint_grace_s=90)


# ---------------------------------------------------------------- the launcher's policy (pure)
@pytest.mark.parametrize(("run", "failed", "expected"), [
    (Stopped(1, needs_gpu=True), (), MainEnding.NEEDS_GPU),
    (Stopped(1, needs_gpu=True), (MainEnding.NEEDS_GPU,), MainEnding.END),  # requeuehold failed: it ends
    (Stopped(1), (), MainEnding.END),  # any other error ends it
    (Stopped(0, needs_gpu=True), (), MainEnding.END),  # it finished after all
    (Stopped(RESUME, "USR1", needs_gpu=True), (), MainEnding.CONTINUE),  # it checkpointed and asked to resume
    (Stopped(143, "TERM", needs_gpu=True), (), MainEnding.END),  # a stop: Slurm decides
    (Stopped(1, "USR1", move_requested=True, needs_gpu=True), (), MainEnding.END),  # died during a move
])
def test_only_a_failed_attempt_that_needs_a_gpu_is_sent_back(run: Stopped, failed: tuple[MainEnding, ...],
                                                             expected: MainEnding) -> None:
    """Unit (pure)."""
    assert launcher_policy.main_ending(run, failed) is expected


# ---------------------------------------------------------------- the entry point's marker (real files)
@pytest.mark.parametrize(("error", "marked"), [
    (AssertionError("Torch not compiled with CUDA enabled"), True),
    (RuntimeError("Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and "
                  "installed a driver from http://www.nvidia.com/Download/index.aspx"), True),
    (RuntimeError("No CUDA GPUs are available"), True),
    (RuntimeError("CUDA out of memory"), False),
    (ValueError("bad learning rate"), False),
])
def test_the_entry_point_marks_torchs_no_gpu_errors_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          error: Exception, marked: bool) -> None:
    """Unit (real files): the marker names the attempt and holds the error's first line; only an attempt the
    batch script watches (a CPU attempt of a GPU job) leaves one."""
    monkeypatch.setenv(contract.ENV_JOB_DIR, str(tmp_path))
    monkeypatch.setenv(contract.ENV_ATTEMPT, "12-0")
    marker = contract.no_gpu_error_marker(tmp_path, "12-0")
    rank_output.note_no_gpu_error(error)
    assert not marker.exists(), "not watched: no marker"
    monkeypatch.setenv(contract.ENV_WATCH_NO_GPU, "1")
    rank_output.note_no_gpu_error(error)
    assert marker.exists() is marked
    if marked:
        assert marker.read_text() == f"{type(error).__name__}: {str(error).splitlines()[0][:200]}\n"


def test_a_script_dying_of_it_leaves_the_marker_and_its_error_goes_on(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit (real files): run_script re-raises the script's own error after the marker is written."""
    script = tmp_path / "train.py"
    script.write_text("raise AssertionError('Torch not compiled with CUDA enabled')\n")
    monkeypatch.setenv(contract.ENV_JOB_DIR, str(tmp_path))
    monkeypatch.setenv(contract.ENV_ATTEMPT, "7-1")
    monkeypatch.setenv(contract.ENV_WATCH_NO_GPU, "1")
    monkeypatch.setattr(rank_output, "end_process_group_at_exit", lambda: None)
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # run_script sets both, as python SCRIPT would
    monkeypatch.setattr(sys, "path", list(sys.path))
    with pytest.raises(AssertionError, match="Torch not compiled"):
        rank_output.run_script(str(script), [])
    assert contract.no_gpu_error_marker(tmp_path, "7-1").read_text() == \
        "AssertionError: Torch not compiled with CUDA enabled\n"


# ---------------------------------------------------------------- the agent's rule (pure)
def parts() -> list[PartitionView]:
    return [PartitionView("gpu", (), role="gpu", speed=1.0),
            PartitionView("cpu", (IdleNode("cpu1", 0, 4),), role="cpu", speed=0.1)]


def sent_back(**kw: object) -> object:
    """Alice's job after its launcher requeued it held for a GPU: pending on cpu, held by the user's side."""
    return job_info(NOW, **{"state": "PENDING", "reason": contract.HELD_BY_USER, "restart_count": 1,
                            "last_attempt_action": contract.ACTION_NEEDS_GPU, "checkpointable": False,
                            "last_checkpoint_time": None, **kw})


def test_the_agent_sends_a_job_that_needs_a_gpu_to_wait_on_its_gpu_partition_even_with_no_gpu_idle() -> None:
    actions = m.plan([sent_back(gpus_wanted=2)], parts(), RULES, NOW)  # type: ignore[list-item]
    assert [(a.kind, a.partition, a.gpus, a.move_kind) for a in actions] == [(K.SEND_FOR_GPU, "gpu", 2, "needs-gpu")]
    assert "died for want of a GPU" in actions[0].reason and "on gpu" in actions[0].reason


@pytest.mark.parametrize("change", [
    {"reason": "JobHeldAdmin"},  # an administrator's hold is never the agent's
    {"reason": "BeginTime"},  # not held: nothing to release
    {"last_attempt_action": contract.ACTION_MOVE},  # a move's own requeue
    {"mode": "ideal", "ideal_partition": ""},  # not an immediate-mode job
    {"partition": "gpu"},  # already on its GPU partition
])
def test_nothing_else_is_sent_for_a_gpu(change: dict[str, object]) -> None:
    actions = m.plan([sent_back(**change)], parts(), RULES, NOW)  # type: ignore[list-item]
    assert K.SEND_FOR_GPU not in [a.kind for a in actions]


# ---------------------------------------------------------------- the agent, whole (fake Slurm)
def test_the_agent_retargets_and_releases_it_once_and_it_waits_for_its_gpus(tmp_path: Path) -> None:
    w = World(tmp_path, policy())
    w.busy_gpus()  # nothing idle: it is sent to wait, as ideal mode would have placed it
    job_id, job_dir = w.submit("0123abcd")
    agent = w.agent()
    agent.tick(NOW)
    # What the launcher does: the end record says needs-gpu, then scontrol requeuehold.
    w.end_attempt(job_dir, job_id, contract.ACTION_NEEDS_GPU)
    w.fake.requeue_held(job_id)
    job = w.fake.jobs[job_id]
    assert [a.kind for a in agent.tick(NOW + 5)] == ["send-for-gpu"]
    assert job.reason == "JobHeldUser", "recorded first; Slurm is changed from the next tick"
    assert [a.kind for a in agent.tick(NOW + 10)] == ["retarget", "release"]
    assert job.options["partition"] == "gpu" and job.options["gres"] == "gpu:1" and job.reason == "None"
    assert [a.kind for a in agent.tick(NOW + 15)] == ["finish-move"]
    assert agent.tick(NOW + 20) == [], "it waits for its GPUs; nothing more to do"
    assert w.store is not None
    decisions = w.store.decisions("0123abcd")
    assert [d.kind for d in decisions][-2:] == ["needs-gpu", "needs-gpu-done"]
    assert "died for want of a GPU" in decisions[-2].reason


def test_another_users_needs_gpu_record_moves_nothing_of_mine(tmp_path: Path) -> None:
    """Unit (fake Slurm): Bob's job directory claims Alice's job died needing a GPU; her job is left alone."""
    w = World(tmp_path, policy())
    w.busy_gpus()
    job_id, _ = w.submit("0123abcd")
    bob_dir = tmp_path / f"home-{OTHER}" / "0123abcd"
    bob_dir.mkdir(parents=True)
    agent = w.agent()
    agent.tick(NOW)
    w.end_attempt(bob_dir, job_id, contract.ACTION_NEEDS_GPU)
    w.fake.requeue_held(job_id)  # held by Alice herself
    before = w.snapshot(job_id)
    assert "send-for-gpu" not in [a.kind for a in agent.tick(NOW + 5)]
    agent.tick(NOW + 10)
    assert w.snapshot(job_id) == before


# ---------------------------------------------------------------- a process alone, through the container's launcher
@pytest.mark.parametrize("watch", [True, False])
def test_a_process_alone_on_a_cpu_attempt_of_a_gpu_job_still_marks_the_error(tmp_path: Path, watch: bool) -> None:
    """Unit (real torchrun, real processes; no Podman): the rendered container command with one process. Told
    to watch (a CPU attempt of a GPU job), its process starts through dlsub's entry point, which leaves the
    marker; otherwise the entry point (forked from torchrun) leaves none: no launcher would read it."""
    spec = spec_for(tmp_path, 1, ())
    spec.script.write_text("raise AssertionError('Torch not compiled with CUDA enabled')\n")
    extra = {contract.ENV_ATTEMPT: "5-0", **({contract.ENV_WATCH_NO_GPU: "1"} if watch else {})}
    proc = subprocess.run(container_command(spec, {}), cwd=tmp_path, env=environment(tmp_path, **extra),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "Torch not compiled with CUDA enabled" in proc.stdout + proc.stderr
    assert contract.no_gpu_error_marker(tmp_path / "job", "5-0").exists() is watch
