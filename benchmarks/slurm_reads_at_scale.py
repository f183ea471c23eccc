"""Benchmark: what the agent's reads cost on the live Slurm with thousands of jobs in the queue.

As root, on a testbed that is up (`make testbed SLURM=V`), with nothing else running on it. It
submits N held jobs (plain `sbatch --hold`, as root: they never start), then measures, on the Slurm
version that is up, each call one agent tick makes (its argv, the bytes it prints, the median of
three runs) and the whole tick (`dlsub agent tick` as the agent's account, over a database of its
own), and cancels the jobs it submitted. Figures per version: run it once per `SLURM=`.

    sudo python benchmarks/slurm_reads_at_scale.py [--jobs 10000] [--repeat 3]

Slurm's default MaxJobCount is 10,000; the testbed's slurm.conf allows 20,000.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dlsub.slurm_plugins.client import SlurmClient
from dlsub.slurm_plugins.usage import SACCT_FORMAT

NAME = "dlsub-bench-held"
AGENT_USER = os.environ.get("DLSUB_AGENT_USER", "dlsub")  # the testbed's service account


def submit_held(count: int) -> None:
    """``count`` held one-CPU jobs, a few sbatch at a time (slurmctld takes them one RPC each)."""
    with tempfile.TemporaryDirectory(prefix="dlsub-bench-") as tmp:
        script = Path(tmp) / "held.sh"
        script.write_text("#!/bin/sh\ntrue\n")

        def one(_: int) -> None:
            subprocess.run(["sbatch", "--hold", "-p", "cpu", "-J", NAME, "-o", "/dev/null", "--mem=10",
                            str(script)], capture_output=True, check=True)

        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(one, range(count)))


def measure(argv: list[str], repeat: int) -> tuple[int, float]:
    """Bytes on stdout and median seconds of ``repeat`` runs."""
    times, size = [], 0
    for _ in range(repeat):
        start = time.perf_counter()
        result = subprocess.run(argv, capture_output=True, check=True)
        times.append(time.perf_counter() - start)
        size = len(result.stdout)
    return size, statistics.median(times)


def tick_seconds(repeat: int) -> float:
    times = []
    for i in range(repeat):
        db = Path(f"/var/lib/dlsub/bench-{i}-{time.monotonic_ns()}.db")
        start = time.perf_counter()
        subprocess.run(["runuser", "-u", AGENT_USER, "--", "dlsub", "agent", "tick", "--db", str(db), "--json"],
                       capture_output=True, check=True, timeout=600)
        times.append(time.perf_counter() - start)
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    client = SlurmClient()
    dialect = client.dialect()
    start_ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 3600))
    calls = {
        "jobs": ["squeue", "--json", *dialect.all_states],
        "nodes": list(dialect.nodes_argv),
        "partitions": ["scontrol", "show", "partition", "--oneliner"],
        "usage (once a minute)": ["sacct", "-n", "-P", "-X", "-D", "-S", start_ts, "-E", "now", "-a",
                                  f"--format={SACCT_FORMAT}"],
    }
    print(f"Slurm {client.version()}: submitting {args.jobs} held jobs", flush=True)
    t0 = time.perf_counter()
    try:
        submit_held(args.jobs)
        print(f"submitted in {time.perf_counter() - t0:.0f} s", flush=True)
        queued = len(client.jobs())
        print(f"{queued} jobs in squeue\n")
        print(f"{'call':24} {'argv':60} {'bytes':>12} {'seconds':>8}")
        for name, argv in calls.items():
            size, seconds = measure(argv, args.repeat)
            print(f"{name:24} {' '.join(argv)[:60]:60} {size:12,d} {seconds:8.2f}")
        print(f"{'whole tick':24} {'dlsub agent tick (the agent account, fresh db)':60} {'':>12} "
              f"{tick_seconds(args.repeat):8.2f}")
    finally:
        subprocess.run(["scancel", "--name", NAME], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
