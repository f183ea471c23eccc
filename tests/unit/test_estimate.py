"""Unit (pure functions, and the CLI against the fake Slurm): dlsub estimate's fits, the loss-curve
fit, cost arithmetic, budgets, the profile cache, and submitting from an estimate."""

from __future__ import annotations

import dataclasses
import json
import math
import shlex
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import WEIRD_NAME

from dlsub.cli.main import main
from dlsub.estimate.apply_choice import from_estimate
from dlsub.estimate.estimator import profile_queues
from dlsub.estimate.gpu_kinds import Target
from dlsub.estimate.partition_fit import (
    ProfileRun,
    cost,
    fit_partition,
    profile_from_events,
    steady_step_time,
    walltime,
)
from dlsub.estimate.profile_cache import EstimateCache, profile_key
from dlsub.estimate.recommend import Horizon, Knobs, PartitionFacts, build_rows, recommend
from dlsub.job.budget_check import extra_for
from dlsub.job.loss_curve import fit_loss_curve, target_eta
from dlsub.job.status_extra import loss_eta
from dlsub.site_config.budget import Budget, allows, parse_budgets, refusal
from dlsub.site_config.cost import Prices, Spend, job_spend, period_end, period_start, spend_at, summarize, total
from dlsub.site_config.policy_file import parse_policy
from dlsub.slurm_plugins.client import SlurmClient
from dlsub.slurm_plugins.fake import FakeSlurm
from dlsub.slurm_plugins.models import Partition, SlurmNode
from dlsub.slurm_plugins.usage import UsageRecord

# ---------------------------------------------------------------- synthetic profiles


def step_time(bs: int) -> float:
    return 0.002 + 0.00004 * bs


def memory(bs: int) -> float:
    return 300.0 + 0.08 * bs


def synthetic_events(bs: int, *, rng: np.random.Generator, steps: int = 60, start: float = 1000.0,
                     startup: float = 4.0, teardown: float = 1.5, spe: int = 40,
                     ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A profiling run's progress and attempt records: a slow first report (warm-up), jitter, then steady steps."""
    t = start + startup
    progress: list[dict[str, Any]] = [{"event": "start", "time": start + 2.0}]
    for step in range(5, steps + 1, 5):
        t += 5 * step_time(bs) * (3.0 if step == 5 else 1.0) * (1 + rng.normal(0, 0.02))
        progress.append({"event": "progress", "time": t, "step": step, "epoch": step // spe, "loss": 64.0 / (step * bs),
                         "peak_rss_mb": memory(bs) * min(1.0, 0.9 + step / 600), "steps_per_epoch": spe,
                         "total_epochs": 30})
    progress.append({"event": "finished", "time": t, "step": steps, "profile": True, "peak_rss_mb": memory(bs)})
    attempts = [{"event": "start", "time": start, "slurm_job_id": 7, "restart": 0, "partition": "cpu"},
                {"event": "end", "time": t + teardown, "slurm_job_id": 7, "restart": 0, "partition": "cpu", "rc": 0}]
    return progress, attempts


def test_profile_from_events_measures_steady_step_time_memory_and_overheads() -> None:
    progress, attempts = synthetic_events(128, rng=np.random.default_rng(1))
    p = profile_from_events("cpu", 128, progress, attempts)
    assert p.step_s == pytest.approx(step_time(128), rel=0.05)  # the slow warm-up report is left out
    assert p.memory_mb == pytest.approx(memory(128))
    assert p.steps_per_epoch == 40 and p.declared_epochs == 30 and p.steps == 60
    assert p.teardown_s == pytest.approx(1.5, abs=0.01)
    # Start-up: the 4 s before the first report, plus what the warm-up steps took beyond steady ones.
    assert 4.0 <= p.startup_s <= 4.0 + 15 * step_time(128)


def test_fits_predict_a_batch_size_not_profiled() -> None:
    rng = np.random.default_rng(2)
    profiles = [profile_from_events("cpu", bs, *synthetic_events(bs, rng=rng)) for bs in (32, 128, 512)]
    fit = fit_partition(profiles)
    assert fit.step_time(256) == pytest.approx(step_time(256), rel=0.05)
    assert fit.memory(256) == pytest.approx(memory(256), rel=0.02)
    assert fit.steps_per_epoch(256) == (40 * 512) // 256  # samples per epoch carried over
    assert fit.step_time(128) == profiles[1].step_s  # a profiled batch size keeps its own measurement


def test_steady_step_time_needs_two_reports() -> None:
    from dlsub.estimate.partition_fit import FitError

    with pytest.raises(FitError, match="fewer than twice"):
        steady_step_time([(5, 1.0)])


def test_walltime_adds_continuations_that_maxtime_forces() -> None:
    one = walltime(100.0, 10.0, None)
    assert (one.seconds, one.attempts) == (110.0, 1)
    # 300 s MaxTime, 10 s per attempt and 30 s grace leave 260 s of training per attempt: 4 attempts.
    wt = walltime(1000.0, 10.0, 300.0, restart_s=15.0, grace_s=30.0)
    assert wt.attempts == 4 and wt.seconds == pytest.approx(1000 + 4 * 10 + 3 * 15)
    assert math.isinf(walltime(10.0, 400.0, 300.0).seconds)


# ---------------------------------------------------------------- rows and the recommendation


def _fit_for(partition: str) -> Any:
    rng = np.random.default_rng(3)
    profiles = [profile_from_events(partition, bs, *synthetic_events(bs, rng=rng)) for bs in (32, 128)]
    return fit_partition(profiles)


def test_rows_and_recommendation_immediate_when_gpus_free_late() -> None:
    facts = {
        "gpu": PartitionFacts("gpu", "gpu", None, 16000, 4, 8.0, start_in_s=3000.0),
        "cpu": PartitionFacts("cpu", "cpu", None, 16000, 0, 1.0, start_in_s=0.0),
        "tiny": PartitionFacts("tiny", "cpu", None, 100, 0, 1.0, start_in_s=0.0),
    }
    fits = {"gpu": _fit_for("gpu"), "cpu": _fit_for("cpu"), "tiny": _fit_for("tiny")}
    knobs = Knobs(restart_s=15.0, min_saving_s=5.0)
    rows = build_rows(fits, facts, (32, 128, 64), Horizon(epochs=2000), knobs)
    assert len(rows) == 9 and [r["choice"] for r in rows] == list(range(1, 10))
    by = {(r["partition"], r["batch_size"]): r for r in rows}
    assert not by[("tiny", 32)]["feasible"] and "MB per node" in by[("tiny", 32)]["why"]
    assert by[("gpu", 64)]["profiled"] is False and by[("gpu", 64)]["walltime_s"] > 0
    gpu = by[("gpu", 128)]
    assert gpu["steps"] == 2000 * 40 and gpu["finish_s"] == pytest.approx(3000.0 + gpu["walltime_s"], abs=0.2)
    assert gpu["cost"] == pytest.approx(cost(gpu["walltime_s"], 1, 8.0), rel=1e-3)
    rec = recommend(rows, knobs)
    assert rec["mode"] == "immediate" and rec["immediate"]["partition"] == "cpu"
    assert rec["immediate"]["finish_s"] < rec["ideal"]["finish_s"]


def test_recommendation_waits_when_the_gpu_starts_now() -> None:
    facts = {"gpu": PartitionFacts("gpu", "gpu", None, 16000, 4, 8.0, 0.0),
             "cpu": PartitionFacts("cpu", "cpu", None, 16000, 0, 1.0, 0.0)}
    rows = build_rows({"gpu": _fit_for("gpu"), "cpu": _fit_for("cpu")}, facts, (32,), Horizon(epochs=5), Knobs())
    rec = recommend(rows, Knobs())
    assert rec["mode"] == "ideal" and rec["ideal"]["partition"] == "gpu" and rec["immediate"] is None


def test_target_loss_horizon_uses_the_loss_curve() -> None:
    facts = {"cpu": PartitionFacts("cpu", "cpu", None, 16000, 0, 1.0, 0.0)}
    rows = build_rows({"cpu": _fit_for("cpu")}, facts, (32,), Horizon(target_loss=0.05), Knobs())
    # loss = 2/step at one batch size of 32 -> loss(samples) = 64/samples; 0.05 at 1280 samples = 40 steps.
    assert rows[0]["steps"] == pytest.approx(40, rel=0.1)


# ---------------------------------------------------------------- loss curve


def test_loss_curve_fit_recovers_the_target_step_within_10_percent() -> None:
    a, b, c, target = 0.004, 0.5, 0.2, 0.3
    true_step = (1 / (target - c) - b) / a  # 2375
    rng = np.random.default_rng(0)
    k = np.arange(0, 1000, 10)  # the first 40% of the way only
    y = (1 / (a * k + b) + c) * (1 + rng.normal(0, 0.01, len(k)))
    eta = target_eta(fit_loss_curve(k, y), target)
    assert eta is not None and eta.stable and eta.target_step is not None
    assert abs(eta.target_step - true_step) / true_step < 0.10


def test_loss_curve_too_few_points_or_unreachable_target() -> None:
    assert fit_loss_curve([1, 2, 3], [3.0, 2.0, 1.5]) is None
    k = np.arange(1, 200)
    curve = fit_loss_curve(k, 1 / (0.01 * k + 0.5) + 0.4)
    assert curve is not None and curve.step_for(0.3) is None  # below where the curve levels off


def test_status_loss_eta_from_progress_events() -> None:
    events = [{"event": "progress", "step": s, "loss": 1 / (0.004 * s + 0.5) + 0.2, "target_loss": 0.3,
               "time": 1000.0 + s} for s in range(10, 1000, 10)]
    extra = loss_eta(events, steps_per_s=10.0)
    assert extra.target_loss == 0.3 and extra.target_step is not None
    assert abs(extra.target_step - 2375) / 2375 < 0.1
    assert extra.loss_eta_s == pytest.approx((extra.target_step - 990) / 10.0, abs=1.0)
    assert loss_eta([{**e, "target_loss": None} for e in events], 10.0).loss_eta_s is None


# ---------------------------------------------------------------- cost


def test_cost_arithmetic() -> None:
    assert cost(7200, 2, 8.0) == 32.0
    assert spend_at(1800, 1, 4.0) == Spend(0.5, 2.0)
    attempts = [
        {"event": "start", "time": 0.0, "slurm_job_id": 1, "restart": 0, "partition": "cpu"},
        {"event": "end", "time": 3600.0, "slurm_job_id": 1, "restart": 0},
        {"event": "start", "time": 4000.0, "slurm_job_id": 1, "restart": 1, "partition": "gpu"},
    ]
    used = job_spend(attempts, 1, Prices({"cpu": 1.0, "gpu": 8.0}), now=4000.0 + 1800.0)
    assert used.node_hours == pytest.approx(1.5) and used.cost == pytest.approx(1.0 + 4.0)
    records = [UsageRecord(1, "al", "lab", "gpu", 3600, 2), UsageRecord(2, "al", "lab", "cpu", 7200, 1),
               UsageRecord(3, "al", "lab", "gpu", 1800, 1)]
    table = summarize(records, Prices({"gpu": 8.0, "cpu": 1.0}))
    assert table[("al", "gpu")] == Spend(2.5, 20.0) and table[("al", "cpu")] == Spend(2.0, 2.0)
    assert total(records, Prices({"gpu": 8.0})) == Spend(4.5, 20.0)
    assert UsageRecord.from_sacct("17|al|lab|gpu|3600|2") == records[0].__class__(17, "al", "lab", "gpu", 3600.0, 2)
    assert UsageRecord.from_sacct("17.batch|al|lab|gpu|3600|2") is None


def test_gpus_of_a_priced_kind_cost_their_kinds_price_per_gpu_hour() -> None:
    """Unit test (pure): an attempt on a GPU kind the policy prices costs its GPUs at that price, from its start
    record's GPUs and type; Slurm's accounting gives a record's GPUs and type from AllocTRES; an unpriced or
    unknown kind costs the partition's node-hours."""
    prices = Prices({"gpu": 8.0}, {"a100": 3.0, "v100": 1.0})
    attempts = [
        {"event": "start", "time": 0.0, "slurm_job_id": 1, "restart": 0, "partition": "gpu", "gpus": "0,1",
         "gpu_type": "a100"},
        {"event": "end", "time": 3600.0, "slurm_job_id": 1, "restart": 0},
        {"event": "start", "time": 4000.0, "slurm_job_id": 1, "restart": 1, "partition": "gpu", "gpus": "2,3",
         "gpu_type": "v100"},
        {"event": "end", "time": 7600.0, "slurm_job_id": 1, "restart": 1},
        {"event": "start", "time": 8000.0, "slurm_job_id": 1, "restart": 2, "partition": "gpu", "gpus": "0",
         "gpu_type": "t4"},
    ]
    used = job_spend(attempts, 1, prices, now=8000.0 + 1800.0)
    assert used.node_hours == pytest.approx(2.5) and used.cost == pytest.approx(2 * 3.0 + 2 * 1.0 + 0.5 * 8.0)
    typed = UsageRecord.from_sacct("18|al|lab|gpu|1800|1|billing=2,cpu=2,gres/gpu:a100=4,gres/gpu=4,mem=4G,node=1")
    assert typed is not None and (typed.gpus, typed.gpu_type) == (4, "a100")
    assert total([typed], prices) == Spend(0.5, 6.0)
    untyped = UsageRecord.from_sacct("19|al|lab|gpu|1800|2|billing=2,cpu=2,gres/gpu=2,mem=4G,node=2")
    assert untyped is not None and (untyped.gpus, untyped.gpu_type) == (2, "")
    assert total([untyped], prices) == Spend(1.0, 8.0), "kind unknown: two nodes at 8.0 for half an hour"
    assert total([untyped], Prices({"gpu": 8.0}, {"v100": 1.0}, {"gpu": "v100"})) == Spend(1.0, 1.0)
    none = UsageRecord.from_sacct("20|al|lab|cpu|3600|1|billing=1,cpu=1,mem=1G,node=1")
    assert none is not None and (none.gpus, none.gpu_type) == (0, "")


def test_a_submission_is_checked_against_the_dearest_kind_it_may_get() -> None:
    """Unit test (pure): before Slurm places a GPU job, a budget counts its GPUs at the dearest priced kind the
    partition may give it, or at the partition's declared kind; a cpu-role partition's job at its nodes."""
    policy = parse_policy({"partitions": {"gpu": {"role": "gpu", "cost_per_node_hour": 2.0},
                                          "gpu-v100": {"role": "gpu", "gpu_type": "v100"},
                                          "cpu": {"role": "cpu", "cost_per_node_hour": 1.0}},
                           "gpu_types": {"a100": {"cost_per_gpu_hour": 3.0}, "v100": {"cost_per_gpu_hour": 1.0}}})
    assert extra_for(policy, "gpu", 1, 60, gpus=2) == Spend(1.0, 6.0)
    assert extra_for(policy, "gpu-v100", 1, 60, gpus=2) == Spend(1.0, 2.0)
    assert extra_for(policy, "cpu", 1, 60, gpus=2) == Spend(1.0, 1.0)
    assert extra_for(policy, "gpu", 1, 60) == Spend(1.0, 2.0)


def test_budget_periods() -> None:
    now = 1_795_000_000.0  # a Sunday in November 2026 (UTC)
    assert period_start("day", now) <= now < period_end("day", now) == period_start("day", now) + 86400
    assert period_end("week", now) - period_start("week", now) == 7 * 86400
    assert period_end("month", now) - period_start("month", now) == 30 * 86400


# ---------------------------------------------------------------- budgets


def test_budget_parsing_and_refusal_message() -> None:
    budgets = parse_budgets({"period": "week", "users": {"*": {"node_hours": 10}, "al": {"cost": 5.0}}})
    assert budgets.for_user("al") == Budget(cost=5.0) and budgets.for_user("bo") == Budget(node_hours=10.0)
    with pytest.raises(ValueError, match="valid keys: cost, node_hours"):
        parse_budgets({"users": {"al": {"hours": 1}}})
    with pytest.raises(ValueError, match="valid periods"):
        parse_budgets({"period": "year"})
    assert refusal("user al", Budget(cost=5.0), Spend(1, 2.0), Spend(0.1, 1.0), "week") is None
    message = refusal("user al", Budget(cost=5.0), Spend(1, 4.0), Spend(1, 8.0), "week")
    assert message is not None and "4.00 of 5.00 (cost) used, 1.00 left" in message
    assert "up to 1.00 node-hours" in message
    assert allows(Spend(1, 1), Spend(1, 1)) and not allows(Spend(1, 1), Spend(1.5, 0))


class SacctRunner:
    """The fake Slurm, with ``sacct -S`` (usage) answered from canned accounting lines."""

    def __init__(self, fake: FakeSlurm, lines: Sequence[str]) -> None:
        self.fake, self.lines, self.calls = fake, list(lines), 0

    def __call__(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        if argv[0] == "sacct" and "-S" in argv:
            self.calls += 1
            return subprocess.CompletedProcess(list(argv), 0, "".join(f"{x}\n" for x in self.lines), "")
        return self.fake(argv)


@pytest.fixture
def budget_env(cli_env: FakeSlurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SacctRunner:
    import getpass

    import dlsub.cli.main as cli

    policy = tmp_path / "policy.toml"
    policy.write_text('[partitions.gpu]\nrole = "gpu"\ncost_per_node_hour = 8.0\n'
                      '[partitions.cpu]\nrole = "cpu"\ncost_per_node_hour = 1.0\n'
                      '[budgets]\nperiod = "month"\n[budgets.users."*"]\ncost = 10.0\n')
    monkeypatch.setenv("DLSUB_POLICY", str(policy))
    runner = SacctRunner(cli_env, [f"5|{getpass.getuser()}|lab|gpu|3600|1"])  # 8.0 of 10.0 spent
    monkeypatch.setattr(cli, "SlurmClient", lambda: SlurmClient(runner=runner))
    return runner


def test_submit_over_budget_is_refused_with_what_is_left(budget_env: SacctRunner, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('x')\n")
    result = CliRunner().invoke(main, ["-p", "gpu", "--time", "60", str(script)])
    assert result.exit_code == 2, result.output
    assert "budget:" in result.output and "8.00 of 10.00 (cost) used, 2.00 left" in result.output
    assert "this month" in result.output and budget_env.calls >= 1
    assert budget_env.fake.submitted() == [], "a refused job is not submitted"
    jobs = tmp_path / "dlsub-home" / "jobs"
    assert not jobs.exists() or not any(jobs.iterdir())
    # Within budget (15 min on cpu at 1.0 an hour), the same user may submit.
    ok = CliRunner().invoke(main, ["-p", "cpu", "--time", "15", "--json", str(script)])
    assert ok.exit_code == 0, ok.output and len(budget_env.fake.submitted()) == 1


# ---------------------------------------------------------------- cache and submitting from an estimate


def test_cache_keys_change_with_script_args_and_the_rest() -> None:
    base = profile_key(b"print(1)\n", ["--lr", "0.1", "--batch-size", "32"], "img", "cpu", 32)
    assert base == profile_key(b"print(1)\n", ["--lr", "0.1", "--batch-size", "32"], "img", "cpu", 32)
    others = [
        profile_key(b"print(2)\n", ["--lr", "0.1", "--batch-size", "32"], "img", "cpu", 32),
        profile_key(b"print(1)\n", ["--lr", "0.2", "--batch-size", "32"], "img", "cpu", 32),
        profile_key(b"print(1)\n", ["--lr", "0.1", "--batch-size", "32"], "img2", "cpu", 32),
        profile_key(b"print(1)\n", ["--lr", "0.1", "--batch-size", "32"], "img", "gpu", 32),
        profile_key(b"print(1)\n", ["--lr", "0.1", "--batch-size", "32"], "img", "cpu", 64),
        profile_key(b"print(1)\n", ["--lr", "0.1", "--batch-size", "32"], "img", "cpu", 32, gpus=1),
    ]
    assert len({base, *others}) == 7


def test_cache_round_trip_is_private(tmp_path: Path) -> None:
    cache = EstimateCache(tmp_path / "home")
    profile = ProfileRun("cpu", 32, 0.01, 300.0, 44, 3.5, 1.2, 40, None, ((5, 2.0),), 30)
    cache.put("k" * 64, profile)
    assert cache.get("k" * 64) == profile and cache.get("x" * 64) is None
    assert (cache.profiles.stat().st_mode & 0o777) == 0o700
    assert (next(cache.profiles.iterdir()).stat().st_mode & 0o777) == 0o600


def _estimate(tmp_path: Path, script: Path) -> dict[str, Any]:
    facts = {"cpu": PartitionFacts("cpu", "cpu", 3600.0, 16000, 0, 1.0, 0.0)}
    rows = build_rows({"cpu": _fit_for("cpu")}, facts, (32, 128), Horizon(epochs=3), Knobs())
    return {"id": "0123abcd", "script": str(script), "args": ["--lr", "0.1"], "batch_arg": "--batch-size",
            "image": None, "gpus": 0, "nodes": 1, "rows": rows, "recommendation": recommend(rows, Knobs())}


def test_from_estimate_sets_memory_and_time_with_the_margin(tmp_path: Path) -> None:
    est = _estimate(tmp_path, tmp_path / "train.py")
    picked = from_estimate(est, 2)
    row = est["rows"][1]
    assert picked.args == ("--lr", "0.1", "--batch-size", "128") and picked.partition == "cpu"
    assert picked.mem_mb == math.ceil(row["memory_mb"] * 1.25) + 256
    assert picked.time_limit_min == math.ceil(row["walltime_s"] * 1.5 / 60) + 5
    assert picked.env == {"DLSUB_BATCH_SIZE": "128"} and "× 1.25" in picked.note
    with pytest.raises(LookupError, match="rows 1 to 2"):
        from_estimate(est, 3)


def test_submit_from_estimate_dry_run(cli_env: FakeSlurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLSUB_POLICY", str(tmp_path / "none.toml"))
    script = tmp_path / "train.py"
    script.write_text("print('x')\n")
    est = _estimate(tmp_path, script)
    EstimateCache(tmp_path / "dlsub-home").save_estimate(est["id"], json.loads(json.dumps(est)))
    result = CliRunner().invoke(main, ["submit", "--from-estimate", "0123abcd", "--choice", "1", "--dry-run"])
    assert result.exit_code == 0, result.output
    row = est["rows"][0]
    assert f"--mem={math.ceil(row['memory_mb'] * 1.25) + 256}M" in result.output
    assert "--partition=cpu" in result.output and "DLSUB_BATCH_SIZE=32" in result.output
    assert "--batch-size 32" in result.output
    assert "from estimate 0123abcd row 1" in result.output
    assert cli_env.submitted() == []
    bad = CliRunner().invoke(main, ["submit", "--from-estimate", "feedbeef", "--choice", "1"])
    assert bad.exit_code == 2 and "run `dlsub estimate` first" in bad.output


def test_move_budget_gate() -> None:
    from dlsub.policies.actions.budget_gate import move_fits_budget

    assert move_fits_budget(3600, 1, 8.0, None, None)
    assert move_fits_budget(3600, 2, 8.0, 2.0, 16.0) and not move_fits_budget(3600, 2, 8.0, 1.9, None)
    assert not move_fits_budget(3600, 1, 8.0, None, 7.99)
    assert move_fits_budget(None, 1, 8.0, 0.5, None) and not move_fits_budget(None, 1, 8.0, 0.0, None)


# ---------------------------------------------------------------- the orchestration, against the fake Slurm


class CompletingRunner:
    """The fake Slurm, where every profiling job has run by the next squeue: it leaves a profile's records."""

    def __init__(self, fake: FakeSlurm) -> None:
        self.fake, self.sbatch_argvs, self.cancelled = fake, [], []  # type: ignore[var-annotated]
        self.rng = np.random.default_rng(5)

    def __call__(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        import re

        if argv[0] == "sbatch" and "--test-only" not in argv:
            self.sbatch_argvs.append(list(argv))
        if argv[0] == "scancel":
            self.cancelled.append(argv[-1])
        if argv[0] == "squeue":
            for job in self.fake.submitted():
                if job.state != "PENDING":
                    continue
                text = Path(job.script).read_text()
                bs = int(re.search(r"DLSUB_BATCH_SIZE=(\d+)", text).group(1))  # type: ignore[union-attr]
                job_dir = Path(job.options["output"]).parent
                progress, attempts = synthetic_events(bs, rng=self.rng)
                (job_dir / "progress.jsonl").write_text("".join(json.dumps(e) + "\n" for e in progress))
                (job_dir / "attempts.jsonl").write_text("".join(json.dumps(e) + "\n" for e in attempts))
                self.fake.set_job_state(job.job_id, "COMPLETED", nodes="cpu1")
        return self.fake(argv)


def test_estimator_profiles_through_slurm_then_uses_the_cache(
        tmp_path: Path, weird_dir: Path, fake_slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the fake Slurm, with the script in a folder of weird characters and DLSUB_HOME in one too."""
    import dlsub.job.submit as submit
    from dlsub.estimate.estimator import EstimateRequest, Estimator
    from dlsub.job.settings import Settings
    from dlsub.job.user_store import JobStore
    from dlsub.site_config.policy_file import AgentPolicy

    monkeypatch.setattr(submit, "check_image", lambda image: None)
    settings = Settings(home=tmp_path / WEIRD_NAME.replace("\n", " ") / "home")  # no line break: see submit's
    runner = CompletingRunner(fake_slurm)
    estimator = Estimator(settings, SlurmClient(runner=runner), JobStore(settings.db_path), AgentPolicy(), poll_s=0)
    script = weird_dir / "-train $x 'é'.py"
    script.write_text("print('train')\n")
    request = EstimateRequest(script=script, args=("--lr", "0.1"), batch_sizes=(32, 128, 64),
                              horizon=Horizon(epochs=2), workdir=tmp_path)
    payload = estimator.run(request)
    # No roles in the policy: gpu and gpu-dev (GPU nodes) share one profile, cpu has its own.
    assert len(runner.sbatch_argvs) == 6 and payload["profiled_now"] == 6
    assert all("--dependency=singleton" in argv for argv in runner.sbatch_argvs)
    # The fake's cpu nodes are not its GPU nodes: two queues, each one run at a time, both at once.
    assert sorted(j.options["job-name"].rsplit("-", 1)[1] for j in fake_slurm.submitted()) == ["cpu"] * 3 + ["gpu"] * 3
    texts = [Path(j.script).read_text() for j in fake_slurm.submitted()]
    assert all("DLSUB_PROFILE_STEPS=" in t and shlex.quote(str(script)) in t for t in texts)
    assert all(subprocess.run(["bash", "-n", j.script]).returncode == 0 for j in fake_slurm.submitted())
    assert sorted(int(t.split("--batch-size ")[1].split()[0].strip("'")) for t in texts) == [32, 32, 64, 64, 128, 128]
    assert {(r["partition"], r["batch_size"]) for r in payload["rows"]} == {
        (p, b) for p in ("cpu", "gpu", "gpu-dev") for b in (32, 128, 64)}
    assert all(r["feasible"] for r in payload["rows"]), payload["rows"]
    assert EstimateCache(settings.home).load_estimate(payload["id"])["rows"] == payload["rows"]

    again = estimator.run(request)
    assert len(runner.sbatch_argvs) == 6 and again["from_cache"] == 6 and again["profiled_now"] == 0
    estimator.run(EstimateRequest(script=script, args=("--lr", "0.2"), batch_sizes=(32,),
                                  horizon=Horizon(epochs=2), workdir=tmp_path))
    assert len(runner.sbatch_argvs) == 8, "other arguments: profiled again"


def test_profiling_runs_see_the_sites_shared_mounts_and_the_users(
        tmp_path: Path, fake_slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit, through the fake Slurm: each profiling job's podman line mounts both; a bad --mount profiles nothing."""
    import dlsub.job.submit as submit
    from dlsub.containers.mounts import MountRequest
    from dlsub.estimate.estimator import EstimateRequest, Estimator
    from dlsub.job.settings import Settings
    from dlsub.job.submit import SubmitError
    from dlsub.job.user_store import JobStore
    from dlsub.site_config.policy_file import parse_policy

    monkeypatch.setattr(submit, "check_image", lambda image: None)
    site, data = tmp_path / "projects", tmp_path / "scratch" / "data"
    site.mkdir()
    data.mkdir(parents=True)
    (tmp_path / "proj").mkdir()
    script = tmp_path / "proj" / "train.py"
    script.write_text("print('train')\n")
    settings = Settings(home=tmp_path / "home")
    runner = CompletingRunner(fake_slurm)
    policy = parse_policy({"containers": {"shared_mounts": [str(site)]}})
    estimator = Estimator(settings, SlurmClient(runner=runner), JobStore(settings.db_path), policy, poll_s=0)
    request = EstimateRequest(script=script, args=(), batch_sizes=(32,), horizon=Horizon(epochs=1),
                              workdir=tmp_path / "proj", partition="cpu", mounts=(MountRequest(str(data)),))
    estimator.run(request)
    texts = [Path(j.script).read_text() for j in fake_slurm.submitted()]
    assert texts and all(f"--volume {site}:{site}:ro" in t and f"--volume {data}:{data}:ro" in t for t in texts)
    with pytest.raises(SubmitError, match="does not exist"):
        estimator.run(EstimateRequest(script=script, args=(), batch_sizes=(64,), horizon=Horizon(epochs=1),
                                      workdir=tmp_path / "proj", partition="cpu",
                                      mounts=(MountRequest(str(tmp_path / "gone")),)))
    assert len(fake_slurm.submitted()) == len(texts)


def test_steady_step_time_shrugs_off_a_burst_of_contention() -> None:
    points, t = [], 0.0
    for step in range(5, 105, 5):
        t += 5 * 0.01 * (4.0 if 40 <= step <= 55 else 1.0)  # a neighbour takes the cores for a while
        points.append((step, t))
    assert steady_step_time(points) == pytest.approx(0.01)


def test_steady_step_time_keeps_a_cost_paid_once_an_epoch() -> None:
    """Pure. Reports every 5 steps and at each epoch's end (11 steps), 0.01 s a step, and a 0.55 s
    evaluation after each epoch: a real run pays 0.06 s a step. Of the report intervals only one in
    three holds the evaluation, so their median alone gave 0.01."""
    points, t, step = [], 0.0, 0
    for _epoch in range(8):
        for s in sorted({5, 10, 11}):
            t += (s - (step % 11)) * 0.01
            step = step - step % 11 + s
            points.append((step, t))
        t += 0.55
    assert steady_step_time(points, period=11) == pytest.approx(0.06, rel=0.02)
    assert steady_step_time(points) == pytest.approx(0.01)  # the epoch unknown: nothing to span
    # A burst of contention still moves it little: the median over windows, not their mean.
    slow = [(s, tt + (2.0 if s >= 50 else 0.0)) for s, tt in points]
    assert steady_step_time(slow, period=11) == pytest.approx(0.06, rel=0.05)


def test_status_shows_cost_so_far_and_the_loss_eta(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import time as _time

    import dlsub.job.status_extra as extra_mod
    from dlsub.job.status import job_status, render_table
    from dlsub.job.user_store import JobRecord

    monkeypatch.setattr(extra_mod, "site_prices", lambda: Prices({"cpu": 2.0}))
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    now = _time.time()
    (job_dir / "attempts.jsonl").write_text(json.dumps(
        {"event": "start", "time": now - 1800, "slurm_job_id": 9, "restart": 0, "partition": "cpu"}) + "\n")
    reports = [{"event": "progress", "time": now - 1000 + s / 10, "step": s, "loss": 1 / (0.004 * s + 0.5) + 0.2,
                "target_loss": 0.3} for s in range(10, 1000, 10)]
    (job_dir / "progress.jsonl").write_text("".join(json.dumps(r) + "\n" for r in reports))
    record = JobRecord("0123abcd", "t", "me", "t.py", [], str(job_dir), "cpu", 0, 1, 2, 4096, None, "img",
                       slurm_job_id=9)
    from dlsub.slurm_plugins.models import SlurmJob

    slurm = SlurmJob(job_id=9, name="t", user="me", state="RUNNING", partition="cpu", nodes="cpu1", comment="",
                     restart_count=0, reason="None", time_limit_min=None, start_time=0, submit_time=0, exit_code=None)
    row = job_status(record, slurm)
    assert row.node_hours == pytest.approx(0.5, abs=0.01) and row.cost == pytest.approx(1.0, abs=0.02)
    assert row.target_loss == 0.3 and row.target_step is not None and abs(row.target_step - 2375) / 2375 < 0.1
    assert row.loss_eta_s is not None and row.eta_confidence is not None and row.eta_confidence >= 0.5
    table = render_table([row])
    assert "COST" in table.splitlines()[0] and "1.000" in table and "~" in table


def test_ctrl_c_cancels_the_profiling_jobs(tmp_path: Path, fake_slurm: FakeSlurm,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import dlsub.job.submit as submit
    from dlsub.estimate.estimator import EstimateRequest, Estimator
    from dlsub.job.settings import Settings
    from dlsub.job.user_store import JobStore
    from dlsub.site_config.policy_file import AgentPolicy

    cancelled: list[str] = []

    def runner(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        if argv[0] == "squeue" and "--jobs" in argv:
            raise KeyboardInterrupt  # the user presses Ctrl-C while the estimate waits
        if argv[0] == "scancel":
            cancelled.append(argv[-1])
        return fake_slurm(argv)

    monkeypatch.setattr(submit, "check_image", lambda image: None)
    settings = Settings(home=tmp_path / WEIRD_NAME.replace("\n", " ") / "home")  # no line break: see submit's
    estimator = Estimator(settings, SlurmClient(runner=runner), JobStore(settings.db_path), AgentPolicy(), poll_s=0)
    script = tmp_path / "train.py"
    script.write_text("print('train')\n")
    with pytest.raises(KeyboardInterrupt):
        estimator.run(EstimateRequest(script=script, args=(), batch_sizes=(32, 64), horizon=Horizon(epochs=1),
                                      workdir=tmp_path))
    submitted = sorted(str(j.job_id) for j in fake_slurm.submitted())
    assert len(submitted) == 4 and sorted(cancelled) == submitted


def test_profiling_runs_see_the_users_export_and_venv_and_profile_again_without_them(
        tmp_path: Path, fake_slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit, through the fake Slurm: --export's variables reach each profiling job's container (its private env
    file) and --venv's packages its PYTHONPATH, as for submit; profiles made with them are not the ones made
    without (a variable can change what the script does), and an estimate without them profiles again."""
    import dlsub.job.submit as submit
    from dlsub.containers.exports import Exported
    from dlsub.contract import CONTAINER_ENV_FILE
    from dlsub.estimate.estimator import EstimateRequest, Estimator
    from dlsub.job.settings import Settings
    from dlsub.job.user_store import JobStore
    from dlsub.site_config.policy_file import AgentPolicy

    monkeypatch.setattr(submit, "check_image", lambda image: None)
    env = tmp_path / "envs" / "my env"
    (env / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    (env / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (tmp_path / "proj").mkdir()
    script = tmp_path / "proj" / "train.py"
    script.write_text("print('train')\n")
    settings = Settings(home=tmp_path / "home")
    runner = CompletingRunner(fake_slurm)
    estimator = Estimator(settings, SlurmClient(runner=runner), JobStore(settings.db_path), AgentPolicy(), poll_s=0)
    request = EstimateRequest(script=script, args=(), batch_sizes=(32,), horizon=Horizon(epochs=1),
                              workdir=tmp_path / "proj", partition="cpu",
                              exports=Exported(env=(("HF_HUB_OFFLINE", "1"),)), venv=str(env))
    assert estimator.run(request)["profiled_now"] == 1
    job = fake_slurm.submitted()[-1]
    text = Path(job.script).read_text()
    assert str(env / "lib" / "python3.11" / "site-packages") in text and f"{env}:{env}:ro" in text
    assert "HF_HUB_OFFLINE=1" in (Path(job.options["output"]).parent / CONTAINER_ENV_FILE).read_text()
    assert estimator.run(request)["from_cache"] == 1, "the same environment: the cached profile"
    plain = dataclasses.replace(request, exports=Exported(), venv=None)
    assert estimator.run(plain)["profiled_now"] == 1, "without them: profiled again"
    assert len(fake_slurm.submitted()) == 2


def _partition(name: str, *nodes: str | tuple[str, str]) -> Partition:
    """A partition of these nodes (a name, or a name and its one GPU kind)."""
    made = [SlurmNode(n, "idle", (name,), 8, 0, 64000, 0, 4, 0) if isinstance(n, str)
            else SlurmNode(n[0], "idle", (name,), 8, 0, 64000, 0, 4, 0, gpu_type=n[1]) for n in nodes]
    return Partition(name, tuple(made), None, None)


def test_profiles_that_may_share_a_node_queue_together_and_the_rest_run_at_once() -> None:
    """Unit (pure): the profiling runs' queues. By node (the default): gpu and gpu-dev on the same nodes share a
    queue, cpu on its own nodes has its own; kinds pinned to nodes of their own queue apart; a partition that
    spans two queues' nodes joins them into one. --one-at-a-time: one queue; --parallel: one per target."""
    parts = {p.name: p for p in (_partition("cpu", "cpu1", "cpu2"), _partition("gpu", "gpu1", "gpu2"),
                                 _partition("gpu-dev", "gpu1", "gpu2"), _partition("all", "cpu2", "gpu1"),
                                 _partition("kinds", ("k1", "a100"), ("k2", "v100")))}
    testbed = {Target("cpu"), Target("gpu"), Target("gpu-dev")}
    assert profile_queues(testbed, parts, "by-node") == {
        Target("cpu"): "cpu", Target("gpu"): "gpu", Target("gpu-dev"): "gpu"}
    assert profile_queues(testbed, parts, "one") == dict.fromkeys(testbed, "")
    assert profile_queues(testbed, parts, "each") == {t: t.partition for t in testbed}
    assert set(profile_queues(testbed | {Target("all")}, parts, "by-node").values()) == {"all"}
    pinned = {Target("kinds", "a100", pinned=True), Target("kinds", "v100", pinned=True)}
    assert profile_queues(pinned, parts, "by-node") == {t: f"kinds-{t.gpu_type}" for t in pinned}
    # A kind declared in the policy, not pinned in the GRES: its runs may land on either node.
    loose = {Target("kinds", "a100"), Target("kinds", "v100")}
    assert set(profile_queues(loose, parts, "by-node").values()) == {"kinds-a100"}


def test_parallel_and_one_at_a_time_together_are_refused(tmp_path: Path) -> None:
    """Unit (CLI, no Slurm reached): the two flags contradict each other; the message says so, nothing runs."""
    script = tmp_path / "train.py"
    script.write_text("print('train')\n")
    result = CliRunner().invoke(main, ["estimate", "--parallel", "--one-at-a-time", str(script)])
    assert result.exit_code != 0 and "--parallel and --one-at-a-time" in result.output, result.output
