"""Unit tests (no Slurm; the CLI's against the fake Slurm behind the client's `_run` seam): the states
dlsub sees of a job are samples. A job may run and end between two looks, so what `dlsub status`, the
dashboard and the agent record must follow any skip of unobserved states, and show the last state
Slurm could have reported, never an earlier one.

The property test drives real Slurm life cycles (requeues for continuations and moves, node failures,
``scontrol requeue`` of an ended job, the purge after MinJobAge, a lagging slurmdbd) and random subsets
of them observed; its oracle is the simulated truth, not the model under test.
"""

from __future__ import annotations

import json
import random
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlsub.agent.store_rows import JobRow
from dlsub.cli.main import main
from dlsub.contract import FINAL_STATES, IllegalTransition, JobState, StateSource, check_transition
from dlsub.job.user_store import JobRecord, JobStore
from dlsub.slurm_plugins.fake import FakeJob, FakeSlurm

CONTROLLER, ACCOUNTING, JOB_FILES = StateSource.CONTROLLER, StateSource.ACCOUNTING, StateSource.JOB_FILES

# What Slurm's controller may show next for a job in each (Slurm) state; the words are squeue's.
_ENDS = ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "PREEMPTED", "OUT_OF_MEMORY", "NODE_FAIL", "DEADLINE")
_SLURM_NEXT: dict[str, tuple[str, ...]] = {
    "PENDING": ("CONFIGURING", "RUNNING", "CANCELLED"),
    "CONFIGURING": ("RUNNING",),
    # A continuation (USR1, then `scontrol requeue`), a move (`scontrol requeuehold`), a node failure
    # with requeue: the same Slurm job waits again. Or it ends, through COMPLETING or at once.
    "RUNNING": ("COMPLETING", "REQUEUED", "REQUEUE_HOLD", "SUSPENDED", *_ENDS),
    "SUSPENDED": ("RUNNING", "CANCELLED"),
    "COMPLETING": ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "OUT_OF_MEMORY"),
    "REQUEUED": ("PENDING",),
    "REQUEUE_HOLD": ("PENDING",),
    # `scontrol requeue` of an ended batch job (a user or an admin): it waits again.
    **{end: ("PENDING",) for end in _ENDS},
}


@dataclass(frozen=True)
class Look:
    """One look at the job: what was shown, by whom, and the simulated truth's state at that moment."""

    state: JobState
    source: StateSource
    true: JobState


def _life(rng: random.Random, steps: int) -> list[str]:
    """One job's Slurm states from submit until it ends for good (each change one element)."""
    states = ["PENDING"]
    while True:
        now = states[-1]
        if now in _ENDS and (len(states) >= steps or rng.random() < 0.8):  # most ended jobs stay ended
            return states
        states.append(rng.choice(_SLURM_NEXT[now]))
        if len(states) > 4 * steps and states[-1] not in _ENDS:  # a long life ends
            return [*states, "COMPLETED"]


def _files_say(true_end: JobState, rng: random.Random) -> JobState:
    """What `dlsub status` infers from the job's own files once Slurm tells nothing (its end record)."""
    if rng.random() < 0.3:
        return JobState.UNKNOWN  # no end record (the node died with it)
    return JobState.COMPLETED if true_end == JobState.COMPLETED else JobState.FAILED


def _looks(rng: random.Random, life: list[str], purged_looks: int) -> list[Look]:
    """A random subset of the life observed through slurmctld, then looks after the purge: through the
    accounting (its end, or a lagging record of the job still running), or through the job's files."""
    looks = [Look(JobState.from_slurm(s), CONTROLLER, JobState.from_slurm(s)) for s in life if rng.random() < 0.4]
    end = JobState.from_slurm(life[-1])
    accounting = rng.random() < 0.6
    for _ in range(purged_looks):
        if accounting:
            lagging = rng.random() < 0.3 and any(JobState.from_slurm(s) == JobState.RUNNING for s in life)
            looks.append(Look(JobState.RUNNING if lagging else end, ACCOUNTING, end))
        else:
            looks.append(Look(_files_say(end, rng), JOB_FILES, end))
    return looks


def _expected(looks: list[Look]) -> list[JobState]:
    """The oracle, from the truth: after each look, the state of the latest look that told the truth as
    Slurm held it (slurmctld, or slurmdbd's record when it agrees with the truth). A look that did not
    (a lagging record, the files' inference, UNKNOWN once Slurm forgot) never hides an end already seen;
    before any end was seen it is the best there is."""
    shown: list[JobState] = []
    for look in looks:
        truthful = look.source != JOB_FILES and look.state == look.true
        previous = shown[-1] if shown else None
        if truthful or previous is None or not previous.terminal:
            shown.append(look.state)
        else:
            shown.append(previous)
    return shown


def _record(job_id: str = "0123abcd") -> JobRecord:
    return JobRecord(id=job_id, name="t", user="u", script="/t.py", args=[], job_dir="/j", partition="cpu",
                     gpus_per_node=0, nodes=1, cpus=1, mem_mb=100, time_limit_min=None, image="i")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(2, 12), purged_looks=st.integers(0, 3))
def test_the_shown_state_is_the_last_one_slurm_could_have_reported(tmp_path: Path, seed: int, steps: int,
                                                                     purged_looks: int) -> None:
    rng = random.Random(seed)
    looks = _looks(rng, _life(rng, steps), purged_looks)
    expected = _expected(looks)
    store = JobStore(tmp_path / f"{uuid.uuid4().hex}.db")  # hypothesis replays an example while it shrinks
    store.add(_record())
    row = JobRow(1000, 1, "0123abcd", "u", None)
    for i, look in enumerate(looks):
        shown = store.observed("0123abcd", look.state, look.source)
        assert shown == expected[i], (looks[: i + 1], shown)
        assert JobState(store.get("0123abcd").state) == expected[i]
        if look.source == CONTROLLER:  # the agent reads slurmctld only
            row.set_state(look.state)
            assert row.state == look.state


def test_the_issues_case_and_other_skips_are_shown_as_slurm_shows_them(tmp_path: Path) -> None:
    """Job 130: seen PENDING, ran entirely between two looks, Slurm says COMPLETED: shown COMPLETED (was
    PENDING for ever). The same for every skip sampling can make."""
    for first, then in [("PENDING", "COMPLETED"), ("PENDING", "TIMEOUT"), ("PENDING", "OUT_OF_MEMORY"),
                        ("REQUEUED", "COMPLETED"), ("PENDING", "REQUEUED"), ("REQUEUE_HOLD", "DEADLINE")]:
        store = JobStore(tmp_path / f"{first}-{then}.db")
        store.add(_record())
        assert store.observed("0123abcd", JobState.from_slurm(first)) == JobState.from_slurm(first)
        assert store.observed("0123abcd", JobState.from_slurm(then)) == JobState.from_slurm(then)
        for source in StateSource:  # sacct's record or the job's files say the same once Slurm forgets it
            again = JobStore(tmp_path / f"{first}-{then}-{source.name}.db")
            again.add(_record())
            again.observe("0123abcd", JobState.from_slurm(first))
            assert again.observed("0123abcd", JobState.from_slurm(then), source) == JobState.from_slurm(then)


def test_what_the_model_still_guards() -> None:
    """An ended job is not shown UNKNOWN once Slurm forgets it; a lagging record is not news; the files do
    not overrule Slurm's end; only slurmctld shows a job going back (a requeue)."""
    for final in FINAL_STATES:
        with pytest.raises(IllegalTransition, match="final states stand"):
            check_transition(final, JobState.UNKNOWN)
        assert check_transition(final, final, JOB_FILES) == final
    with pytest.raises(IllegalTransition, match="lags"):
        check_transition(JobState.COMPLETED, JobState.RUNNING, ACCOUNTING)  # slurmdbd missed the end
    with pytest.raises(IllegalTransition, match="lags"):
        check_transition(JobState.RUNNING, JobState.PENDING, ACCOUNTING)
    with pytest.raises(IllegalTransition, match="files do not overrule"):
        check_transition(JobState.TIMEOUT, JobState.FAILED, JOB_FILES)
    # slurmctld itself: an ended job requeued (scontrol requeue) waits again; its next end is shown.
    assert check_transition(JobState.COMPLETED, JobState.PENDING) == JobState.PENDING
    assert check_transition(JobState.COMPLETED, JobState.FAILED, ACCOUNTING) == JobState.FAILED
    assert check_transition(JobState.RUNNING, JobState.PENDING) == JobState.PENDING
    assert check_transition(JobState.RUNNING, JobState.UNKNOWN, JOB_FILES) == JobState.UNKNOWN
    assert check_transition(JobState.UNKNOWN, JobState.RUNNING, ACCOUNTING) == JobState.RUNNING
    assert JobState.from_slurm("SPECIAL_EXIT") == JobState.REQUEUED
    assert JobState.from_slurm("RESV_DEL_HOLD") == JobState.PENDING


def _status(*args: str) -> dict[str, object]:
    result = CliRunner().invoke(main, ["status", "--json", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def test_dlsub_status_shows_a_job_that_ended_between_two_looks_ended(cli_env: FakeSlurm, tmp_path: Path) -> None:
    """Through the CLI and the fake Slurm: seen PENDING, then completed and purged unobserved: COMPLETED
    (from sacct); a lagging sacct record later does not bring it back; a timed-out one likewise."""
    script = tmp_path / "train.py"
    script.write_text("print('training')\n")
    made = {}
    for name in ("done", "late"):
        out = json.loads(CliRunner().invoke(main, ["--json", "-J", name, str(script)]).stdout)
        made[name] = (out["id"], out["slurm_job_id"])
    for dlsub_id, _ in made.values():
        assert _status(dlsub_id)["state"] == "PENDING"
    done_id, done_slurm = made["done"]
    cli_env.set_job_state(done_slurm, "COMPLETED", nodes="cpu1")
    cli_env.purge(done_slurm)
    assert _status(done_id)["state"] == "COMPLETED"
    cli_env.history[done_slurm].state = "RUNNING"  # slurmdbd's record lagging (it missed the end)
    assert _status(done_id)["state"] == "COMPLETED"
    late_id, late_slurm = made["late"]
    cli_env.set_job_state(late_slurm, "TIMEOUT", nodes="cpu2")
    assert _status(late_id)["state"] == "TIMEOUT"


def test_another_users_job_under_a_reused_id_is_not_mine(cli_env: FakeSlurm, tmp_path: Path) -> None:
    """Fake Slurm: my job ended and was forgotten; Slurm (its state lost) gives the id to another user's
    pending job. That job is not mine: mine stays COMPLETED, not PENDING."""

    script = tmp_path / "train.py"
    script.write_text("print('training')\n")
    out = json.loads(CliRunner().invoke(main, ["--json", str(script)]).stdout)
    cli_env.set_job_state(out["slurm_job_id"], "COMPLETED", nodes="cpu1")
    assert _status(out["id"])["state"] == "COMPLETED"
    mine = cli_env.jobs.pop(out["slurm_job_id"])
    cli_env.jobs[mine.job_id] = FakeJob(mine.job_id, "#!/bin/bash\n", {}, user="mallory", user_id=1002)
    assert _status(out["id"])["state"] == "COMPLETED"


def test_the_agent_follows_a_job_that_ended_between_two_ticks_and_one_slurm_forgot(tmp_path: Path) -> None:
    """Fake Slurm, fake clock, the agent's tick: a job seen PENDING that ran and ended before the next tick
    is recorded ended (and then forgotten with Slurm), not left PENDING for ever; a job last seen running that
    Slurm purged unseen (the agent was down past MinJobAge) is counted UNKNOWN, not RUNNING."""
    from agent_world import ME, NOW, World

    w = World(tmp_path)
    ended, _ = w.submit("0123abcd", start_on=None)
    lost, _ = w.submit("4567cdef", start_on="cpu2")
    agent = w.agent()
    agent.tick(NOW)
    assert w.store is not None
    assert w.store.jobs()[ME, ended].state == JobState.PENDING
    assert w.store.jobs()[ME, lost].state == JobState.RUNNING
    w.fake.set_job_state(ended, "COMPLETED", nodes="cpu1")
    w.fake.set_job_state(lost, "COMPLETED", nodes="cpu2")
    w.fake.purge(lost)
    agent.tick(NOW + 5)
    rows = w.store.jobs()
    assert rows[ME, ended].state == JobState.COMPLETED
    assert rows[ME, lost].state == JobState.UNKNOWN
    decisions = [d.reason for d in w.store.decisions("0123abcd")]
    assert not [r for r in decisions if "leaves it alone" in r], decisions
    w.fake.purge(ended)
    agent.tick(NOW + 10)
    assert (ME, ended) not in w.store.jobs()  # ended and forgotten: no row kept for ever
