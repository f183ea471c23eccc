"""Benchmark: what the agent's reads cost on the live Slurm with thousands of jobs in the queue.

As root, on a testbed that is up (`make testbed SLURM=V`), with nothing else running on it. It
submits N held jobs (plain `sbatch --hold`, as root: they never start), then measures, on the Slurm
version that is up, each call one agent tick makes (its argv, the bytes it prints, the median of
three runs): the JSON of every job the agent read before, the brief lines it reads now, the whole
records of the few hundred it reads at once; then one agent's ticks one after another (as the
agent's account, over a database of its own: the first ticks read the unseen jobs whole, a few
hundred a tick, the later ones only the brief lines), and cancels the jobs it submitted. Figures
per version: run it once per `SLURM=`.

    sudo python benchmarks/slurm_reads_at_scale.py [--jobs 10000] [--repeat 3]

Slurm's default MaxJobCount is 10,000; the testbed's slurm.conf allows 20,000.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dlsub.slurm_plugins.client import SlurmClient
from dlsub.slurm_plugins.dialects import QUEUE_FORMAT
from dlsub.slurm_plugins.queue_reader import FIRST_READS
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


#: Run as the agent's account: one Agent (as the daemon keeps one) over a database of its own, ticking
#: until it has read every queued job whole once (a few hundred a tick), then ``steady`` more; prints
#: each tick's seconds and what it had left unread, as JSON.
_TICKS = """
import json, sys, tempfile, time
from pathlib import Path
from dlsub.agent.agent_store import AgentStore
from dlsub.site_config.policy_file import load_policy
from dlsub.agent.reconcile import Agent
from dlsub.slurm_plugins.client import SlurmClient
with tempfile.TemporaryDirectory(dir="/var/lib/dlsub") as tmp:
    agent = Agent(SlurmClient(), AgentStore(Path(tmp) / "bench.db"), load_policy(None))
    ticks, steady = [], int(sys.argv[1])
    while steady and len(ticks) < 200:
        start = time.perf_counter()
        agent.tick()
        unread = agent._queue.unseen
        ticks.append([time.perf_counter() - start, unread])
        steady -= unread == 0
    print(json.dumps(ticks))
"""


def agent_ticks(steady: int) -> list[tuple[float, int]]:
    """Each tick's seconds and the jobs it left unread, until ``steady`` ticks had none left."""
    out = subprocess.run(["runuser", "-u", AGENT_USER, "--", f"{sys.prefix}/bin/python", "-c", _TICKS, str(steady)],
                         capture_output=True, text=True, check=True, timeout=1200, cwd="/")
    return [(float(t), int(u)) for t, u in json.loads(out.stdout.strip().splitlines()[-1])]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steady", type=int, default=5, help="ticks measured after every job was read whole once")
    args = parser.parse_args()
    client = SlurmClient()
    dialect = client.dialect()
    start_ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 3600))
    leftover = [j for j in client.queue() if j.job_id and j.state != "PENDING"]
    if len(leftover) + args.jobs > 20_000:
        # Ended jobs count against MaxJobCount until slurmctld forgets them (MinJobAge, and only once
        # slurmdbd has their records): an earlier run's 10,000 take a quarter of an hour.
        print(f"waiting for slurmctld to forget {len(leftover)} ended jobs (MinJobAge)", flush=True)
        while len(client.queue()) + args.jobs > 20_000:
            time.sleep(10)
    print(f"Slurm {client.version()}: submitting {args.jobs} held jobs", flush=True)
    t0 = time.perf_counter()
    try:
        submit_held(args.jobs)
        print(f"submitted in {time.perf_counter() - t0:.0f} s", flush=True)
        queued = client.queue()
        newest = sorted((j.job_id for j in queued), reverse=True)[:FIRST_READS]
        print(f"{len(queued)} jobs in squeue\n")
        calls = {
            "every job, JSON (before)": ["squeue", "--json", *dialect.all_states],
            "every job, brief (now)": ["squeue", "--noheader", "--states=all", f"--format={QUEUE_FORMAT}"],
            f"{FIRST_READS} jobs whole": ["squeue", "--json", *dialect.all_states, "--jobs",
                                          ",".join(map(str, newest))],
            "nodes": list(dialect.nodes_argv),
            "partitions": ["scontrol", "show", "partition", "--oneliner"],
            "usage (once a minute)": ["sacct", "-n", "-P", "-X", "-D", "-S", start_ts, "-E", "now", "-a",
                                      f"--format={SACCT_FORMAT}"],
        }
        print(f"{'call':26} {'bytes':>12} {'seconds':>8}")
        for name, argv in calls.items():
            size, seconds = measure(argv, args.repeat)
            print(f"{name:26} {size:12,d} {seconds:8.2f}")
        ticks = agent_ticks(args.steady)
        first = [t for t, unread in ticks if unread] or [ticks[0][0]]
        steady = [t for t, unread in ticks if not unread]
        print(f"\nagent ticks: {len(first)} reading unseen jobs whole ({FIRST_READS} a tick): median "
              f"{statistics.median(first):.2f} s, slowest {max(first):.2f} s; then {len(steady)} with every "
              f"job seen: median {statistics.median(steady):.2f} s, slowest {max(steady):.2f} s")
    finally:
        subprocess.run(["scancel", "--name", NAME], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
