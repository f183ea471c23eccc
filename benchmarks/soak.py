"""A soak of several faults at once, jobs of two users (issue 53): each run must end with every job intact.

    python benchmarks/soak.py [--runs 5] [--seed 0] [--pair] [--json]

Runs as root on the testbed's login host, with the agent service running and an
otherwise idle testbed (its policy file as `make testbed` installs it):

    bash testbed/on.sh login1 /opt/dlsub/venv/bin/python benchmarks/soak.py --runs 5

One run:

* dltest2 (user B) holds every GPU with two plain jobs. dltest (A) submits an
  immediate-mode job that wants a GPU (it starts on cpu), a job on cpu and a
  job elastic in GPUs (1 to 2, waiting); B submits a job on cpu and one elastic
  in GPUs. All are `examples/train_digits.py`, 1 CPU, 1 GB.
* Once the three cpu jobs have checkpointed, the faults, at times drawn from
  the run's seed, most of them overlapping: the node of A's cpu job is lost
  (its slurmd killed, or its link cut: drawn), B's blockers are cancelled (so
  the immediate-mode job's move to gpu starts, and the elastic jobs start and
  grow), the agent is killed (-9) and started again twice, the primary
  slurmctld is killed and started again (the backup takes control in between),
  and the lost node is brought back once Slurm has marked it down.
* With ``--pair``, the agent is a pair (issue 53: login1 and login2 over one
  database, ``[failover] shared_state``), login2's agent active at each run's
  start, and its two faults are the pair's: login2 lost (its agent frozen, its
  link cut) and back 25-40 s later (the agent woken, to be refused and stand
  by), then the agent that holds the lease then killed (-9) and started again.
* Then every job must complete intact: `dlsub status` COMPLETED; its last
  attempt done at the whole of its steps; each restore from the newest
  checkpoint written before that attempt began (no step lost); nothing written
  by an attempt after a newer one began (fenced); at most one move, cpu to
  gpu, and never back; and no process or container of it left on any node.

Prints each run's faults, each job's attempts, the steps redone after each
restore (the work a fault cost it), and the minutes to completion; exits 1 if
any run failed. A run takes about 5 minutes; `kill PID` stops the soak, the run
in progress putting back what it holds first.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testbed"))

from livebed import (
    BACKUP_HEAD,
    EXAMPLES,
    PAIR_DB,
    PRIMARY_HEAD,
    TestbedUser,
    agent_pair,
    agent_service,
    attempts,
    blockers,
    controllers,
    job_output,
    kill_slurmctld,
    kill_slurmd,
    login2_back,
    lose_login2,
    node_back,
    pair_lease,
    processes_of_job,
    progress_events,
    set_link,
    slurm_job,
    slurmctld_back,
    slurmd_pidfile,
    wait_for,
)

TRAIN = str(EXAMPLES / "train_digits.py")
SMALL = ("--cpus", "1", "--mem", "1G")
# (owner, name, dlsub arguments before the script, the script's arguments): each trains about 3 minutes
# undisturbed, so that every fault lands while they train.
JOBS: tuple[tuple[str, str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("A", "mover", ("--mode", "immediate", "--gpus", "1"), ("--epochs", "40", "--throttle", "0.05",
                                                           "--cpu-slowdown", "4")),
    ("A", "cpu", ("-p", "cpu"), ("--epochs", "40", "--throttle", "0.2")),
    ("B", "cpu", ("-p", "cpu"), ("--epochs", "40", "--throttle", "0.2")),
    ("A", "elastic", ("--gpus", "1:2"), ("--epochs", "40", "--throttle", "0.1")),
    ("B", "elastic", ("--gpus", "1:2"), ("--epochs", "40", "--throttle", "0.1")),
)
ENDED = ("COMPLETED", "FAILED", "CANCELLED")


@dataclass
class Job:
    owner: str
    name: str
    user: TestbedUser
    record: dict[str, Any]
    problems: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.owner}/{self.name} {self.record['id']}"


def checkpointed(job: Job) -> bool:
    status = job.user.status(job.record["id"])
    return status["state"] == "RUNNING" and status["last_checkpoint_step"] is not None


def node_down(node: str) -> bool:
    state = subprocess.run(["sinfo", "-h", "-n", node, "-o", "%t"], capture_output=True, text=True).stdout
    return "down" in state


def drained_nodes() -> dict[str, str]:
    """The nodes Slurm has drained, with its reason (a failover can drain one: "Duplicate jobid")."""
    out = subprocess.run(["sinfo", "-h", "-R", "-N", "-o", "%N|%E"], capture_output=True, text=True).stdout
    return dict(line.split("|", 1) for line in out.splitlines() if "|" in line)


def lose_and_bring_back(node: str, how: str) -> tuple[Callable[[], None], Callable[[], None]]:
    """The node lost (its slurmd killed, or its link cut) and brought back into service once Slurm has marked it
    down (each controller that takes control counts SlurmdTimeout afresh, so a failover in between delays it):
    the requeue of its jobs, and their older attempts fenced, are what the soak means to meet."""
    def back() -> None:
        try:
            wait_for(f"Slurm to mark {node} down", lambda: node_down(node), timeout=180, interval=2)
        except AssertionError:
            print(f"  (Slurm did not mark {node} down in 180 s)", flush=True)
        if how == "slurmd":
            slurmd_pidfile(node).unlink(missing_ok=True)
        else:
            set_link(node, up=True)
        node_back(node)
    return (lambda: kill_slurmd(node)) if how == "slurmd" else (lambda: set_link(node, up=False)), back


Fault = tuple[float, str, Callable[[], None]]


def agent_faults(rng: random.Random) -> list[Fault]:
    """The one agent killed (-9) and started again, twice."""
    down, down_again = rng.uniform(1, 8), rng.uniform(20, 35)
    return [
        (down, "agent killed (-9)", lambda: agent_service("kill9")),
        (down + rng.uniform(3, 8), "agent started", lambda: agent_service("start")),
        (down_again, "agent killed (-9) again", lambda: agent_service("kill9")),
        (down_again + rng.uniform(2, 6), "agent started again", lambda: agent_service("start")),
    ]


def pair_faults(rng: random.Random) -> list[Fault]:
    """Of a pair whose login2 agent is active: login2 lost and back, then the lease's holder killed (-9) and
    started again (login1's agent, unless it has not taken over by then)."""
    down = rng.uniform(1, 8)
    frozen: list[int] = []
    killed: list[str] = []

    def kill_the_holder() -> None:
        killed.append(str((pair_lease() or {}).get("host") or "login1"))
        agent_service("kill9", killed[-1])

    return [
        (down, "login2 lost (its agent, active, frozen; link cut)", lambda: frozen.append(lose_login2())),
        (down + rng.uniform(25, 40), "login2 back (its agent woken)", lambda: login2_back(frozen[-1])),
        (rng.uniform(45, 60), "the lease's holder killed (-9)", kill_the_holder),
        # killed[] is filled by then: faults run in order, and this one is drawn after the kill.
        (rng.uniform(62, 68), "it started again", lambda: agent_service("start", killed[-1], PAIR_DB)),
    ]


def timeline(rng: random.Random, node: str, how: str, blocker_ids: list[int], pair: bool = False) -> list[Fault]:
    """The faults of one run, at seconds after the first, drawn from ``rng``."""
    lose, back = lose_and_bring_back(node, how)
    ctld_down = rng.uniform(8, 20)
    return sorted([
        (0.0, f"{node} lost ({'slurmd killed' if how == 'slurmd' else 'link cut'})", lose),
        (rng.uniform(0, 6), "B's GPU blockers cancelled",
         lambda: subprocess.run(["scancel", *map(str, blocker_ids)], check=True)),
        *(pair_faults(rng) if pair else agent_faults(rng)),
        (ctld_down, f"primary slurmctld ({PRIMARY_HEAD}) killed", lambda: kill_slurmctld(PRIMARY_HEAD)),
        (ctld_down + rng.uniform(15, 30), f"primary slurmctld back (after {BACKUP_HEAD} took control)",
         lambda: slurmctld_back(PRIMARY_HEAD)),
        (rng.uniform(40, 70), f"{node} back (once Slurm marked it down)", back),
    ], key=lambda f: f[0])


def agents_running(pair: bool) -> None:
    """The agent service running; of a pair, both agents, login2's link up."""
    if not pair:
        agent_service("start")
        return
    set_link("login2", up=True)
    for host in ("login2", "login1"):
        agent_service("start", host, PAIR_DB)


def login2_active() -> None:
    """Of a pair, login2's agent holding the lease (so that losing login2 loses the active agent): login1's agent,
    if it holds it, stopped (a clean stop gives the lease up) and started again once login2's has taken it."""
    agents_running(pair=True)
    if (pair_lease() or {}).get("host") != "login2":
        agent_service("stop", "login1")
        wait_for("login2's agent to take the lease", lambda: (pair_lease() or {}).get("host") == "login2",
                 timeout=30)
        agent_service("start", "login1", PAIR_DB)


def run_faults(faults: list[Fault]) -> list[tuple[float, str]]:
    """Each fault at its time (or as soon after as the one before it let it: bringing a controller back waits
    for both to answer). Returns when each actually happened."""
    began, done = time.monotonic(), []
    for at, what, act in faults:
        time.sleep(max(0.0, began + at - time.monotonic()))
        act()
        done.append((time.monotonic() - began, what))
        print(f"  {done[-1][0]:5.1f} s  {what}", flush=True)
    return done


def check(job: Job) -> dict[str, Any]:
    """Whether the job ended intact (its problems are appended to ``job.problems``), and what the faults cost it."""
    rid, job_dir = job.record["id"], job.record["job_dir"]
    status = job.user.status(rid)
    if status["state"] != "COMPLETED":
        job.problems.append(f"ended {status['state']}")
    text = job_output(job_dir)
    total = re.search(r"starting from scratch: (\d+) epochs x (\d+) steps", text)
    done = re.findall(r"done: (\d+) steps", text)
    if not total or not done or int(done[-1]) != int(total.group(1)) * int(total.group(2)):
        job.problems.append(f"not trained to its end: {total and total.group(0)!r}, done {done}")
    runs = attempts(job_dir)
    starts = [a for a in runs if a["event"] == "start" and a.get("role", "main") == "main"]
    events = progress_events(job_dir)
    # Each restore (a new attempt's, or a resize's within one): from the newest checkpoint recorded before it
    # (an older attempt's records after a newer one began are refused, checked below); steps redone: those
    # reported before it, past it.
    redone = []
    for restore in (e for e in events if e.get("event") == "restore"):
        saved = [e["step"] for e in events if e.get("event") == "checkpoint" and e["time"] < restore["time"]]
        if saved and restore.get("step") != max(saved):
            job.problems.append(f"restored step {restore.get('step')}, newest checkpoint before it {max(saved)}")
        reported = [e["step"] for e in events if e.get("event") == "progress" and e["time"] < restore["time"]
                    and e.get("step") is not None]
        redone.append(max(0, max(reported, default=0) - (restore.get("step") or 0)))
    # Fenced: nothing of an attempt after a newer one (of the main job) began.
    for older, newer in zip(starts, starts[1:], strict=False):
        attempt = f"{older['slurm_job_id']}-{older['restart']}"
        late = [e for e in events if e.get("attempt") == attempt and e["time"] >= newer["time"]]
        if late:
            job.problems.append(f"attempt {attempt} wrote {len(late)} record(s) after {newer['slurm_job_id']}-"
                                f"{newer['restart']} began: {late[:2]}")
    partitions = [a["partition"] for a in starts]
    moves = [a for a in runs if a["event"] == "end" and a.get("action") == "move"]
    if len(moves) > 1 or ("gpu" in partitions and "cpu" in partitions[partitions.index("gpu"):]):
        job.problems.append(f"moved {len(moves)} times, partitions {partitions}")
    ids = [job.record["slurm_job_id"], *([job.record["worker_array_id"]] if job.record.get("worker_array_id") else [])]
    left = {i: processes_of_job(i) for i in ids}
    try:
        containers = job.user.containers(f"dlsub.job_id={rid}")
    except AssertionError as exc:  # Podman itself fails for the user on a node: what their next job there meets
        containers = [f"(podman failed: {str(exc).strip().splitlines()[-1][:200]})"]
    if any(left.values()) or containers:
        job.problems.append(f"left behind: processes {left}, containers {containers}")
    return {"job": job.label, "state": status["state"], "attempts": len(starts), "partitions": partitions,
            "moves": len(moves), "steps_redone": redone, "problems": job.problems}


def one_run(run: int, seed: int, users: dict[str, TestbedUser], pair: bool = False) -> dict[str, Any]:
    rng = random.Random(seed * 1000 + run)
    if pair:
        login2_active()
    token = (pair_lease() or {}).get("token") if pair else None
    began = time.monotonic()
    dirs = {}
    for key, user in users.items():
        path = user.home / f"dlsub-soak-{seed}-{run}"
        user.run("mkdir", "-p", str(path), check=True)
        dirs[key] = path
    holds = blockers(users["B"])
    jobs: list[Job] = []
    try:
        for owner, name, args, script_args in JOBS:
            user = users[owner]
            jobs.append(Job(owner, name, user, user.submit(*SMALL, *args, TRAIN, *script_args, cwd=dirs[owner])))
        on_cpu = [j for j in jobs if j.name in ("mover", "cpu")]
        wait_for("the cpu jobs' first checkpoints", lambda: all(checkpointed(j) for j in on_cpu), timeout=180)
        target = next(j for j in jobs if j.owner == "A" and j.name == "cpu")
        node = (slurm_job(target.record["slurm_job_id"]) or {})["nodes"]
        how = rng.choice(["slurmd", "link"])
        print(f"run {run}: faults (seed {seed}), from {time.strftime('%H:%M:%S')}:", flush=True)
        faults = run_faults(timeline(rng, node, how, holds, pair))
        wait_for("every job to end",
                 lambda: all(j.user.status(j.record["id"])["state"] in ENDED for j in jobs), timeout=900, interval=3)
        took = time.monotonic() - began
        results = [check(j) for j in jobs]
    finally:
        subprocess.run(["scancel", *map(str, holds)], check=False)
        for j in jobs:
            if j.user.status(j.record["id"])["state"] not in ENDED:
                j.user.dlsub("cancel", j.record["id"], check=False)
        if controllers() != {"primary": "UP", "backup": "UP"}:
            slurmctld_back(PRIMARY_HEAD)
        agents_running(pair)
    drained = drained_nodes()
    for drained_node in drained:
        # Slurm's, not dlsub's, and an admin's to lift (docs/admin-guide.md, "When slurmctld fails over"): lifted
        # here, so that the next run starts on a whole cluster.
        subprocess.run(["scontrol", "update", f"nodename={drained_node}", "state=resume"], check=False)
    ok = not any(r["problems"] for r in results)
    for r in results:
        print(f"  {r['job']:<22} {r['state']:<10} attempts {r['attempts']} on {','.join(r['partitions'])}; "
              f"steps redone after each restore {r['steps_redone']}"
              + (f"; PROBLEMS: {r['problems']}" if r["problems"] else ""), flush=True)
    if drained:
        print(f"  Slurm drained (resumed after the run): {drained}", flush=True)
    lease = pair_lease() if pair else None
    if lease:
        print(f"  the lease: token {token} -> {lease['token']}, held by {lease['host']}", flush=True)
    print(f"run {run}: {'intact' if ok else 'FAILED'} in {took / 60:.1f} min", flush=True)
    return {"run": run, "ok": ok, "minutes": round(took / 60, 2), "lost": how, "node": node, "drained": drained,
            "lease_tokens": [token, lease["token"]] if lease else None,
            "faults": [{"at_s": round(t, 1), "what": w} for t, w in faults], "jobs": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pair", action="store_true",
                        help="the agent as a pair on login1 and login2, login2's active and lost in each run")
    parser.add_argument("--json", action="store_true", help="also print every run as one JSON document")
    args = parser.parse_args()
    # Stopped with kill PID (SIGINT is ignored where it was started in the background): the run in progress
    # puts back what it holds (its finally) before the soak exits.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("soak: stopped (SIGTERM)"))
    users = {"A": TestbedUser("dltest"), "B": TestbedUser("dltest2")}
    runs = []
    with agent_pair() if args.pair else contextlib.nullcontext():
        agents_running(args.pair)
        for run in range(1, args.runs + 1):
            runs.append(one_run(run, args.seed, users, args.pair))
            if not runs[-1]["ok"]:
                break  # "in a row": the first failure ends the soak, its testbed left as it was for a look
    passed = sum(r["ok"] for r in runs)
    print(f"soak: {passed} of {args.runs} runs in a row intact; minutes per run "
          f"{', '.join(str(r['minutes']) for r in runs)}")
    if args.json:
        print(json.dumps(runs, indent=1))
    sys.exit(0 if passed == args.runs else 1)


if __name__ == "__main__":
    main()
