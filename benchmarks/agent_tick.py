"""Benchmark: one agent tick on a big cluster, through the fake Slurm (no live cluster needed).

Feeds the agent a ``squeue --json`` of 10,000 jobs, 1,000 of them dlsub's
(each with a submit record and a real job directory in a temp dir holding
a progress file and an attempt file), and prints the cold tick (empty
agent database, every file read from its start) and the warm tick (what
was appended since: one new report in a tenth of the jobs), then the
baseline: the same tick over 10,000 jobs none of which is dlsub's. The
floor is a tick under 1 s.

    python benchmarks/agent_tick.py [--jobs 10000] [--dlsub 1000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlsub.agent.agent_store import AgentStore
from dlsub.agent.reconcile import Agent
from dlsub.site_config.policy_file import parse_policy
from dlsub.slurm_plugins.client import SlurmClient
from dlsub.slurm_plugins.fake import FakeSlurm, testbed_cluster

NOW = 1_800_000_000.0
POLICY = parse_policy({
    "policy": "fifo", "partitions": {"gpu": {"role": "gpu"}, "gpu-dev": {"role": "dev"},
                                     "cpu": {"role": "cpu", "speed": 0.1}},
    "tick_deadline_s": 60.0,
})


def _record(job_id: int, uid: int, user: str, *, state: str, partition: str, gres: str = "",
            comment: str = "", admin_comment: str = "", out: str = "/dev/null") -> dict[str, Any]:
    return {
        "job_id": job_id, "name": f"job{job_id}", "user_name": user, "user_id": uid, "job_state": state,
        "partition": partition, "nodes": "cpu1" if state == "RUNNING" else "", "node_count": 1,
        "comment": comment, "admin_comment": admin_comment, "restart_cnt": 0,
        "state_reason": "None" if state == "RUNNING" else "Resources", "standard_output": out,
        "time_limit": 60, "start_time": int(NOW - 600), "submit_time": int(NOW - 900 + job_id % 300),
        "end_time": int(NOW + 3000), "exit_code": 0, "tres_per_node": gres,
    }


def cluster(root: Path, jobs: int, dlsub: int) -> FakeSlurm:
    fake = testbed_cluster()
    for node in ("gpu1", "gpu2"):
        fake.nodes[node].gpus_used = 4  # every GPU busy: the tick observes and decides, nothing moves
    me = os.getuid()
    records = []
    for n in range(jobs):
        job_id = 100_000 + n
        if n < dlsub:
            dlsub_id = f"{n:08x}"
            job_dir = root / "jobs" / dlsub_id
            job_dir.mkdir(parents=True)
            attempt = f"{job_id}-0"
            events = [{"event": "start", "time": NOW - 600, "attempt": attempt}]
            events += [{"event": "progress", "time": NOW - 600 + 10 * i, "step": i, "loss": 1.0 / (i + 1),
                        "samples": 32 * i, "total_steps": 10_000, "attempt": attempt} for i in range(50)]
            events.append({"event": "checkpoint", "time": NOW - 100, "step": 40, "seq": 40, "attempt": attempt})
            (job_dir / "progress.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
            (job_dir / "attempts.jsonl").write_text(json.dumps(
                {"event": "start", "time": NOW - 600, "slurm_job_id": job_id, "restart": 0, "node": "cpu1",
                 "partition": "cpu"}) + "\n")
            comment = f"dlsub:{dlsub_id};mode=immediate;ideal=gpu;gpus=1"
            records.append(_record(job_id, me, "alice", state="RUNNING", partition="cpu", comment=comment,
                                   admin_comment=f"dlsub-submit:v1;uid={me};partition=cpu;time=60;tres=|{comment}",
                                   out=f"{job_dir}/slurm-%j.out"))
        else:
            uid = 2000 + n % 500
            running = n % 3 != 0
            records.append(_record(job_id, uid, f"user{uid}", state="RUNNING" if running else "PENDING",
                                   partition="gpu" if n % 4 == 0 else "cpu",
                                   gres="gres:gpu:1" if n % 4 == 0 else "", comment="a plain sbatch job"))
    fake.add_raw_jobs(records)
    return fake


def time_ticks(root: Path, jobs: int, dlsub: int, repeat: int) -> tuple[float, float, Agent]:
    colds, warms = [], []
    agent = None
    for r in range(repeat):
        work = root / f"run{r}"
        work.mkdir(parents=True)
        fake = cluster(work, jobs, dlsub)
        agent = Agent(SlurmClient(runner=fake), AgentStore(work / "agent.db"), POLICY)
        started = time.perf_counter()
        agent.tick(NOW)
        colds.append(time.perf_counter() - started)
        for n in range(0, dlsub, 10):
            with open(work / "jobs" / f"{n:08x}" / "progress.jsonl", "a") as f:
                f.write(json.dumps({"event": "progress", "time": NOW + 1, "step": 51, "total_steps": 10_000,
                                    "attempt": f"{100_000 + n}-0"}) + "\n")
        started = time.perf_counter()
        agent.tick(NOW + 30)
        warms.append(time.perf_counter() - started)
    assert agent is not None
    return statistics.median(colds), statistics.median(warms), agent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--dlsub", type=int, default=1_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cold, warm, agent = time_ticks(Path(tmp) / "mixed", args.jobs, args.dlsub, args.repeat)
        meta = agent.store.meta()
        print(f"agent tick, {args.jobs:,} jobs ({args.dlsub:,} dlsub): cold {cold:.3f} s, warm {warm:.3f} s "
              f"(median of {args.repeat}; observed {meta['jobs']} dlsub jobs, late={meta['late']}, "
              f"skipped={meta['skipped']}; floor: under 1 s)")
        cold0, warm0, _ = time_ticks(Path(tmp) / "baseline", args.jobs, 0, args.repeat)
        print(f"baseline, {args.jobs:,} non-dlsub jobs: cold {cold0:.3f} s, warm {warm0:.3f} s")
        if max(cold, warm) >= 1.0:
            sys.exit(f"agent tick took {max(cold, warm):.3f} s, over the 1 s floor")


if __name__ == "__main__":
    main()
