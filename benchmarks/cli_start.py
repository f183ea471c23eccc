"""How long a `dlsub` command takes a user on a login node: wall time and CPU, against its floor.

    python benchmarks/cli_start.py [--samples 9] [--json]

Each sample runs, as the testbed user on the host it runs on (the login host: ``bash testbed/on.sh login1``):

* ``floor``: Python starting and exiting, plus the ``squeue --json`` one job's status needs (Slurm's part,
  which dlsub cannot shorten);
* ``status``: ``dlsub status JOB --json`` of the user's newest job (every look a researcher or a script takes;
  the live tests poll it every second);
* ``help``: ``dlsub --help`` (every command listed, so every command's module imported).

and prints the median and range of each (wall seconds; user + system CPU seconds of the process and its
children) and status's ratio to the floor. Needs a testbed brought up by `make testbed` with one dlsub job of
the user in its store (any earlier test's or demo's). Run as root.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testbed"))

from livebed import USER, TestbedUser


def timed(argv: list[str]) -> tuple[float, float]:
    """(wall s, CPU s of the command and its children) of ``argv``, which must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.monotonic()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
    wall = time.monotonic() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=9)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--user", default=USER,
                        help="whose commands: the testbed user (its home on the machine's disk), or the directory "
                             "user dlldap (its home on the testbed's sshfs, its store under dot-file locking)")
    args = parser.parse_args()
    user = TestbedUser(args.user)
    jobs = json.loads(user.dlsub("status", "--all", "--json").stdout)
    if not jobs:
        raise SystemExit(f"cli_start: {user.name} has no dlsub job yet: run `make demo` or a test first")
    newest = max(jobs, key=lambda j: j["submitted_at"])
    as_user = ["runuser", "-u", user.name, "--", "env", "-i", "-C", str(user.home),
               *(f"{k}={v}" for k, v in user.env.items())]
    slurm_id = str(newest["slurm_job_id"])
    commands = {
        "floor": [*as_user, "sh", "-c", f'python3 -c pass && squeue --json --states=all --jobs "{slurm_id}"'],
        "status": [*as_user, "dlsub", "status", newest["id"], "--json"],
        "help": [*as_user, "dlsub", "--help"],
    }
    rows: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    for _ in range(args.samples):
        for name, argv in commands.items():  # in turn, so that the machine's load falls on each alike
            rows[name].append(timed(argv))
    medians = {name: (statistics.median(w for w, _ in r), statistics.median(c for _, c in r))
               for name, r in rows.items()}
    if args.json:
        print(json.dumps({"samples": rows, "medians": medians, "cpus": os.cpu_count()}))
        return
    for name, r in rows.items():
        walls, cpus = [w for w, _ in r], [c for _, c in r]
        print(f"{name:<7} wall {medians[name][0]:5.2f} s [{min(walls):.2f}, {max(walls):.2f}]   "
              f"CPU {medians[name][1]:5.2f} s [{min(cpus):.2f}, {max(cpus):.2f}]")
    print(f"status / floor: wall {medians['status'][0] / medians['floor'][0]:.2f}, "
          f"CPU {medians['status'][1] / medians['floor'][1]:.2f} ({args.samples} samples, {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
