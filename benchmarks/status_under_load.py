"""`dlsub status` under load: do jobs that run and end between two looks show Slurm's end?

    python benchmarks/status_under_load.py [--jobs 40] [--steps 60] [--step-s 0.45] [--look-every 5]

Submits --jobs small training jobs of one user back to back on the cpu partition (each reports --steps
steps, --step-s seconds apart) and runs `dlsub status --json` every --look-every seconds, as a user watching
them would, until Slurm has ended them all. Then one more look. Prints, per run: the jobs, how many were
seen live and next seen ended with no RUNNING look between (they ran, whole, between two looks: the case
that was shown PENDING for ever), and how many jobs `dlsub status` shows in another state than Slurm's own
record (squeue as root) — the figure that must be 0. Runs as root (acts as the testbed user) on a testbed
brought up by `make testbed`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testbed"))

from livebed import USER, TestbedUser, put, slurm_jobs

TRAIN = """
import sys, time
from dlsub import checkpointing
run = checkpointing.init()
steps, pause = int(sys.argv[1]), float(sys.argv[2])
for step in range(steps):
    time.sleep(pause)
    run.report(step=step + 1, loss=1.0 / (step + 1))
run.finish()
"""

FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "OUT_OF_MEMORY", "NODE_FAIL"}


def look(user: TestbedUser) -> dict[str, str]:
    """One `dlsub status --json` of every job of the last day: dlsub id -> state shown."""
    rows = json.loads(user.dlsub("status", "--json").stdout)
    return {row["id"]: row["state"] for row in rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--step-s", type=float, default=0.45)
    parser.add_argument("--look-every", type=float, default=5.0)
    args = parser.parse_args()
    user = TestbedUser(USER)
    workdir = Path(tempfile.mkdtemp(prefix="dlsub-it-status-load-", dir=user.home))
    shutil.chown(workdir, user.name)
    try:
        script = put(user, workdir / "train.py", TRAIN)
        jobs: dict[str, int] = {}
        seen: dict[str, list[str]] = {}
        submitting = threading.Event()
        submitting.set()

        def watch() -> None:
            """A user polling `dlsub status` every --look-every seconds from the first submit on."""
            while submitting.is_set() or not all_ended():
                shown = look(user)
                for job in list(jobs):
                    seen.setdefault(job, []).append(shown.get(job, "MISSING"))
                time.sleep(args.look_every)

        def all_ended() -> bool:
            slurm = {j["job_id"]: j.get("job_state") for j in slurm_jobs()}
            return all(slurm.get(sid) in FINAL for sid in list(jobs.values()))

        started = time.time()
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        for i in range(args.jobs):
            job = user.submit("-p", "cpu", "--mem", "500M", "-J", f"load-{i}", str(script), str(args.steps),
                              str(args.step_s), cwd=workdir)
            jobs[job["id"]] = job["slurm_job_id"]
        submitting.clear()
        watcher.join(timeout=60 * 30)
        elapsed = time.time() - started
        looks = max((len(v) for v in seen.values()), default=0)
        final_look = look(user)
        slurm = {j["job_id"]: j.get("job_state") for j in slurm_jobs()}
        skipped = sum(1 for states in seen.values()
                      if any(before in ("PENDING", "REQUEUED") and after in FINAL
                             for before, after in zip(states, states[1:], strict=False)))
        wrong = {job: (final_look.get(job), slurm.get(sid)) for job, sid in jobs.items()
                 if final_look.get(job) != {"OUT_OF_MEMORY": "FAILED", "NODE_FAIL": "FAILED"}.get(
                     str(slurm.get(sid)), slurm.get(sid))}
        print(json.dumps({"jobs": args.jobs, "looks": looks, "look_every_s": args.look_every,
                          "elapsed_s": round(elapsed, 1), "ended_between_two_looks": skipped,
                          "shown_otherwise_than_slurm": len(wrong), "mismatches": wrong}, indent=2))
        return 0 if not wrong else 1
    finally:
        ids = [str(sid) for sid in locals().get("jobs", {}).values()]
        if ids:
            subprocess.run(["scancel", *ids], check=False)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
