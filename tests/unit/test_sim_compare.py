"""Unit (no Slurm): the comparison arithmetic (dlsub.sim.compare) and the benchmarks that print it beside
average JCT: p99 JCT and GPU-hours per job with the same intervals, and a claim that names both (issue 54)."""

from __future__ import annotations

import importlib
import json
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from dlsub.sim.compare import Estimate, claim, figures, goal_met, interval, per_order, table
from dlsub.sim.engine import SimConfig

REPO = Path(__file__).resolve().parents[2]
# Two workloads, two orders: (workload, order) -> figures.
OURS = {(1, 1): {"avg_jct_s": 900.0, "p99_jct_s": 9000.0, "gpu_h_per_job": 4.4},
        (2, 1): {"avg_jct_s": 800.0, "p99_jct_s": 7000.0, "gpu_h_per_job": 2.0},
        (1, 2): {"avg_jct_s": 850.0, "p99_jct_s": 8000.0, "gpu_h_per_job": 4.0},
        (2, 2): {"avg_jct_s": 900.0, "p99_jct_s": 9000.0, "gpu_h_per_job": 2.2}}
BASE = {key: {"avg_jct_s": 1000.0, "p99_jct_s": 10000.0, "gpu_h_per_job": 4.0 if key[0] == 1 else 2.0}
        for key in OURS}


@pytest.fixture(scope="module")
def benchmarks() -> None:
    folder = str(REPO / "benchmarks")
    if folder not in sys.path:
        sys.path.insert(0, folder)


def test_per_order_is_the_mean_over_workloads_of_the_ratio_on_the_same_jobs() -> None:
    jct = per_order(lambda w, s: OURS[(w, s)], lambda w, s: BASE[(w, s)], "avg_jct_s", [1, 2], [1, 2])
    assert jct == pytest.approx([(0.9 + 0.8) / 2, (0.85 + 0.9) / 2])
    gpu_h = per_order(lambda w, s: OURS[(w, s)], lambda w, s: BASE[(w, s)], "gpu_h_per_job", [1, 2], [1, 2])
    assert gpu_h == pytest.approx([(1.1 + 1.0) / 2, (1.0 + 1.1) / 2])
    absolute = per_order(lambda w, s: OURS[(w, s)], None, "gpu_h_per_job", [1, 2], [1, 2])
    assert absolute == pytest.approx([3.2, 3.1])


def test_a_run_missing_on_either_side_is_left_out_of_its_order() -> None:
    base = {key: value for key, value in BASE.items() if key != (2, 1)}
    got = per_order(lambda w, s: OURS[(w, s)], lambda w, s: base.get((w, s)), "avg_jct_s", [1, 2], [1, 2])
    assert got == pytest.approx([0.9, 0.875])


def test_every_metric_gets_the_same_interval_over_orders() -> None:
    ratios = figures(lambda w, s: OURS[(w, s)], lambda w, s: BASE[(w, s)], [1, 2], [1, 2])
    assert set(ratios) == {"avg_jct_s", "p99_jct_s", "gpu_h_per_job"}
    # Two orders: t(0.975, 1) = 12.706, stdev of (0.85, 0.875) = 0.01768, half = 12.706 * 0.01768 / sqrt(2).
    jct = ratios["avg_jct_s"]
    assert jct.mean == pytest.approx(0.8625)
    assert jct.hi - jct.mean == pytest.approx(12.7062 * 0.0176777 / math.sqrt(2), rel=1e-4)
    assert ratios["gpu_h_per_job"].mean == pytest.approx(1.05)
    assert ratios["gpu_h_per_job"].lo == pytest.approx(1.05) and ratios["gpu_h_per_job"].hi == pytest.approx(1.05)


def test_one_order_has_no_interval() -> None:
    one = interval([0.8])
    assert one.mean == 0.8 and not one.shown
    assert "no interval" in one.text()


@pytest.mark.parametrize(("jct", "gpu_h", "want"), [
    (Estimate(0.85, 0.84, 0.86), Estimate(0.95, 0.93, 0.97), "met"),
    # A lead bought with GPU-hours is no lead: the JCT alone would meet the goal.
    (Estimate(0.85, 0.84, 0.86), Estimate(1.10, 1.05, 1.15), "not met"),
    (Estimate(0.95, 0.94, 0.96), Estimate(0.90, 0.88, 0.92), "not met"),
    (Estimate(0.85, 0.84, 0.86), Estimate(1.00, 0.97, 1.03), "not shown either way"),
    (Estimate(0.90, 0.88, 0.92), Estimate(0.90, 0.88, 0.92), "not shown either way"),
])
def test_the_goal_needs_both_the_jct_and_the_gpu_hours(jct: Estimate, gpu_h: Estimate, want: str) -> None:
    assert goal_met(jct, gpu_h, 0.90) == want


def test_the_claim_names_the_jct_and_the_gpu_hours() -> None:
    text = claim("goodput", "sia", {"avg_jct_s": Estimate(0.85, 0.84, 0.86),
                                    "gpu_h_per_job": Estimate(1.2, 1.18, 1.22)}, 0.90, "on Philly 5-8")
    assert "average JCT is 0.850 [0.840, 0.860] x sia's (15% less)" in text
    assert "1.200 [1.180, 1.220] x its GPU-hours per job (20% more)" in text
    assert text.endswith("is not met.")


def test_the_table_gives_hours_for_the_jcts_and_gpu_hours_as_they_are() -> None:
    rows = {"goodput": figures(lambda w, s: OURS[(w, s)], None, [1, 2], [1, 2])}
    line = table(rows)[1]
    assert line.split()[0] == "goodput"
    assert "0.240 [" in line  # (850 + 875) / 2 / 3600 h: the orders' means
    assert "3.150 [" in line


def test_goodput_vs_pollux_prints_every_figure_and_the_claim(benchmarks: None,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    bench: ModuleType = importlib.import_module("goodput_vs_pollux")
    results = {}
    for (w, s), figs in OURS.items():
        results[("1.0", w + 4, s, "goodput", "none")] = figs
        results[("1.0", w + 4, s, "pollux", "none")] = BASE[(w, s)]
    bench.report(results, ["1.0"], [1, 2], [5, 6], ["none"], generated=True)
    out = capsys.readouterr().out
    assert "goodput/pollux GPU-h/job" in out and "goodput/pollux p99 JCT" in out
    assert "1.050 [1.050, 1.050]" in out  # the GPU-hours ratio, both orders alike
    assert "Claim: at 1.0x load, untouched (5-8), online, no history, goodput's average JCT is 0.863" in out
    assert "x its GPU-hours per job (5% more); the goal of <= 0.90x at no more GPU-hours is not met." in out


def test_goodput_vs_pollux_compares_systems_at_their_own_resize_costs(benchmarks: None,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 52: runs keyed by resize cost; the systems comparison takes goodput's runs at dlsub's resize and
    pollux's at a restart; a kept row without the field is a restart row; each policy's paired change."""
    bench: ModuleType = importlib.import_module("goodput_vs_pollux")
    results = {}
    for (w, s), figs in OURS.items():
        results[("1.0", w + 4, s, "goodput", "none", "10")] = figs
        results[("1.0", w + 4, s, "goodput", "none", "restart")] = BASE[(w, s)]
        results[("1.0", w + 4, s, "pollux", "none", "restart")] = BASE[(w, s)]
    systems = bench.at_costs(results, {"": "10", "pollux": "restart"})
    assert systems[("1.0", 5, 1, "goodput", "none")] == OURS[(1, 1)]
    assert systems[("1.0", 5, 1, "pollux", "none")] == BASE[(1, 1)]
    assert bench._key({"load": "1.0", "workload": 5, "seed": 1, "policy": "pollux", "history": "none"})[5] == "restart"
    assert bench.cost_label("10.0") == "10" and bench.resize_penalty("restart") is None
    bench.mechanism(results, ["1.0"], [1, 2], [5, 6], ["restart", "10"], ["goodput"], "none", bench.HALVES)
    out = capsys.readouterr().out
    assert "1.0x untouched (5-8), goodput at resize 10 s / at restart: avg JCT 0.863 [" in out


def test_goodput_vs_pollux_runs_again_a_kept_row_without_gpu_hours(benchmarks: None) -> None:
    bench: ModuleType = importlib.import_module("goodput_vs_pollux")
    assert bench.figures_of({"avg_jct_s": 1.0}) is None
    assert bench.figures_of({"avg_jct_s": 1.0, "p99_jct_s": 2.0, "gpu_h_per_job": 3.0}) == {
        "avg_jct_s": 1.0, "p99_jct_s": 2.0, "gpu_h_per_job": 3.0}


def _kept_runs(raw: Path, goodput_variant: dict[str, float], by_app: bool,
               charge: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """goodput_vs_sia's kept runs of OURS (goodput, its variant ``goodput_variant``, charged a profile: 60 s
    flat, as rows kept before the modelled charge, or ``charge``'s fields) and BASE (sia) on workloads 5 and 6,
    written to ``raw``; the rows in the order written."""
    rows: list[dict[str, Any]] = []
    for (w, s), figs in OURS.items():
        for policy, f in (("goodput", figs), ("sia", BASE[(w, s)])):
            charged = policy == "goodput"
            row = {"policy": policy, "workload": w + 4, "seed": s, "jitter": 120.0,
                   "variant": goodput_variant if charged else {},
                   "profile": "before" if charged else "", "profile_s": 60.0 if charged else 0.0,
                   "profile_report": charged, "history": "none", "restarts": 10, **f,
                   **((charge or {}) if charged else {})}
            if by_app:
                row["by_app"] = {"bert": [2, f["avg_jct_s"] * 2, f["gpu_h_per_job"] * 2 * 3600, 1]}
            rows.append(row)
    raw.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def test_goodput_vs_sia_prints_every_figure_and_the_claim_from_kept_runs(
        benchmarks: None, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    bench: ModuleType = importlib.import_module("goodput_vs_sia")
    raw = tmp_path / "raw.jsonl"
    _kept_runs(raw, {}, by_app=True,  # charged as SimConfig's defaults charge: the measured start-up, modelled
               charge={"profile_cost": "steps", "profile_startup_s": SimConfig.profile_startup_s})
    # Kept before --resize-costs: each run charged a resize a restart.
    monkeypatch.setattr(sys, "argv", ["goodput_vs_sia.py", "--workloads", "5,6", "--orders", "2", "--policies",
                                      "goodput,sia", "--raw", str(raw), "--by-app", "--resize-costs", "restart"])

    def no_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("every run is kept: none runs")

    monkeypatch.setattr(bench, "run_one", no_run)
    bench.main()
    out = capsys.readouterr().out
    assert "goodput/sia GPU-h/job, per order: 1.050 1.050; mean 1.050 [1.050, 1.050]" in out
    assert "goodput/sia p99 JCT, per order: 0.800 0.850" in out
    assert ("Claim: on Philly workloads 5,6 (untouched: goodput's constants were chosen on workloads 1-4), online, "
            "goodput's average JCT is 0.863") in out
    assert "(5% more); the goal of <= 0.90x at no more GPU-hours is not met." in out
    by_app = [line.split() for line in out.splitlines() if line.split()[:2] in (["goodput", "bert"], ["sia", "bert"])]
    assert by_app == [["goodput", "bert", "8", "0.240", "3.15", "0.50"], ["sia", "bert", "8", "0.278", "3.00", "0.50"]]


def test_goodput_vs_sia_tells_runs_apart_by_the_charge_of_a_profiles_further_batch_sizes(
        benchmarks: None, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A kept run of profile_batches=2 without the charge's field was charged SimConfig's 20 s, flat (the
    charge before issue 54's model): reused at that charge, run again at another (and only goodput's runs:
    sia's profile has no further batch), and again with the profile's wait modelled (--profile-cost steps)."""
    bench: ModuleType = importlib.import_module("goodput_vs_sia")
    raw = tmp_path / "raw.jsonl"
    rows = _kept_runs(raw, {"profile_batches": 2.0}, by_app=False)
    ran: list[tuple[object, ...]] = []
    told: list[dict[str, object]] = []

    def run_one(*args: object, **kwargs: object) -> dict[str, object]:
        assert kwargs["resize"] == "restart"
        ran.append(args)
        told.append(kwargs)
        w, s = int(args[3]) - 4, int(args[4])  # type: ignore[call-overload]
        return {**rows[2 * list(OURS).index((w, s))], "profile_batch_s": args[-1],
                "profile_cost": kwargs["profile_cost"], "profile_startup_s": kwargs["profile_startup_s"],
                "profile_batch_startup_s": kwargs["profile_batch_startup_s"]}

    monkeypatch.setattr(bench, "run_one", run_one)
    argv = ["goodput_vs_sia.py", "--workloads", "5,6", "--orders", "2", "--policies", "goodput,sia", "--raw",
            str(raw), "--variant", "profile_batches=2", "--resize-costs", "restart", "--profile-cost", "flat"]
    monkeypatch.setattr(sys, "argv", argv)
    bench.main()
    assert ran == []
    monkeypatch.setattr(sys, "argv", [*argv, "--profile-batch-s", "60"])
    bench.main()
    assert [(args[2], args[-1]) for args in ran] == [("goodput", 60.0)] * 4
    assert "each further batch size of its profile 60 s" in capsys.readouterr().out
    ran.clear()
    modelled = [*argv[:-1], "steps", "--profile-startup-s", "15"]
    monkeypatch.setattr(sys, "argv", modelled)
    bench.main()
    assert [(args[2], kw["profile_cost"], kw["profile_startup_s"]) for args, kw in zip(ran, told[-4:], strict=True)] \
        == [("goodput", "steps", 15.0)] * 4
    ran.clear()
    bench.main()  # the modelled runs are kept now: none again
    assert ran == []


def test_both_benchmarks_take_grow_slash_shrink_resize_costs(benchmarks: None) -> None:
    """Issue 52: --resize-costs takes GROW/SHRINK (9.3/0.6) beside restart and seconds, keyed as spelt, and the
    systems comparison gives goodput that measured pair."""
    for name in ("goodput_vs_pollux", "goodput_vs_sia"):
        bench: ModuleType = importlib.import_module(name)
        assert [bench.cost_label(c) for c in ("restart", "10.0", "9.30/0.60", "0")] == ["restart", "10", "9.3/0.6",
                                                                                        "0"]
    pollux: ModuleType = importlib.import_module("goodput_vs_pollux")
    assert pollux.resize_penalty("9.3/0.6") == 9.3 and pollux.resize_penalty("restart") is None
