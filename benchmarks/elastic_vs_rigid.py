"""Time to result of an elastic job against the same job rigid, when a GPU node frees mid-run (live testbed).

    python benchmarks/elastic_vs_rigid.py [--blocker-s 45] [--epochs 18] [--throttle-per-sample 0.05] [--json]
    python benchmarks/elastic_vs_rigid.py --in-gpus [--blocker-s 30] [--gap-s 20] [--throttle-per-sample 0.0125]

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

--in-gpus: the same with GPUs freeing one at a time on one node. gpu2 is
held throughout; the job starts on the one free GPU of gpu1 while three
1-GPU jobs hold the rest, which end at T, T + gap and T + 2 gap. Rigid is
``dlsub --gpus 1``, elastic ``dlsub --gpus 1:4`` (both ``--cpus 1 --mem
1G``), which the agent grows GPU by GPU on gpu1 (world size 1 -> 2 -> 3 ->
4). A step takes THROTTLE*64/world_size: 0.8 s on one GPU and 0.2 s on four
with --throttle-per-sample 0.0125.

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


def run_one(user: TestbedUser, size: str, args: argparse.Namespace) -> dict[str, Any]:
    """Submit the job while blockers hold what it could grow onto; end them from T s later; time to completion.

    ``size``: the nodes (``1``, ``1:2``) or, with --in-gpus, the GPUs (``1``, ``1:4``) it asks for."""
    wait_testbed_quiet()
    if args.in_gpus:
        kept = [hold_node(user, name="busy", node="gpu2")]  # gpu2 busy throughout: growth is within gpu1
        blockers = [hold_node(user, name="blocker", gpus=1, node="gpu1") for _ in range(GPUS_PER_NODE - 1)]
        shape: tuple[str, ...] = ("--gpus", size, "--cpus", "1", "--mem", "1G")
    else:
        kept, blockers = [], [hold_node(user, name="blocker")]
        shape = ("--nodes", size, "--gpus-per-node", str(GPUS_PER_NODE))
    job: dict[str, Any] = {}
    try:
        submitted = now()
        job = submit(user, "-p", "gpu", "--time", "30", *shape, TRAIN, "--epochs", str(args.epochs),
                     "--throttle-per-sample", str(args.throttle_per_sample))
        freed: float | None = None
        final = None
        while final is None:
            due = [b for i, b in enumerate(blockers) if b and now() - submitted >= args.blocker_s + i * args.gap_s]
            for blocker in due[:1]:  # one at a time, each at its own time
                scancel(blocker)
                blockers[blockers.index(blocker)] = 0
                freed = freed or now()
            final = finished(user, job["id"])
            if final is None:
                time.sleep(0.5)
        elapsed = now() - submitted
    finally:
        scancel(*[b for b in blockers if b], *kept)
        if job and not finished(user, job["id"]):
            user.dlsub("cancel", job["id"], check=False)
    if job:
        wait_for("the job's Slurm jobs gone", lambda: gone(job["slurm_job_id"], job.get("worker_array_id")),
                 timeout=120, interval=0.5)
    starts = events(job["job_dir"], "start")
    grown = first_after(job["job_dir"], "start", 0, world_size=GPUS_PER_NODE if args.in_gpus else 2 * GPUS_PER_NODE)
    last = events(job["job_dir"], "progress")[-1:] or [{}]
    return {"size": size, "state": final["state"], "jct_s": round(elapsed, 1),
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
    parser.add_argument("--in-gpus", action="store_true",
                        help="GPUs free one at a time on gpu1: rigid --gpus 1 against elastic --gpus 1:4")
    parser.add_argument("--gap-s", type=float, default=20.0, help="--in-gpus: seconds between the GPUs freeing")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    user = TestbedUser(USER)
    option = "--gpus" if args.in_gpus else "--nodes"
    wide = f"1:{GPUS_PER_NODE}" if args.in_gpus else "1:2"
    try:
        rigid = run_one(user, "1", args)
        if not args.json:
            print(f"rigid   ({option} 1):   {rigid['jct_s']:6.1f} s submit to completion, {rigid['state']}, "
                  f"world sizes {rigid['world_sizes']}", flush=True)
        elastic = run_one(user, wide, args)
    finally:
        clean_up(user)
    ratio = rigid["jct_s"] / elastic["jct_s"]
    if args.json:
        print(json.dumps({"blocker_s": args.blocker_s, "epochs": args.epochs, "rigid": rigid, "elastic": elastic,
                          "rigid_over_elastic": round(ratio, 2)}, indent=2))
        return
    print(f"elastic ({option} {wide}): {elastic['jct_s']:6.1f} s submit to completion, {elastic['state']}, "
          f"world sizes {elastic['world_sizes']}, at its largest from {elastic['grown_at_s']} s "
          f"(first blocker ended at {elastic['blocker_ended_s']} s)")
    print(f"T = {args.blocker_s:g} s, {args.epochs} epochs: elastic is {ratio:.2f}x faster than rigid "
          f"(floor 1.5x: {'met' if ratio >= 1.5 else 'NOT met'})")


if __name__ == "__main__":
    main()
