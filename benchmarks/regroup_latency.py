"""In-process re-formation (issue 52), the mechanism alone: how long ranks that stay stand still when a rank
leaves or a process joins, against a group started afresh, measured in the same run.

    python benchmarks/regroup_latency.py [--members 2] [--samples 5] [--params 1000000] [--json]

No Slurm, no container, no torchrun: ``--members`` + 1 processes of one gloo group on loopback (one TCPStore,
hosted by rank 0, which stays) train a model of ``--params`` float32 parameters with an all-reduce a step.
Then, alternately, ``--samples`` times each:

* shrink: the highest rank leaves (:meth:`ElasticGroup.leave`), the others re-form without it;
* grow: a new process starts, asks to join (:meth:`ElasticGroup.join`) and gets the state from rank 0.

Printed, median and range over the samples:

* the staying ranks' pause: from the step boundary where the change is due to their first step done at the
  new size (the slowest staying rank);
* for a grow, decision -> first step at the new size, the decision being the joining process's start: its
  interpreter and ``import torch`` (which the others spend training) and the re-formation;
* the baseline, a restart's process part: ``--members`` fresh processes from their start to their first step
  in a group formed from scratch (interpreter, ``import torch``, the group; no container, no checkpoint read),
  which today's resize pays on top of its checkpoint, container and rendezvous (``resize_latency.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------- the processes
def _worker(role: str, control: Path, params: int) -> None:
    """A member (or a joining process): trains, leaves when the control file names its generation, prints a
    JSON record a step."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from dlsub.checkpointing.regroup import ElasticGroup

    def say(**record: Any) -> None:
        print(json.dumps({"pid": os.getpid(), "time": time.time(), **record}), flush=True)

    port, timeout = int(os.environ["MASTER_PORT"]), timedelta(seconds=120)
    model = torch.nn.Linear(params // 1000, 1000, bias=False)
    if role == "member":
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        store = dist.TCPStore("127.0.0.1", port, is_master=rank == 0, timeout=timeout, wait_for_workers=False)
        dist.init_process_group("gloo", store=dist.PrefixStore("first", store), rank=rank, world_size=world)
        group = ElasticGroup.member(store, timeout_s=120)
        joining = False
    else:
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
        group, change = ElasticGroup.join(store, timeout_s=120)
        assert change.state is not None
        model.load_state_dict(change.state["model"])
        say(event="joined", world=change.membership.world_size, paused_s=change.paused_s)
        joining = True
    while True:
        boundary = time.time()
        members = group.membership
        if not joining:
            try:
                asked = int(control.read_text() or -1)
            except (OSError, ValueError):
                asked = -1
            if asked == members.generation and members.rank == members.world_size - 1 and members.rank > 0:
                group.leave()
            if group.due():
                change = group.reform(lambda: {"model": model.state_dict()})
                if change.left:
                    say(event="left")
                    return
                say(event="reformed", boundary=boundary, world=change.membership.world_size,
                    paused_s=change.paused_s)
        joining = False
        for p in model.parameters():
            p.grad = torch.ones_like(p)
            dist.all_reduce(p.grad)
        say(event="step", world=group.membership.world_size, rank=group.membership.rank)
        time.sleep(0.01)


def _cold_start(params: int) -> None:
    """The baseline's process: start, import torch, form a group, take one step."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    model = torch.nn.Linear(params // 1000, 1000, bias=False)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
        dist.all_reduce(p.grad)
    print(json.dumps({"time": time.time()}), flush=True)
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------- the controller
def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawn(args: list[str], env: dict[str, str], out: Path | None) -> subprocess.Popen[bytes]:
    stdout = open(out, "ab") if out is not None else subprocess.PIPE  # noqa: SIM115 - the process holds it
    return subprocess.Popen([sys.executable, __file__, *args], stdout=stdout,
                            env={**os.environ, "PYTHONPATH": str(REPO), **env})


def _records(folder: Path) -> list[dict[str, Any]]:
    records = []
    for out in folder.glob("*.out"):
        for line in out.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue  # a line being written
    return records


def _wait(folder: Path, predicate: Any, procs: list[subprocess.Popen[bytes]], timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate(_records(folder)):
        if time.monotonic() > deadline or any(p.poll() not in (None, 0) for p in procs):
            raise SystemExit(f"the group did not get there in {timeout_s:.0f} s; outputs in {folder}")
        time.sleep(0.05)


def baseline(members: int, params: int) -> float:
    """A group of ``members`` fresh processes: start -> every one has taken its first step (seconds)."""
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_port()), "WORLD_SIZE": str(members)}
    started = time.time()
    procs = [_spawn(["--cold", "--params", str(params)], {**env, "RANK": str(r)}, None) for r in range(members)]
    times = [json.loads(p.communicate(timeout=300)[0].splitlines()[-1])["time"] for p in procs]
    return max(times) - started


def _since(records: list[dict[str, Any]], mark: float) -> list[dict[str, Any]]:
    return [r for r in records if r["time"] > mark]


def _first_steps_at(records: list[dict[str, Any]], world: int, after: float) -> dict[int, float]:
    """Each rank's first step at world size ``world`` after ``after``."""
    firsts: dict[int, float] = {}
    for r in sorted(_since(records, after), key=lambda r: r["time"]):
        if r["event"] == "step" and r["world"] == world:
            firsts.setdefault(r["rank"], r["time"])
    return firsts


def _slowest_first_step(records: list[dict[str, Any]], world: int, after: float) -> float:
    return max(_first_steps_at(records, world, after).values())


def measure(members: int, samples: int, params: int, folder: Path) -> dict[str, list[float]]:
    control = folder / "control"
    control.write_text("-1")
    env = {"MASTER_PORT": str(_port()), "WORLD_SIZE": str(members + 1)}
    procs = [_spawn(["--worker", "member", "--control", str(control), "--params", str(params)],
                    {**env, "RANK": str(r)}, folder / f"member{r}.out") for r in range(members + 1)]
    found: dict[str, list[float]] = {"shrink_pause_s": [], "grow_pause_s": [], "grow_decision_to_step_s": [],
                                     "join_start_s": []}
    try:
        _wait(folder, lambda rs: any(r["event"] == "step" for r in rs), procs)
        generation = 0
        for sample in range(samples):
            # Shrink: the highest rank of this generation leaves.
            mark = time.time()
            control.write_text(str(generation))
            _wait(folder, lambda rs, mark=mark: any(r["event"] == "reformed" for r in _since(rs, mark)) and
                  len(_first_steps_at(rs, members, mark)) >= members, procs)
            generation += 1
            records = _since(_records(folder), mark)
            boundary = min(r["boundary"] for r in records if r["event"] == "reformed")
            # The slowest staying rank's first step at the new size, from the boundary.
            found["shrink_pause_s"].append(_slowest_first_step(records, members, boundary) - boundary)
            # Grow: a new process joins.
            started = time.time()
            procs.append(_spawn(["--worker", "joiner", "--control", str(control), "--params", str(params)],
                                env, folder / f"joiner{sample}.out"))
            _wait(folder, lambda rs, mark=started: len(_first_steps_at(rs, members + 1, mark)) >= members + 1, procs)
            generation += 1
            records = _since(_records(folder), started)
            boundary = min(r["boundary"] for r in records if r["event"] == "reformed")
            first = _slowest_first_step(records, members + 1, boundary)
            found["grow_pause_s"].append(first - boundary)
            found["grow_decision_to_step_s"].append(first - started)
            found["join_start_s"].append(boundary - started)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return found


def _summary(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s (range {min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", type=int, default=2, help="ranks that stay (default 2)")
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--params", type=int, default=1_000_000, help="model parameters (float32; default 1e6)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", choices=("member", "joiner"), help=argparse.SUPPRESS)
    parser.add_argument("--control", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--cold", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker, args.control, args.params)
        return
    if args.cold:
        _cold_start(args.params)
        return
    with tempfile.TemporaryDirectory(prefix="regroup-latency-") as tmp:
        found = measure(args.members, args.samples, args.params, Path(tmp))
    found["baseline_start_s"] = [baseline(args.members, args.params) for _ in range(args.samples)]
    if args.json:
        print(json.dumps(found, indent=2))
        return
    print(f"{args.members} ranks stay, {args.params:,} parameters, {args.samples} samples, median (range):")
    print(f"  shrink {args.members + 1} -> {args.members}: staying ranks' pause {_summary(found['shrink_pause_s'])}")
    print(f"  grow {args.members} -> {args.members + 1}: staying ranks' pause {_summary(found['grow_pause_s'])}; "
          f"joining process start -> first step at the new size {_summary(found['grow_decision_to_step_s'])} "
          f"(of which before the boundary, training on: {_summary(found['join_start_s'])})")
    print(f"  baseline, {args.members} fresh processes start -> first step: {_summary(found['baseline_start_s'])}")
    ratio = statistics.median(found["baseline_start_s"]) / max(statistics.median(found["shrink_pause_s"]), 1e-3)
    print(f"  the staying ranks stand still {ratio:.0f}x shorter in a shrink than a restart's process part alone")


if __name__ == "__main__":
    main()
