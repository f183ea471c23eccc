"""Resize latency on the live testbed: the agent's decision -> all ranks training at the new size.

    python benchmarks/resize_latency.py [--samples 5] [--throttle 0.05] [--within-node] [--in-process | --both]
                                        [--json]

One sample = one elastic job (`dlsub --nodes 1:2 --gpus-per-node 4`, on
`gpu`) that starts on one node while another job holds the other, then:

* grow: the holder is cancelled; the agent (tick 3 s) decides to grow and
  releases the held worker task; the worker starts, joins the rendezvous,
  torchrun stops the group (the training checkpoints) and re-forms it at
  world size 8, which restores and trains.
* shrink: a job that wants a whole GPU node is submitted; the agent decides
  to shrink and signals the worker; the group checkpoints, the worker leaves
  and the main node re-forms at world size 4, restores and trains.

Latency = the first progress event at the new world size (rank 0 reports
after a step; DDP's all-reduce means every rank did that step) minus the
time of the agent's grow/shrink decision (`dlsub why --json`). Each sample
also shows when the re-formed group started (its start event) and restored.
The job that made it shrink holds the node for the next sample, so every
grow releases a worker that has never run (a worker that has just left is
requeued, and Slurm keeps a requeued job from starting for cred_expire +
1 s: 11 s on the testbed, 121 s by default; a re-grow pays that on top).
Progress is reported
every step and a step sleeps --throttle s, so "first step" is measured to
within about one step. Prints every sample and the medians.

--in-process: the training re-forms in process (``train_digits.py
--regroup-in-process``, issue 52): a grow's worker processes join the
running ranks, which get no SIGTERM, save nothing and never restart; a
shrink's leave them. --both: every sample runs both ways, one job each,
with the restart first, so that the two are compared in one run on the
same machine state.

--within-node: the same within one node, by GPUs (``dlsub --gpus 3:4``, a
job elastic in GPUs): gpu2 is held throughout, the job starts on 3 GPUs of
gpu1 while a 1-GPU job holds the fourth; grow = that job is cancelled and a
1-GPU worker joins on gpu1 (world size 3 -> 4); shrink = another 1-GPU job
waits, the worker leaves (4 -> 3) and that job holds the GPU for the next
sample.

Runs as root (acts as the testbed user); needs the agent service (tick 3 s)
and an otherwise idle testbed. Takes about 1.5 min per sample.
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

from elastic_bench import (
    GPUS_PER_NODE,
    TRAIN,
    clean_up,
    decisions,
    events,
    first_after,
    gone,
    hold_node,
    now,
    scancel,
    stamp,
    submit,
    wait_testbed_quiet,
)

from livebed import USER, TestbedUser, slurm_job, slurm_jobs, wait_for

SMALL, LARGE = GPUS_PER_NODE, 2 * GPUS_PER_NODE  # world sizes on one node and on two


def resize(user: TestbedUser, job: dict[str, Any], kind: str, after: float, size: int) -> dict[str, Any]:
    """Wait for the agent's ``kind`` decision (made at or after ``after``) and the group training at ``size``."""
    made = wait_for(f"the agent's {kind} decision", lambda: [
        d for d in decisions(user, job["id"], kind) if float(d["time"]) >= after - 3.5], timeout=120, interval=0.5)
    decided = float(made[0]["time"])
    job_dir = job["job_dir"]
    trained = wait_for(f"training at world size {size}",
                       lambda: first_after(job_dir, "progress", decided, world_size=size), timeout=240, interval=0.5)
    started = first_after(job_dir, "start", decided, world_size=size)
    restored = first_after(job_dir, "restore", float(started["time"])) if started else None
    # The phases between (where the time goes): the old group's checkpoint and exit, and for a grow the worker
    # task's start in Slurm (whole seconds).
    checkpointed = first_after(job_dir, "checkpoint", decided)
    exited = first_after(job_dir, "exit_for_resume", decided)
    regrouped = first_after(job_dir, "regrouped", decided, world_size=size)
    if regrouped is not None:  # nothing was checkpointed for it (a later checkpoint is the epoch's)
        checkpointed = exited = None
    return {"asked": after, "decided": decided, "worker_started": _worker_started(job, decided) if kind == "grow"
            else None, "worker_launched": _worker_launched(job_dir, decided) if kind == "grow" else None,
            "checkpointed": float(checkpointed["time"]) if checkpointed else None,
            "exited": float(exited["time"]) if exited else None,
            "started": float(started["time"]) if started else None,
            "restored": float(restored["time"]) if restored else None, "trained": float(trained["time"]),
            "restored_step": restored.get("step") if restored else None,
            "regrouped": float(regrouped["time"]) if regrouped else None,
            "regroup_paused_s": regrouped.get("paused_s") if regrouped else None,
            "latency_s": round(float(trained["time"]) - decided, 2)}


def _worker_started(job: dict[str, Any], decided: float) -> float | None:
    """When Slurm started the worker task the grow released (its record's start time, whole seconds)."""
    array = job.get("worker_array_id")
    starts = [float(j["start_time"]) for j in slurm_jobs() if array and j.get("array_job_id") == array
              and float(j.get("start_time") or 0) >= int(decided)]
    return min(starts) if starts else None


def _worker_launched(job_dir: str, decided: float) -> float | None:
    """When the worker's batch launcher started (its start record in attempts.jsonl, written before its
    container starts): the decision to here is Slurm's part of a grow, from here on the container's, the
    interpreter's and the join's."""
    starts = [float(e["time"]) for e in events(job_dir, "start", file="attempts.jsonl")
              if e.get("role") == "worker" and float(e["time"]) >= decided]
    return min(starts) if starts else None


#: The phases each sample prints, in order: (label, the key of the time it ends at).
PHASES = (("asked -> decision", "decided"), ("worker started in Slurm", "worker_started"),
          ("worker's launcher started", "worker_launched"),
          ("old group checkpointed", "checkpointed"), ("old group exited", "exited"),
          ("re-formed in process", "regrouped"),
          ("new group started", "started"), ("restored", "restored"), ("first step", "trained"))


def phases(r: dict[str, Any]) -> str:
    """Each phase's end, seconds after the decision (the first: the decision after the cause)."""
    parts = [f"{label} {stamp(r['asked'] if key == 'decided' else r['decided'], r[key]).strip()}"
             for label, key in PHASES if r.get(key) is not None]
    return ", ".join(parts)


#: --within-node: world sizes before and after a grow, all on gpu1.
IN_NODE_SMALL, IN_NODE_LARGE = GPUS_PER_NODE - 1, GPUS_PER_NODE


def one_sample(user: TestbedUser, holder: int, args: argparse.Namespace,
               in_process: bool) -> tuple[dict[str, Any], int]:
    """Grow then shrink one elastic job; returns the figures and the job now holding a node (or a GPU)."""
    small, large = (IN_NODE_SMALL, IN_NODE_LARGE) if args.within_node else (SMALL, LARGE)
    shape = (("--gpus", f"{small}:{large}", "--cpus", "1", "--mem", "1G") if args.within_node
             else ("--nodes", "1:2", "--gpus-per-node", str(GPUS_PER_NODE)))
    export = ("--export", f"ALL,{args.export}") if args.export else ()
    job = submit(user, "-p", "gpu", "--time", "30", *shape, *export, TRAIN, "--epochs", "1000", "--throttle",
                 str(args.throttle), "--report-every", "1", *(("--regroup-in-process",) if in_process else ()))
    try:
        # Training at its small size with a checkpoint behind it, as a job that has run a while.
        wait_for(f"training at world size {small}", lambda: first_after(job["job_dir"], "progress", 0,
                                                                         world_size=small)
                 and first_after(job["job_dir"], "checkpoint", 0), timeout=240, interval=0.5)
        freed = now()
        scancel(holder)
        grow = resize(user, job, "grow", freed, large)
        # Another job wants the GPUs the worker holds: the agent gives them back.
        other = (hold_node(user, wait_running=False, name="wants-a-gpu", gpus=1, node="gpu1") if args.within_node
                 else hold_node(user, wait_running=False, name="wants-a-node"))
        asked = now()
        shrink = resize(user, job, "shrink", asked, small)
        wait_for("the waiting job to start", lambda: (slurm_job(other) or {}).get("job_state") == "RUNNING",
                 timeout=180, interval=0.5)
    finally:
        user.dlsub("cancel", job["id"], check=False)
        wait_for("the elastic job gone from Slurm", lambda: gone(job["slurm_job_id"], job.get("worker_array_id")),
                 timeout=120, interval=0.5)
    return {"id": job["id"], "in_process": in_process, "grow": grow, "shrink": shrink}, other


def _split(rows: list[dict[str, Any]]) -> str:
    """A grow's two parts, medians: Slurm's (the decision -> the worker's launcher started) and the worker's (its
    launcher -> the group re-formed in process, or the new group started)."""
    slurm, worker = [], []
    for r in (row["grow"] for row in rows):
        done = r["regrouped"] if r["regrouped"] is not None else r["started"]
        if r["worker_launched"] is not None and done is not None:
            slurm.append(r["worker_launched"] - r["decided"])
            worker.append(done - r["worker_launched"])
    if not slurm:
        return "(no worker start record: the split is unknown)"
    return (f"of which Slurm (decision -> the worker's launcher) {statistics.median(slurm):.1f} s "
            f"({min(slurm):.1f}-{max(slurm):.1f}), the worker (its launcher -> the group re-formed or started) "
            f"{statistics.median(worker):.1f} s ({min(worker):.1f}-{max(worker):.1f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--throttle", type=float, default=0.05, help="seconds each training step sleeps")
    parser.add_argument("--within-node", action="store_true",
                        help="grow and shrink by one GPU within gpu1 (dlsub --gpus 3:4), not by a whole node")
    parser.add_argument("--in-process", action="store_true",
                        help="the training re-forms in process where it can (train_digits.py --regroup-in-process): "
                             "its running ranks go on without a restart, a grow's new processes join them and a "
                             "shrink's leave (issue 52)")
    parser.add_argument("--both", action="store_true",
                        help="each sample both ways, with a restart and in process, side by side in one run")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--export", default="", metavar="NAME=value,...",
                        help="into the jobs' containers (dlsub --export), e.g. LOGLEVEL=INFO: torchrun's rendezvous "
                             "steps, timed, in the job's output")
    args = parser.parse_args()
    user = TestbedUser(USER)
    wait_testbed_quiet()
    rows = []
    try:
        if args.within_node:
            hold_node(user, node="gpu2")  # busy throughout: every grow is within gpu1
            holder = hold_node(user, gpus=1, node="gpu1")
        else:
            holder = hold_node(user)
        ways = (False, True) if args.both else (args.in_process,)
        for i in range(args.samples):
            for in_process in ways:
                row, holder = one_sample(user, holder, args, in_process)
                rows.append(row)
                if not args.json:
                    for kind in ("grow", "shrink"):
                        r = row[kind]
                        how = (f"re-formed in process, rank 0 stood still {r['regroup_paused_s']:.3f} s"
                               if r["regrouped"] is not None else f"restored at step {r['restored_step']}")
                        print(f"sample {i + 1} {kind:<6} decision -> first step at the new size "
                              f"{r['latency_s']:6.1f} s ({how}); s after the decision: {phases(r)}", flush=True)
    finally:
        clean_up(user)  # the last holder, and whatever a failure left
    small, large = (IN_NODE_SMALL, IN_NODE_LARGE) if args.within_node else (SMALL, LARGE)
    summary: dict[str, Any] = {"samples": rows, "within_node": args.within_node}
    for in_process in sorted({r["in_process"] for r in rows}):
        these = [r for r in rows if r["in_process"] == in_process]
        way = "in process" if in_process else "with a restart"
        for kind, size in (("grow", large), ("shrink", small)):
            figures = [r[kind]["latency_s"] for r in these]
            paused = [r[kind]["regroup_paused_s"] for r in these if r[kind]["regroup_paused_s"] is not None]
            summary[f"median_{kind}_{'in_process' if in_process else 'restart'}_s"] = statistics.median(figures)
            if not args.json:
                stood = (f"; rank 0 stood still {statistics.median(paused):.3f} s ({min(paused):.3f}-"
                         f"{max(paused):.3f})" if paused else "")
                print(f"{way:<14} {kind:<6} median over {len(these)}: {statistics.median(figures):.1f} s (range "
                      f"{min(figures):.1f}-{max(figures):.1f}; decision -> world size {size} training){stood}")
                if kind == "grow":
                    print(f"{'':<14} {kind:<6} {_split(these)}")
    if args.json:
        print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
