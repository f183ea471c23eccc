#!/usr/bin/env python3
"""Record what the live testbed's Slurm prints, for the parsers' unit tests.

Run as root on a testbed that is up (`make testbed SLURM=V`), with nothing
else running on it. It submits small plain Slurm jobs as the job user (no
dlsub), brings each into one state worth parsing, then takes one snapshot of
every command dlsub reads, and writes it under
``tests/fixtures/slurm/<version>/``:

- ``commands/<name>.out``: stdout of each command (argv in ``manifest.json``);
- ``manifest.json``: the Slurm version, the argv of each command, and per case
  the job ids and what is known about them *from how they were made* (state,
  exit code, nodes, array task, hold), which the tests check the parsers against.

The states: pending, running, held by its user and by an admin, requeued
held after exit 85 (as dlsub's batch script does for a move), an array with a
pending held, a running and an ended task, a hetjob, a 2-node gang,
completed, failed, cancelled, timeout and node failure (cpu2's slurmd is
stopped, then restarted and the node resumed).

Stdlib only: it runs before dlsub is installed, under any python3.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

#: name -> argv: what dlsub (and its tests) read from Slurm.
COMMANDS: dict[str, list[str]] = {
    "version": ["scontrol", "--version"],
    "squeue_json": ["squeue", "--json"],
    "squeue_all_json": ["squeue", "--all", "--json"],
    "squeue_states_all_json": ["squeue", "--json", "--states=all"],
    "sinfo_json": ["sinfo", "--json"],
    "nodes_json": ["scontrol", "show", "nodes", "--json"],
    "partitions_text": ["scontrol", "show", "partition", "--oneliner"],
    "jobs_text": ["scontrol", "show", "job", "--oneliner"],
    "jobs_json": ["scontrol", "show", "job", "--json"],
    "sacct_text": ["sacct", "-X", "-n", "-P", "-a", "--format=JobIDRaw,JobName,User,State,Partition,NodeList,"
                   "ExitCode,Comment"],
    "sacct_json": ["sacct", "-X", "-a", "--json"],
    "config_text": ["scontrol", "show", "config"],
}


def run(argv: Sequence[str], *, user: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    full = ["runuser", "-u", user, "--", *argv] if user else list(argv)
    result = subprocess.run(full, capture_output=True, text=True, timeout=60, check=False)
    if check and result.returncode != 0:
        raise SystemExit(f"record_slurm: {' '.join(full)} exited {result.returncode}: {result.stderr.strip()}")
    return result


def sbatch(user: str, script: str, *args: str) -> int:
    """Submit a batch script (text) as ``user``; the job id."""
    with tempfile.NamedTemporaryFile("w", suffix=".sh", dir="/tmp", delete=False) as f:
        f.write(script)
    os.chmod(f.name, 0o755)
    try:
        out = run(["sbatch", "--parsable", "-o", "/dev/null", "-e", "/dev/null", *args, f.name], user=user).stdout
    finally:
        os.unlink(f.name)
    return int(out.strip().split(";")[0])


def job_record(job: str) -> dict[str, str]:
    """``scontrol show job -o`` of one job (or array task ``N_T``) as a dict; {} when Slurm has forgotten it."""
    result = run(["scontrol", "show", "job", "-o", job], check=False)
    line = result.stdout.splitlines()[0] if result.returncode == 0 and result.stdout else ""
    return dict(m.groups() for m in re.finditer(r"(\w+)=(\S*)", line))


def wait_for(what: str, test: Callable[[], bool], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if test():
            return
        time.sleep(0.5)
    raise SystemExit(f"record_slurm: timed out waiting for {what}")


def state_is(job: str, *states: str, reason: str | None = None) -> Callable[[], bool]:
    def test() -> bool:
        rec = job_record(job)
        return rec.get("JobState") in states and (reason is None or rec.get("Reason") == reason)
    return test


SLEEP = "#!/bin/bash\nsleep 600\n"
SMALL = ("-c", "1", "--mem=100")


def make_cases(user: str) -> dict[str, dict[str, Any]]:
    """Submit every case; return its job ids and the facts known from how it was made."""
    cases: dict[str, dict[str, Any]] = {}
    later = "now+3600"  # far enough that it stays pending while the snapshot is taken

    j = sbatch(user, "#!/bin/bash\ntrue\n", "-p", "cpu", *SMALL, f"--begin={later}", "-J", "rec-pending")
    cases["pending"] = {"job_id": j, "state": "PENDING", "reason": "BeginTime", "partition": "cpu"}

    j = sbatch(user, SLEEP, "-p", "cpu", *SMALL, "-J", "rec-running", "--comment", "dlsub:rec running; quoted 'x'")
    cases["running"] = {"job_id": j, "state": "RUNNING", "partition": "cpu", "node_count": 1,
                        "comment": "dlsub:rec running; quoted 'x'"}

    j = sbatch(user, SLEEP, "-p", "cpu", *SMALL, "--hold", "-J", "rec-held-user")
    cases["held_user"] = {"job_id": j, "state": "PENDING", "reason": "JobHeldUser", "held": True}

    j = sbatch(user, SLEEP, "-p", "cpu", *SMALL, f"--begin={later}", "-J", "rec-held-admin")
    run(["scontrol", "hold", str(j)])
    cases["held_admin"] = {"job_id": j, "state": "PENDING", "reason": "JobHeldAdmin", "held": True}

    # As batch.sh does for a move: the training exits 85 (checkpointed), the
    # batch shell requeues itself held for the agent.
    j = sbatch(user, "#!/bin/bash\nbash -c 'exit 85'; rc=$?\n"
               "[ \"$rc\" -eq 85 ] && scontrol requeuehold \"$SLURM_JOB_ID\" && exit 0\nexit \"$rc\"\n",
               "-p", "cpu", *SMALL, "-J", "rec-requeued-held")
    # Its reason is the version's own (22.05: job_requeued_in_held_state).
    cases["requeued_held"] = {"job_id": j, "state": "PENDING", "held": True, "restart_count": 1}

    j = sbatch(user, SLEEP, "-p", "gpu", "-N", "2", "--gres=gpu:1", *SMALL, "-J", "rec-gang")
    cases["gang"] = {"job_id": j, "state": "RUNNING", "partition": "gpu", "node_count": 2, "gpus_per_node": 1,
                     "nodes": ["gpu1", "gpu2"]}

    j = sbatch(user, "#!/bin/bash\n#SBATCH -p cpu -c 1 --mem=100\n#SBATCH hetjob\n"
               "#SBATCH -p gpu -c 1 --mem=100 --gres=gpu:1\nsleep 600\n", "-J", "rec-hetjob")
    cases["hetjob"] = {"job_id": j, "state": "RUNNING", "het_components": 2}

    # An array whose task 0 ends, task 1 runs and task 2 stays held.
    array = sbatch(user, "#!/bin/bash\n[ \"$SLURM_ARRAY_TASK_ID\" -eq 0 ] && exit 0\nsleep 600\n",
                   "-p", "cpu", *SMALL, "--array=0-2", "--hold", "-J", "rec-array")
    cases["array"] = {"job_id": array, "tasks": {"0": "COMPLETED", "1": "RUNNING", "2": "PENDING"},
                      "held_task": "2"}

    j = sbatch(user, "#!/bin/bash\ntrue\n", "-p", "cpu", *SMALL, "-J", "rec-completed")
    cases["completed"] = {"job_id": j, "state": "COMPLETED", "exit_code": 0}
    j = sbatch(user, "#!/bin/bash\nexit 3\n", "-p", "cpu", *SMALL, "-J", "rec-failed")
    cases["failed"] = {"job_id": j, "state": "FAILED", "exit_code": 3}
    j = sbatch(user, SLEEP, "-p", "cpu", *SMALL, "-J", "rec-cancelled")
    cases["cancelled"] = {"job_id": j, "state": "CANCELLED"}
    j = sbatch(user, SLEEP, "-p", "cpu", *SMALL, "--time=1", "-J", "rec-timeout")
    cases["timeout"] = {"job_id": j, "state": "TIMEOUT"}
    j = sbatch(user, SLEEP, "-p", "cpu", *SMALL, "-w", "cpu2", "--no-requeue", "-J", "rec-node-fail")
    cases["node_fail"] = {"job_id": j, "state": "NODE_FAIL", "nodes": ["cpu2"]}
    return cases


def drive(cases: dict[str, dict[str, Any]]) -> None:
    """Bring every case into its state (array release, cancel, node failure)."""
    def jid(name: str) -> str:
        return str(cases[name]["job_id"])

    for name in ("running", "gang", "hetjob", "cancelled", "timeout", "node_fail"):
        wait_for(f"{name} to run", state_is(jid(name), "RUNNING"))
    wait_for("requeued_held", lambda: job_record(jid("requeued_held")).get("Restarts") == "1"
             and job_record(jid("requeued_held")).get("JobState") == "PENDING")
    run(["scancel", jid("cancelled")])
    array = jid("array")
    run(["scontrol", "release", f"{array}_0"])
    wait_for("array task 0 to end", state_is(f"{array}_0", "COMPLETED"))
    run(["scontrol", "release", f"{array}_1"])
    wait_for("array task 1 to run", state_is(f"{array}_1", "RUNNING"))
    for name in ("completed", "failed", "cancelled"):
        wait_for(f"{name} to end", state_is(jid(name), cases[name]["state"]))
    # Node failure: cpu2's slurmd goes away; the job on it ends NODE_FAIL.
    subprocess.run(["bash", str(REPO / "testbed" / "node.sh"), "stop", "cpu2"], check=True)
    wait_for("node_fail", state_is(jid("node_fail"), "NODE_FAIL"), timeout=240)
    wait_for("timeout", state_is(jid("timeout"), "TIMEOUT"), timeout=240)


def snapshot(out: Path) -> dict[str, Any]:
    commands = out / "commands"
    commands.mkdir(parents=True, exist_ok=True)
    taken: dict[str, Any] = {}
    for name, argv in COMMANDS.items():
        result = run(argv, check=False)
        suffix = "json" if name.endswith("_json") else "txt"
        (commands / f"{name}.{suffix}").write_text(result.stdout, encoding="utf-8")
        taken[name] = {"argv": argv, "rc": result.returncode, "file": f"commands/{name}.{suffix}"}
    return taken


def leftover_stepds(job_id: int) -> list[int]:
    """slurmstepd processes still serving a job its node lost (slurmd was stopped under them)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if cmdline.startswith(f"slurmstepd: [{job_id}."):
            found.append(int(proc.name))
    return found


def restore_cpu2(failed_job: int) -> None:
    subprocess.run(["bash", str(REPO / "testbed" / "node.sh"), "start", "cpu2"], check=False)
    # The failed job's step outlived its slurmd: it is ours to end.
    for pid in leftover_stepds(failed_job):
        try:
            os.killpg(os.getpgid(pid), 9)
        except OSError:
            pass
    wait_for("cpu2 to register", lambda: "cpu2" in run(["sinfo", "-h", "-N", "-o", "%N %t"]).stdout)
    run(["scontrol", "update", "nodename=cpu2", "state=resume"], check=False)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--user", default=os.environ.get("DLSUB_TESTBED_USER", "dltest"))
    parser.add_argument("--out", type=Path, help="default: tests/fixtures/slurm/<major.minor>")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("record_slurm: run as root on the testbed (it stops and restarts cpu2's slurmd)")
    release = run(["scontrol", "--version"]).stdout.split()[-1]
    version = ".".join(release.split(".")[:2])
    out = args.out or REPO / "tests" / "fixtures" / "slurm" / version
    cases = make_cases(args.user)
    try:
        drive(cases)
        taken = snapshot(out)
    finally:
        restore_cpu2(int(cases["node_fail"]["job_id"]))
        ids = [str(c["job_id"]) for c in cases.values()]
        run(["scancel", *ids], check=False)
    manifest = {"slurm_release": release, "slurm_version": version, "user": args.user,
                "commands": taken, "cases": cases}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"record_slurm: Slurm {release}: {len(cases)} cases, {len(taken)} commands in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
