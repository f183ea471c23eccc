"""The shape of the iScheduler result on the live testbed: start now on CPUs and move, or wait for GPUs?

    python benchmarks/immediate_vs_ideal.py [--minutes 1,2,4] [--epochs 20]

For each T, a blocker holds every GPU for T minutes while the same training
job is submitted, once in ideal mode (it waits for a GPU) and once in
immediate mode (it starts on the cpu partition and the agent moves it onto
a GPU when the blocker ends). Prints submit-to-completion time of both and
their ratio. Runs as root (acts as the testbed user); the agent service
must be running (make testbed).

The testbed's GPUs are fake and its "CPU" and "GPU" nodes are the same
cores, so the job sleeps --throttle seconds per step on a GPU and
--cpu-slowdown times that on a CPU node: the CPU is made as much slower as
the site policy says it is (partition speed 0.25 in etc/testbed/policy.toml).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testbed"))

from livebed import EXAMPLES, USER, TestbedUser, slurm_job, wait_for


def blocker(user: TestbedUser, minutes: float) -> list[int]:
    ids = []
    for _ in range(2):
        out = user.run("sbatch", "--parsable", "-p", "gpu", "--gres=gpu:4", "-J", "blocker", "--mem=200",
                       "--cpus-per-task=1", f"--time={int(minutes) + 2}", "--wrap", f"sleep {int(minutes * 60)}",
                       check=True)
        ids.append(int(out.stdout.strip()))
    wait_for("the blocker", lambda: all((slurm_job(i) or {}).get("job_state") == "RUNNING" for i in ids), timeout=60)
    return ids


def run_one(user: TestbedUser, mode: str, minutes: float, args: argparse.Namespace, workdir: Path) -> dict:
    ids = blocker(user, minutes)
    start = time.time()
    job = user.submit("--mode", mode, "--gpus", "1", str(EXAMPLES / "train_digits.py"), "--epochs",
                      str(args.epochs), "--throttle", str(args.throttle), "--cpu-slowdown", str(args.cpu_slowdown),
                      cwd=workdir)
    final = wait_for(f"{mode} job", lambda: (s := user.status(job["id"]))["state"] in
                     ("COMPLETED", "FAILED", "CANCELLED") and s, timeout=3600, interval=1)
    elapsed = time.time() - start
    subprocess.run(["scancel", *map(str, ids)], check=False)
    wait_for("the blocker to end", lambda: all(slurm_job(i) is None or slurm_job(i)["job_state"] != "RUNNING"
                                                for i in ids), timeout=120)
    return {"mode": mode, "blocker_min": minutes, "jct_s": round(elapsed, 1), "state": final["state"],
            "first_partition": job["partition"], "final_partition": final["partition"],
            "attempts": final["attempts"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", default="1,2,4", help="blocker durations T, minutes")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--throttle", type=float, default=0.1, help="seconds per step on a GPU")
    parser.add_argument("--cpu-slowdown", type=float, default=4.0, help="a CPU step takes this many times longer")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    user = TestbedUser(USER)
    workdir = user.home
    rows = []
    for minutes in (float(m) for m in args.minutes.split(",")):
        ideal = run_one(user, "ideal", minutes, args, workdir)
        immediate = run_one(user, "immediate", minutes, args, workdir)
        rows.append((minutes, ideal, immediate))
        if not args.json:
            print(f"T={minutes:g} min: ideal {ideal['jct_s']:.0f} s ({ideal['final_partition']}), immediate "
                  f"{immediate['jct_s']:.0f} s ({immediate['first_partition']}->{immediate['final_partition']}, "
                  f"{immediate['attempts']} attempts), immediate/ideal {immediate['jct_s'] / ideal['jct_s']:.2f}",
                  flush=True)
    if args.json:
        print(json.dumps([{"T_min": m, "ideal": i, "immediate": im} for m, i, im in rows], indent=2))
    else:
        ratios = [im["jct_s"] / i["jct_s"] for _, i, im in rows]
        print(f"median immediate/ideal time to completion: {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
