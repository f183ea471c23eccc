"""`dlsub estimate`'s immediate-vs-ideal recommendation against what actually happens.

    flock /tmp/dlsub-testbed.lock python3 benchmarks/recommendation_vs_actual.py [--minutes 2] [--epochs 20]

The agent issue's benchmark (benchmarks/immediate_vs_ideal.py) rerun with
the estimate's recommendation. For each T:

1. a blocker holds every GPU of the testbed for T minutes (its time limit is
   T minutes too, so Slurm's own start estimate of a GPU job is the moment
   the blocker really ends);
2. `dlsub estimate --gpus 1 --batch-sizes B --epochs E` of
   examples/train_digits.py (its profiles cached by a warm-up estimate
   before any blocker, so it takes a second and sees the blocker only
   through `sbatch --test-only`) recommends *ideal* (wait for a GPU) or
   *immediate* (start on the cpu partition now, move when the GPUs free
   up), with the predicted finish of each;
3. both choices are submitted at once, as immediate_vs_ideal.py submits them
   (`--mode ideal` and `--mode immediate`, `--gpus 1`, the same arguments
   and batch size), under that one blocker (8 GPUs: they never compete for
   one), and run to completion.

Prints, per choice, predicted vs actual finish (seconds after the estimate
was made; actual = the last attempt's end record), predicted vs actual
start on the GPUs (the ideal job's start; the immediate job's move), the
error in percent, and whether the recommended choice was indeed the faster.
Runs as root (acts as the testbed user); the agent must be running.

The testbed's GPUs are fake and its CPU and GPU nodes share cores, so the
job sleeps --throttle s per step on a GPU and --cpu-slowdown times that on a
CPU node, as in immediate_vs_ideal.py (etc/testbed/policy.toml declares the
cpu partition 0.25 as fast).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testbed"))

from livebed import EXAMPLES, USER, TestbedUser, attempts, slurm_job, wait_for

ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")


def hold_gpus(user: TestbedUser, minutes: float) -> list[int]:
    """Two jobs holding all 8 GPUs for ``minutes``, with a time limit of as long (Slurm's start estimate)."""
    ids = []
    for _ in range(2):
        out = user.run("sbatch", "--parsable", "-p", "gpu", "--gres=gpu:4", "-J", "blocker", "--mem=200",
                       "--cpus-per-task=1", f"--time={int(minutes)}", "--wrap", f"sleep {int(minutes * 60)}",
                       check=True)
        ids.append(int(out.stdout.strip().split(";")[0]))
    wait_for("the blocker", lambda: all((slurm_job(i) or {}).get("job_state") == "RUNNING" for i in ids), timeout=60)
    return ids


def script_args(args: argparse.Namespace) -> list[str]:
    return ["--epochs", str(args.epochs), "--throttle", str(args.throttle), "--cpu-slowdown", str(args.cpu_slowdown)]


def estimate(user: TestbedUser, args: argparse.Namespace, *extra: str) -> dict[str, Any]:
    out = user.dlsub("estimate", "--gpus", "1", "--batch-sizes", str(args.batch_size), "--epochs", str(args.epochs),
                     "--json", *extra, str(EXAMPLES / "train_digits.py"), *script_args(args), cwd=user.home)
    return json.loads(out.stdout)


def finish_times(job_dir: str) -> tuple[float | None, float | None, float | None]:
    """(first start, first start on a GPU partition, last end) from the job's attempt records."""
    records = attempts(job_dir)
    starts = [r for r in records if r.get("event") == "start"]
    ends = [float(r["time"]) for r in records if r.get("event") == "end"]
    on_gpu = [float(r["time"]) for r in starts if str(r.get("partition", "")).startswith("gpu")]
    return (float(starts[0]["time"]) if starts else None, min(on_gpu) if on_gpu else None,
            max(ends) if ends else None)


def pct(pred: float | None, actual: float | None) -> str:
    if pred is None or actual is None or actual <= 0:
        return "-"
    return f"{(pred - actual) / actual:+.0%}"


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def one_round(user: TestbedUser, minutes: float, args: argparse.Namespace) -> dict[str, Any]:
    blocker = hold_gpus(user, minutes)
    jobs: dict[str, dict[str, Any]] = {}
    try:
        est = estimate(user, args)
        made = float(est["created"])
        rec = est["recommendation"]
        for mode in ("ideal", "immediate"):
            jobs[mode] = user.submit("--mode", mode, "--gpus", "1", str(EXAMPLES / "train_digits.py"),
                                     *script_args(args), "--batch-size", str(args.batch_size), cwd=user.home)
        finals = {mode: wait_for(f"the {mode} job", lambda j=job: (s := user.status(j["id"]))["state"] in ENDED and s,
                                 timeout=1800, interval=2)
                  for mode, job in jobs.items()}
    finally:
        for job in jobs.values():
            user.dlsub("cancel", job["id"], check=False)
        subprocess.run(["scancel", *map(str, blocker)], check=False)
    result: dict[str, Any] = {"T_min": minutes, "estimate_id": est["id"], "recommended": rec.get("mode"),
                              "reason": rec.get("reason"), "estimate_s": est.get("elapsed_s")}
    for mode in ("ideal", "immediate"):
        predicted = rec.get(mode) or {}
        first, on_gpu, end = finish_times(jobs[mode]["job_dir"])
        result[mode] = {
            "state": finals[mode]["state"], "first_partition": jobs[mode]["partition"],
            "final_partition": finals[mode]["partition"], "attempts": finals[mode]["attempts"],
            "predicted_finish_s": predicted.get("finish_s"),
            # The ideal job starts on the GPUs when the blocker ends; the immediate one moves there then.
            "predicted_gpu_s": (rec.get("ideal") or {}).get("start_s"),
            "actual_finish_s": None if end is None else round(end - made, 1),
            "actual_gpu_s": None if on_gpu is None else round(on_gpu - made, 1),
            "actual_first_start_s": None if first is None else round(first - made, 1),
        }
    done = {m: result[m]["actual_finish_s"] for m in ("ideal", "immediate")}
    if None not in done.values() and all(result[m]["state"] == "COMPLETED" for m in done):
        faster = min(done, key=lambda m: done[m])
        result["actually_faster"] = faster
        result["recommendation_right"] = result["recommended"] == faster
    return result


def report(r: dict[str, Any]) -> None:
    print(f"T={r['T_min']:g} min: estimate {r['estimate_id']} ({r['estimate_s']} s) recommends "
          f"{r['recommended']}: {r['reason']}")
    print(f"  {'choice':<10} {'pred finish s':>13} {'actual s':>9} {'err':>6} {'pred GPU at s':>13} "
          f"{'actual s':>9} {'path':<18} {'state':<10}")
    for mode in ("ideal", "immediate"):
        x = r[mode]
        path = (f"{x['first_partition']}->{x['final_partition']}" if x["first_partition"] != x["final_partition"]
                else x["final_partition"]) + f" ({x['attempts']})"
        print(f"  {mode:<10} {fmt(x['predicted_finish_s']):>13} {fmt(x['actual_finish_s']):>9} "
              f"{pct(x['predicted_finish_s'], x['actual_finish_s']):>6} {fmt(x['predicted_gpu_s']):>13} "
              f"{fmt(x['actual_gpu_s']):>9} {path:<18} {x['state']:<10}")
    if "actually_faster" in r:
        i, im = r["ideal"]["actual_finish_s"], r["immediate"]["actual_finish_s"]
        pi, pim = r["ideal"]["predicted_finish_s"], r["immediate"]["predicted_finish_s"]
        predicted_ratio = f"{pim / pi:.2f}" if pi and pim else "-"
        print(f"  actually faster: {r['actually_faster']} (immediate/ideal {im / i:.2f}, predicted "
              f"{predicted_ratio}); the recommendation was {'right' if r['recommendation_right'] else 'wrong'}",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", default="2", help="blocker durations T, minutes (whole minutes)")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--throttle", type=float, default=0.1, help="seconds per step on a GPU")
    parser.add_argument("--cpu-slowdown", type=float, default=4.0, help="a CPU step takes this many times longer")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    user = TestbedUser(USER)
    began = time.monotonic()
    warm = estimate(user, args)  # no blocker yet: profiles every partition now, or finds them cached
    if not args.json:
        print(f"warm-up estimate: {warm['elapsed_s']} s ({warm['profiled_now']} profiling jobs, "
              f"{warm['from_cache']} cached)", flush=True)
    rounds = []
    for minutes in (float(m) for m in args.minutes.split(",")):
        r = one_round(user, minutes, args)
        rounds.append(r)
        if not args.json:
            report(r)
    if args.json:
        print(json.dumps(rounds, indent=2))
    else:
        right = sum(1 for r in rounds if r.get("recommendation_right"))
        print(f"recommendation right in {right} of {len(rounds)} round(s); testbed time "
              f"{time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
