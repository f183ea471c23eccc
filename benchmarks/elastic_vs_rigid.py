"""Time to result of an elastic job against the same job rigid, when a GPU node frees mid-run (live testbed).

    python benchmarks/elastic_vs_rigid.py [--blocker-s 45] [--epochs 18] [--throttle-per-sample 0.05] [--json]

The same training (examples/train_digits.py, global batch 64, a fixed
number of epochs) runs twice, one after the other, each alone on the
testbed: rigid (`dlsub --nodes 1 --gpus-per-node 4`) and elastic
(`--nodes 1:2 --gpus-per-node 4`). Each time, a blocker job holds the other
GPU node for --blocker-s seconds after the submission and then ends: the
rigid job keeps its one node; the agent grows the elastic job onto the freed
node (world size 4 -> 8), where it resumes from the checkpoint torchrun's
stop made. Prints submit-to-completion of both and rigid/elastic (the
issue's floor: elastic at least 1.5x faster).

Speed is emulated, because the testbed's 8 "GPUs" are fake and share two
cores: a step sleeps --throttle-per-sample seconds per sample of the
process's share of the fixed global batch (train_digits.py
--throttle-per-sample), so a step takes THROTTLE*64/world_size: 0.8 s on
one node and 0.4 s on two with the defaults, as data-parallel GPUs would
give (the real compute and all-reduce on the two shared cores add about
0.02 s at world size 4 and 0.04 s at 8, so the best speed-up here is about
1.86x). What the elastic job gets is less again by the T seconds on one
node and by the re-formation (tick, worker start, rendezvous, checkpoint
and restore: about 20 s, benchmarks/resize_latency.py). With T = 45 s and a
rigid run of about 5.5 min the node frees in the first seventh of the run,
as in a long training that a node frees up for early; the ratio tends to
1.86 as the run grows longer and to 1 as T nears the run's length, so the
1.5x floor holds for runs above about 7 x T (here about 5 min).

Runs as root (acts as the testbed user); needs the agent service (tick 3 s)
and an otherwise idle testbed. Takes about 10 minutes with the defaults.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from elastic_bench import (
    GPUS_PER_NODE,
    TRAIN,
    clean_up,
    events,
    finished,
    first_after,
    gone,
    hold_node,
    now,
    scancel,
    submit,
    wait_testbed_quiet,
)

from livebed import USER, TestbedUser, wait_for


def run_one(user: TestbedUser, nodes: str, args: argparse.Namespace) -> dict[str, Any]:
    """Submit the job while a blocker holds the other node; end the blocker T s later; time to completion."""
    wait_testbed_quiet()
    blocker = hold_node(user, name="blocker")
    job: dict[str, Any] = {}
    try:
        submitted = now()
        job = submit(user, "-p", "gpu", "--time", "30", "--nodes", nodes, "--gpus-per-node", str(GPUS_PER_NODE),
                     TRAIN, "--epochs", str(args.epochs), "--throttle-per-sample",
                     str(args.throttle_per_sample))
        freed = None
        final = None
        while final is None:
            if freed is None and now() - submitted >= args.blocker_s:
                scancel(blocker)
                freed = now()
            final = finished(user, job["id"])
            if final is None:
                time.sleep(0.5)
        elapsed = now() - submitted
    finally:
        scancel(blocker)
        if job and not finished(user, job["id"]):
            user.dlsub("cancel", job["id"], check=False)
    if job:
        wait_for("the job's Slurm jobs gone", lambda: gone(job["slurm_job_id"], job.get("worker_array_id")),
                 timeout=120, interval=0.5)
    starts = events(job["job_dir"], "start")
    grown = first_after(job["job_dir"], "start", 0, world_size=2 * GPUS_PER_NODE)
    last = events(job["job_dir"], "progress")[-1:] or [{}]
    return {"nodes": nodes, "state": final["state"], "jct_s": round(elapsed, 1),
            "blocker_ended_s": round(freed - submitted, 1) if freed else None,
            "world_sizes": [e.get("world_size") for e in starts],
            "grown_at_s": round(float(grown["time"]) - submitted, 1) if grown else None,
            "steps": last[0].get("step"), "id": job["id"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocker-s", type=float, default=45.0, help="T: the blocker ends T s after the submission")
    parser.add_argument("--epochs", type=int, default=18, help="22 steps of 64 samples each")
    parser.add_argument("--throttle-per-sample", type=float, default=0.05,
                        help="seconds per sample of a process's share of the global batch of 64")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    user = TestbedUser(USER)
    try:
        rigid = run_one(user, "1", args)
        if not args.json:
            print(f"rigid   (--nodes 1):   {rigid['jct_s']:6.1f} s submit to completion, {rigid['state']}, "
                  f"world sizes {rigid['world_sizes']}", flush=True)
        elastic = run_one(user, "1:2", args)
    finally:
        clean_up(user)
    ratio = rigid["jct_s"] / elastic["jct_s"]
    if args.json:
        print(json.dumps({"blocker_s": args.blocker_s, "epochs": args.epochs, "rigid": rigid, "elastic": elastic,
                          "rigid_over_elastic": round(ratio, 2)}, indent=2))
        return
    print(f"elastic (--nodes 1:2): {elastic['jct_s']:6.1f} s submit to completion, {elastic['state']}, "
          f"world sizes {elastic['world_sizes']}, at world size {2 * GPUS_PER_NODE} from "
          f"{elastic['grown_at_s']} s (blocker ended at {elastic['blocker_ended_s']} s)")
    print(f"T = {args.blocker_s:g} s, {args.epochs} epochs: elastic is {ratio:.2f}x faster than rigid "
          f"(floor 1.5x: {'met' if ratio >= 1.5 else 'NOT met'})")


if __name__ == "__main__":
    main()
