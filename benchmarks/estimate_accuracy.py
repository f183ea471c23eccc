"""How close `dlsub estimate` comes to real runs, and what the estimate itself costs in time.

    python benchmarks/estimate_accuracy.py [--batch-sizes 32,128,512] [--epochs 10] [--partition cpu]

Runs (as the testbed user, on the live testbed) a cold `dlsub estimate
--no-cache` of examples/train_digits.py, the same estimate again (cached),
then the example for real at each batch size on one partition, one at a
time, and prints predicted vs measured walltime (the Slurm attempt, start
to end: container start, imports, data, steps, teardown) and peak memory
(the training process's resident set, as the library reports it), with the
error in percent. Runs as root (acts as the testbed user); take the testbed
lock first (`flock /tmp/dlsub-testbed.lock python3 ...`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testbed"))

from livebed import EXAMPLES, USER, TestbedUser, timed_run


def real_run(user: TestbedUser, workdir: Path, partition: str, batch_size: int, epochs: int) -> tuple[float, float]:
    return timed_run(user, workdir, "-p", partition, "examples/train_digits.py", "--epochs", str(epochs),
                     "--batch-size", str(batch_size), timeout=1800)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", default="32,128,512")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--partition", default="cpu")
    args = parser.parse_args()
    user = TestbedUser(USER)
    # In the user's home, shared with the nodes (the login host's /tmp is its own).
    workdir = Path(tempfile.mkdtemp(prefix="dlsub-it-", dir=user.home))
    try:
        shutil.copytree(EXAMPLES, workdir / "examples")
        subprocess.run(["chown", "-R", f"{user.uid}:{user.gid}", str(workdir)], check=True)
        workdir.chmod(0o755)
        # One at a time: the testbed's nodes all share this machine's cores, so profiles of partitions with no
        # node in common, which run at once by default (as on a site, where they share nothing), would measure
        # each other here.
        argv = ["estimate", "--batch-sizes", args.batch_sizes, "--epochs", str(args.epochs), "--one-at-a-time",
                "--json"]
        began = time.monotonic()
        est = json.loads(user.dlsub(*argv, "--no-cache", "examples/train_digits.py", cwd=workdir).stdout)
        cold = time.monotonic() - began
        began = time.monotonic()
        user.dlsub(*argv, "examples/train_digits.py", cwd=workdir)
        cached = time.monotonic() - began
        print(f"estimate time: cold {cold:.1f} s ({est['profiled_now']} profiling jobs, one at a time), "
              f"cached {cached:.2f} s")
        print(f"{'batch':>6} {'pred wall s':>12} {'meas wall s':>12} {'err':>6} "
              f"{'pred MB':>8} {'meas MB':>8} {'err':>6}")
        for bs in (int(x) for x in args.batch_sizes.split(",")):
            row = next(r for r in est["rows"] if r["partition"] == args.partition and r["batch_size"] == bs)
            wall, peak = real_run(user, workdir, args.partition, bs, args.epochs)
            print(f"{bs:>6} {row['walltime_s']:>12.1f} {wall:>12.1f} {(row['walltime_s'] - wall) / wall:>+6.0%} "
                  f"{row['memory_mb']:>8.0f} {peak:>8.0f} {(row['memory_mb'] - peak) / peak:>+6.0%}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
