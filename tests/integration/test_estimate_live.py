"""Integration (live Slurm testbed + rootless Podman + real PyTorch): `dlsub estimate` profiles the
example through Slurm and returns a row per partition and batch size; a real run of a profiled batch
size matches its memory prediction (within 25%) and its walltime to within a factor (a step time or a
start counted wrong), and a batch size it did not profile its memory prediction; a second estimate
comes from the cache; a job over budget is refused. How close the walltime comes is a figure, not a
behaviour: benchmarks/estimate_accuracy.py measures it on an idle testbed."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from livebed import EXAMPLES, TestbedUser, put, timed_run, wait_until_quiet

ROW_KEYS = ("partition", "batch_size", "memory_mb", "walltime_s", "cost", "start_s", "finish_s", "feasible")


def _copy_examples(user: TestbedUser, workdir: Path) -> None:
    shutil.copytree(EXAMPLES, workdir / "examples")
    subprocess.run(["chown", "-R", f"{user.uid}:{user.gid}", str(workdir / "examples")], check=True)


#: Epochs of the estimated and the real runs (7-8 s each). At 10 epochs (0.07 s each) a run was 5-7 s, nearly
#: all the container's start, which varies by a second between consecutive identical runs on this 2-core
#: testbed: one CI run's median was 26% off. Longer runs show the estimator's own error on this example: at 100
#: epochs it predicted 10.0 s for 12.4 s (-20%), its step time about 40% low (docs/user-guide.md, dlsub estimate).
EPOCHS = "40"


def _run_for_real(user: TestbedUser, workdir: Path, batch_size: int) -> tuple[float, float]:
    """(walltime, peak memory) of the example at this batch size on cpu, timed undisturbed."""
    return timed_run(user, workdir, "-p", "cpu", "examples/train_digits.py", "--epochs", EPOCHS, "--batch-size",
                     str(batch_size))


#: How far off a prediction may be here. Memory (a peak resident set) does not depend on the machine's load:
#: 25%. A walltime does: in the full suite real runs came out 25-54% slower than alone on this 2-core testbed
#: (CI: 10.7, 12.0, 10.0 s against 7.8 predicted; alone right after: 8.0, 7.5, 9.0 against 8.8), whatever
#: wait_until_quiet waited for. So one run is held to a factor of 2 either way, which catches a step time or a
#: start counted wrong (a factor, not a share); how close the estimate comes is
#: benchmarks/estimate_accuracy.py's figure (docs/user-guide.md, dlsub estimate), measured on an idle testbed.
#: (Three runs and their median held to 40% cost this test about 40 s more of every CI run and measured the
#: machine's load as much as the estimate.)
MEMORY_TOLERANCE = 0.25
WALLTIME_FACTOR = 2.0


def _within(predicted: float, measured: float, what: str, tolerance: float) -> None:
    error = abs(predicted - measured) / measured
    print(f"{what}: predicted {predicted:.1f}, measured {measured:.1f} ({(predicted - measured) / measured:+.0%})")
    assert error <= tolerance, f"{what}: predicted {predicted:.1f}, measured {measured:.1f}: {error:.0%} off"


def test_estimate_predicts_a_real_run(user: TestbedUser, workdir: Path) -> None:
    _copy_examples(user, workdir)
    # Profiles of earlier runs of this test would be reused (same script, arguments, image): start cold.
    shutil.rmtree(user.home / ".dlsub" / "estimates" / "profiles", ignore_errors=True)
    # Profiled on a quiet machine, as the real runs below are measured.
    if not wait_until_quiet():
        print("the testbed stayed busy for 90 s; profiling anyway")
    began = time.monotonic()
    out = user.run("dlsub", "estimate", "--batch-sizes", "32,128,512", "--epochs", EPOCHS, "--json",
                   "examples/train_digits.py", cwd=workdir, timeout=400)
    cold = time.monotonic() - began
    assert out.returncode == 0, out.stderr
    est: dict[str, Any] = json.loads(out.stdout)
    up = set(subprocess.run(["sinfo", "-h", "-o", "%R"], capture_output=True, text=True,
                            check=True).stdout.split())
    rows = est["rows"]
    assert {(r["partition"], r["batch_size"]) for r in rows} == {(p, b) for p in up for b in (32, 128, 512)}
    for r in rows:
        assert all(k in r for k in ROW_KEYS) and r["feasible"], r
        assert r["memory_mb"] > 0 and r["walltime_s"] > 0 and r["finish_s"] >= r["start_s"] >= 0
    assert est["recommendation"]["choice"] in [r["choice"] for r in rows]
    # One profile per partition role (partitions of a role share it) and batch size.
    assert est["profiled_now"] in range(3, 3 * len(up) + 1, 3)

    # The same estimate again: every profile from the cache, no job.
    began = time.monotonic()
    again = json.loads(user.dlsub("estimate", "--batch-sizes", "32,128,512", "--epochs", EPOCHS, "--json",
                                  "examples/train_digits.py", cwd=workdir).stdout)
    cached = time.monotonic() - began
    print(f"estimate: cold {cold:.1f} s, cached {cached:.1f} s")
    assert again["profiled_now"] == 0 and again["from_cache"] == est["profiled_now"] and cached < 10

    # A profiled batch size, run for real: memory within 25% of the prediction, walltime within a factor.
    row = next(r for r in rows if r["partition"] == "cpu" and r["batch_size"] == 128)
    walltime, peak = _run_for_real(user, workdir, 128)
    print(f"walltime s, batch 128: predicted {row['walltime_s']:.1f}, run {walltime:.1f}")
    assert row["walltime_s"] / WALLTIME_FACTOR <= walltime <= row["walltime_s"] * WALLTIME_FACTOR, (
        f"walltime at batch 128: predicted {row['walltime_s']:.1f} s, ran {walltime:.1f} s: off by more than "
        f"a factor of {WALLTIME_FACTOR:g}")
    _within(row["memory_mb"], peak, "memory MB, batch 128", MEMORY_TOLERANCE)

    # A batch size it did not profile: the memory fitted over 32, 128 and 512.
    from dlsub.estimate.partition_fit import ProfileRun, fit_partition

    saved = json.loads((user.home / ".dlsub" / "estimates" / f"{est['id']}.json").read_text())
    fit = fit_partition([ProfileRun.from_json(p) for p in saved["profiles"]["cpu"]])
    _, peak_256 = _run_for_real(user, workdir, 256)
    _within(fit.memory(256), peak_256, "memory MB, batch 256 (not profiled)", MEMORY_TOLERANCE)

    # Submitting that row: --mem and --time from the profile, with the margin stated.
    dry = user.run("dlsub", "submit", "--from-estimate", est["id"], "--choice", str(row["choice"]), "--dry-run",
                   cwd=workdir)
    assert dry.returncode == 0, dry.stderr
    assert "--mem=" in dry.stdout and "--time=" in dry.stdout and "DLSUB_BATCH_SIZE=128" in dry.stdout
    assert "--batch-size 128" in dry.stdout and "× 1.25" in dry.stderr


def test_job_over_budget_is_refused(user: TestbedUser, workdir: Path) -> None:
    _copy_examples(user, workdir)
    policy = put(user, workdir / "policy.toml",
                 '[partitions.gpu]\nrole = "gpu"\ncost_per_node_hour = 8.0\n'
                 '[partitions.cpu]\nrole = "cpu"\ncost_per_node_hour = 1.0\n'
                 '[budgets]\nperiod = "month"\n[budgets.users."*"]\ncost = 1.0\n')
    # An hour on a GPU node costs 8.0; the budget is 1.0 a month.
    refused = user.run("env", f"DLSUB_POLICY={policy}", "dlsub", "submit", "-p", "gpu", "--time", "60",
                       "-J", "over-budget-probe", "examples/train_digits.py", cwd=workdir)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "budget:" in refused.stderr and "left" in refused.stderr and "this month" in refused.stderr
    queued = subprocess.run(["squeue", "-h", "-n", "over-budget-probe"], capture_output=True, text=True).stdout
    assert not queued.strip(), "a refused job reaches no queue"
