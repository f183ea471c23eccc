"""Unit tests: the agent makes no move or backfill that would exceed its owner's budget.

The pure planner (policies/actions/move_rules.py) with budgets on its jobs, and the
agent's tick against the stateful fake Slurm with a fake clock, spend read
from a canned ``sacct`` at most once a minute.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from agent_world import NOW, World, policy
from click.testing import CliRunner
from move_jobs import job_info

from dlsub.agent.budget_watch import BudgetWatch
from dlsub.cli.agent_commands import why
from dlsub.policies.actions import move_rules as m
from dlsub.policies.actions.kinds import ActionKind as K
from dlsub.policies.actions.move_views import BudgetLeft, JobInfo, Rules, WindowState
from dlsub.policies.actions.partition_view import PartitionView
from dlsub.policies.api import IdleNode
from dlsub.slurm_plugins.client import SlurmClient
from dlsub.slurm_plugins.fake import FakeSlurm

RULES = Rules(restart_cost_s=60, min_saving_s=60, checkpoint_grace_s=90)


def parts(gpu_price: float = 8.0) -> list[PartitionView]:
    return [
        PartitionView("gpu", (IdleNode("gpu1", 4, 4),), role="gpu", speed=1.0, cost_per_node_hour=gpu_price),
        PartitionView("gpu-dev", (IdleNode("gpu2", 4, 4),), role="dev", speed=1.0, max_time_s=3600,
                      cost_per_node_hour=2.0),
        PartitionView("cpu", (IdleNode("cpu1", 0, 4),), role="cpu", speed=0.1, cost_per_node_hour=1.0),
    ]


def job(**kw: object) -> JobInfo:
    """10 h of work left on cpu (1 h on gpu), its limit 10 h away."""
    return job_info(NOW, **{"end_time": NOW + 36000, "eta_s": 10 * 3600.0, **kw})


# ---------------------------------------------------------------- the planner (pure)


def test_a_move_over_the_budget_is_a_note_saying_what_it_would_use_and_what_is_left() -> None:
    # 10 h on cpu at speed 0.1 → 1 h on gpu, + 60 s restart: 1.02 node-hours, 8.13 at 8.00 an hour.
    poor = job(budgets=(BudgetLeft("user alice", cost=5.0),))
    actions = m.plan([poor], parts(), RULES, NOW)
    assert [a.kind for a in actions] == [K.NOTE]
    reason = actions[0].reason
    assert reason.startswith("not moved to gpu: it would use about 1.02 node-hours costing 8.13 there")
    assert "user alice has 5.00 (cost) left of this month's budget" in reason
    rich = job(budgets=(BudgetLeft("user alice", cost=9.0),))
    assert [a.kind for a in m.plan([rich], parts(), RULES, NOW)] == [K.SIGNAL_MOVE]
    # No budget at all, or a budget on node-hours only with room: moves as before.
    assert [a.kind for a in m.plan([job()], parts(), RULES, NOW)] == [K.SIGNAL_MOVE]
    hours = job(budgets=(BudgetLeft("user alice", node_hours=1.1),))
    assert [a.kind for a in m.plan([hours], parts(), RULES, NOW)] == [K.SIGNAL_MOVE]
    # The cheaper the target, the more fits: the same job onto a free GPU partition.
    assert [a.kind for a in m.plan([poor], parts(gpu_price=0.0), RULES, NOW)] == [K.SIGNAL_MOVE]


def test_every_budget_of_the_job_must_fit_and_one_tick_does_not_overspend_a_shared_budget() -> None:
    acct = BudgetLeft("account lab", cost=10.0)
    over = job(budgets=(BudgetLeft("user alice", cost=100.0), BudgetLeft("account lab", cost=5.0)))
    actions = m.plan([over], parts(), RULES, NOW)
    assert [a.kind for a in actions] == [K.NOTE] and "account lab has 5.00 (cost) left" in actions[0].reason
    # Two jobs of one account, 8.13 each, 10.00 left: the older moves, the other is told why.
    a = job(budgets=(acct,))
    b = job(dlsub_id="aaaa0002", slurm_job_id=11, user="bob", uid=7, submit_time=NOW - 300, budgets=(acct,))
    actions = m.plan([a, b], parts(), RULES, NOW)
    by_job = {x.slurm_job_id: x for x in actions}
    assert by_job[10].kind == K.SIGNAL_MOVE and by_job[11].kind == K.NOTE
    assert "account lab has 1.87 (cost) left" in by_job[11].reason


def test_a_spent_budget_stops_a_move_of_unknown_length_and_a_backfill() -> None:
    empty = (BudgetLeft("user alice", node_hours=0.0),)
    unknown = job(eta_s=None, ran_s=600.0, budgets=empty)
    actions = m.plan([unknown], parts(), RULES, NOW)
    assert [a.kind for a in actions] == [K.NOTE] and "user alice has 0.00 node-hours left" in actions[0].reason
    # A pending GPU job in an open window: gpu-dev is idle, but 1 h there costs 2.00 and 1.50 is left.
    waiting = job(state="PENDING", reason="Resources", partition="gpu", ideal_partition="gpu", gpus_now=1,
                  eta_s=None, time_limit_min=120, budgets=(BudgetLeft("user alice", cost=1.5),))
    gpu_busy = [replace(p, nodes=(IdleNode("gpu1", 0, 4),)) if p.name == "gpu" else p for p in parts()]
    window = WindowState(True, "night", NOW + 8 * 3600)
    actions = m.plan([waiting], gpu_busy, RULES, NOW, window)
    assert [a.kind for a in actions] == [K.NOTE]
    assert "not backfilled onto gpu-dev: it would use about 1.00 node-hours costing 2.00" in actions[0].reason
    fits = replace(waiting, budgets=(BudgetLeft("user alice", cost=2.5),))
    assert [a.kind for a in m.plan([fits], gpu_busy, RULES, NOW, window)] == [K.BACKFILL]


# ---------------------------------------------------------------- the agent's tick (fake Slurm, fake clock)


class SacctRunner:
    """The fake Slurm, with ``sacct -S`` (spend over a period) answered from canned accounting lines."""

    def __init__(self, fake: FakeSlurm, lines: Sequence[str]) -> None:
        self.fake, self.calls = fake, 0
        self.lines: list[str] | None = list(lines)  # None: sacct cannot be run

    def __call__(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        if argv[0] == "sacct" and "-S" in argv:
            self.calls += 1
            if self.lines is None:
                raise OSError("sacct: cannot run")
            return subprocess.CompletedProcess(list(argv), 0, "".join(f"{x}\n" for x in self.lines), "")
        return self.fake(argv)


def budget_world(tmp_path: Path, lines: Sequence[str]) -> tuple[World, SacctRunner]:
    pol = policy(partitions={"gpu": {"role": "gpu", "speed": 1.0, "cost_per_node_hour": 8.0},
                             "gpu-dev": {"role": "dev"},
                             "cpu": {"role": "cpu", "speed": 0.1, "cost_per_node_hour": 1.0}},
                 budgets={"period": "month", "users": {"*": {"cost": 10.0}}})
    w = World(tmp_path, pol)
    runner = SacctRunner(w.fake, lines)
    w.client = SlurmClient(runner=runner)
    return w, runner


def test_the_agent_does_not_move_an_over_budget_users_job_and_why_says_so(tmp_path: Path) -> None:
    # alice has spent 9.96 of 10.00 (4480 s on gpu at 8.00 an hour); bob 1.00 (an hour on cpu).
    w, runner = budget_world(tmp_path, ["5|alice|lab|gpu|4480|1", "6|bob|lab|cpu|3600|1"])
    poor, poor_dir = w.submit("0123abcd", user="alice")
    # Files are read only when owned by the job's uid, so bob is this uid under another name here.
    rich, rich_dir = w.submit("0456abcd", user="bob", start_on="cpu2")
    for job_id, job_dir in ((poor, poor_dir), (rich, rich_dir)):
        w.progress(job_dir, job_id)  # 980 steps at 1 step/s on cpu: 98 s on gpu + 15 s restart
    agent = w.agent()
    done = agent.tick(NOW)
    assert [(a.kind, a.slurm_job_id) for a in done if a.kind != "note"] == [("signal-move", rich)]
    assert w.fake.jobs[poor].signals == [] and w.fake.jobs[rich].signals == ["USR2"]
    assert runner.calls == 1, "one sacct for every user"
    note = [d for d in w.store.decisions("0123abcd") if d.kind == "wait"]
    assert len(note) == 1 and "not moved to gpu: it would use about 0.03 node-hours costing 0.25" in note[0].reason
    assert "user alice has 0.04 (cost) left of this month's budget" in note[0].reason
    assert [d.kind for d in w.store.decisions("0456abcd")] == ["move"]
    # `dlsub why` shows it, read from the agent's database.
    shown = CliRunner().invoke(why, ["0123abcd", "--db", str(w.db)])
    assert shown.exit_code == 0, shown.output
    assert "wait" in shown.output and "user alice has 0.04 (cost) left" in shown.output
    # The same note is not written again on the next tick, and sacct is read at most once a minute.
    agent.tick(NOW + 30)
    assert runner.calls == 1 and len([d for d in w.store.decisions("0123abcd") if d.kind == "wait"]) == 1
    agent.tick(NOW + 61)
    assert runner.calls == 2 and w.fake.jobs[poor].signals == []


def test_the_agent_moves_a_job_within_budget_and_reads_no_sacct_without_budgets(tmp_path: Path) -> None:
    w, runner = budget_world(tmp_path, ["5|alice|lab|gpu|3600|1"])  # 8.00 spent, 2.00 left: 0.25 fits
    job_id, job_dir = w.submit("0123abcd", user="alice")
    w.progress(job_dir, job_id)
    assert [a.kind for a in w.agent().tick(NOW)] == ["signal-move"]
    assert w.fake.jobs[job_id].signals == ["USR2"] and runner.calls == 1
    # No [budgets] table: the agent never asks sacct.
    w2 = World(tmp_path / "plain")
    plain = SacctRunner(w2.fake, ["5|alice|lab|gpu|999999|1"])
    w2.client = SlurmClient(runner=plain)
    job2, dir2 = w2.submit("0789abcd", user="alice")
    w2.progress(dir2, job2)
    assert [a.kind for a in w2.agent().tick(NOW)] == ["signal-move"] and plain.calls == 0


def test_accounting_trouble_costs_the_budgets_a_reading_never_the_tick(tmp_path: Path) -> None:
    w, runner = budget_world(tmp_path, ["5|alice|lab|gpu|4480|1"])  # 9.96 of 10.00 spent
    job_id, job_dir = w.submit("0123abcd", user="alice")
    w.progress(job_dir, job_id)
    agent = w.agent()
    assert [a.kind for a in agent.tick(NOW)] == ["note"]
    # A minute later sacct answers nothing (slurmdbd down: exit 1, read as no records), then raises:
    # the last reading stands, so alice's job still does not move, and the tick goes on.
    runner.lines = []
    assert [a.kind for a in agent.tick(NOW + 61)] == ["note"] and runner.calls == 2
    runner.lines = None
    assert [a.kind for a in agent.tick(NOW + 122)] == ["note"] and runner.calls == 3
    assert w.fake.jobs[job_id].signals == [] and w.store.meta()["last_error"] is None
    # A new month: nothing spent in it yet.
    runner.lines = []
    watch = BudgetWatch(w.client, w.policy)
    runner.lines = ["5|alice|lab|gpu|4480|1"]
    assert watch.left("alice", "lab", NOW) == (BudgetLeft("user alice", None, 10.0 - 4480 / 3600 * 8.0),)
    runner.lines = []
    assert watch.left("alice", "lab", NOW + 40 * 86400) == (BudgetLeft("user alice", None, 10.0),)
