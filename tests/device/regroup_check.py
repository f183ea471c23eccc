"""The device check of a grow in process (issue 52) with the model on the GPU: members keep running, a joiner takes
the state from their memory.

    python tests/device/regroup_check.py [--out DIR] [--allow-cpu]

For a machine with one CUDA GPU and torch (no Slurm, no Podman): two processes train a CUDA model in a group (rank
0 holds the group's store, as under dlsub's torchrun), written as the user guide's in-process loop
(``checkpointing.init``, ``restore``, ``regroup_in_process``, one step, ``should_stop``). A third process then
starts as a worker's torchrun starts it (dlsub's entry point, the group's record from ``worth_joining`` in its
environment) and joins: the members re-form at world size 3 without a restart, the joiner gets the state from
rank 0's memory, and all three train on with one state. The group's backend is gloo over the CUDA tensors: NCCL
refuses two ranks on one GPU (launcher_check's ``nccl_two_ranks``).

Printed, and written to ``DIR/regroup_check.json``: the grow's latency (the joiner's start to its first step at
world size 3), the members' longest pause between two steps around the grow against their median step, and the
checks (no member restarted, no step repeated or skipped, every process's parameters equal at every step, nothing
saved or read from disk). Exit 0 only when every check passed. ``--allow-cpu`` runs the same on CPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from device_checks import expect, free_port, run_check  # noqa: E402

from dlsub import contract  # noqa: E402
from dlsub.checkpointing.regroup_join import worth_joining  # noqa: E402

STEPS = 150  # at least, and then 20 at the grown size
TIMEOUT_S = 240.0

TRAINING = textwrap.dedent("""
    import json, os, sys, time
    import torch
    import torch.distributed as dist
    from dlsub import checkpointing

    steps, until_world = int(sys.argv[1]), int(sys.argv[2])
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    dist.init_process_group("gloo")
    run = checkpointing.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).to(device)
    step = 0
    state = run.restore(map_location=device)
    if state is not None:
        model.load_state_dict(state["model"])
        step = state["step"]
    changes = []
    run.regroup_in_process(lambda: {"model": model.state_dict(), "step": step},
                           on_change=lambda change: changes.append([change.membership.world_size, change.joined]))
    print(json.dumps({"event": "began", "time": time.time(), "pid": os.getpid(), "rank": run.rank,
                      "world": run.world_size, "step": step, "restored": state is not None,
                      "device": str(next(model.parameters()).device)}), flush=True)
    grown_at = None
    while True:
        if grown_at is None and run.world_size >= until_world:
            grown_at = step
        if step >= steps and (grown_at is not None and step >= grown_at + 20 or step >= 100 * steps):
            break
        g = torch.Generator(device=device).manual_seed(step * 100 + run.rank)
        model.zero_grad()
        model(torch.randn(64, 256, generator=g, device=device)).pow(2).mean().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= run.world_size
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.01 * p.grad
        step += 1
        checksum = round(float(sum(p.detach().double().sum() for p in model.parameters())), 9)
        print(json.dumps({"event": "step", "time": time.time(), "pid": os.getpid(), "rank": run.rank,
                          "world": run.world_size, "step": step, "checksum": checksum}), flush=True)
        time.sleep(0.02)
        if run.should_stop():
            sys.exit(3)
    print(json.dumps({"event": "done", "changes": changes, "step": step}), flush=True)
    dist.destroy_process_group()
""")


def records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.read_text().splitlines() if line.startswith("{")]


def check_grow_in_process(tmp: Path) -> dict[str, Any]:
    script = tmp / "train in process.py"
    script.write_text(TRAINING)
    job_dir = tmp / "job"
    port = free_port()
    base = {**os.environ, "PYTHONPATH": str(REPO), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "TORCHELASTIC_USE_AGENT_STORE": "False", "TORCHELASTIC_RUN_ID": "device",
            contract.ENV_JOB_DIR: str(job_dir), contract.ENV_ATTEMPT: "52_0"}
    outs = [tmp / f"member{rank}.out" for rank in range(2)]
    joiner_out = tmp / "joiner.out"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for rank, out in enumerate(outs):
            with open(out, "wb") as f:
                procs.append(subprocess.Popen(
                    [sys.executable, str(script), str(STEPS), "3"], stdout=f, stderr=subprocess.STDOUT,
                    env={**base, "RANK": str(rank), "WORLD_SIZE": "2", contract.ENV_CONTAINER: "main"}))
        record = contract.regroup_record(job_dir, "52_0")
        deadline = time.monotonic() + TIMEOUT_S
        while not (record.exists() and len([r for r in records(outs[0]) if r["event"] == "step"]) >= 30):
            expect(time.monotonic() < deadline and all(p.poll() is None for p in procs),
                   "the members never began: " + outs[0].read_text()[-2000:])
            time.sleep(0.05)
        point, why_not = worth_joining({contract.ENV_JOB_DIR: str(job_dir), contract.ENV_ATTEMPT: "52_0"})
        expect(point is not None, f"no group to join: {why_not}")
        assert point is not None
        joiner_started = time.time()
        with open(joiner_out, "wb") as f:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "dlsub.checkpointing.rank_output", str(script), str(STEPS), "3"],
                stdout=f, stderr=subprocess.STDOUT,
                env={**base, "RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": str(free_port()),
                     contract.ENV_CONTAINER: "worker", contract.ENV_REGROUP_JOIN: point.to_json()}))
        for p, out in zip(procs, [*outs, joiner_out], strict=True):
            try:
                code = p.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{out.name} did not end: {out.read_text()[-2000:]}") from None
            expect(code == 0, f"{out.name} exited {code}: {out.read_text()[-2000:]}")
    finally:
        for p in procs:
            p.kill()
    members = [records(out) for out in outs]
    joined = records(joiner_out)
    for member in members:
        expect(len({r["pid"] for r in member if "pid" in r}) == 1, "a member restarted")
        steps = [r["step"] for r in member if r["event"] == "step"]
        expect(steps == list(range(1, steps[-1] + 1)), "a member repeated or skipped a step")
        expect(member[-1]["changes"] == [[3, 1]], f"the members' changes: {member[-1]}")
    began = joined[0]
    expect(began["event"] == "began" and began["world"] == 3 and began["restored"], f"the joiner began: {began}")
    by_step: dict[int, set[float]] = {}
    for out in (*members, joined):
        for r in out:
            if r["event"] == "step":
                by_step.setdefault(r["step"], set()).add(r["checksum"])
    expect(all(len(sums) == 1 for sums in by_step.values()), "the processes' parameters diverged")
    events = [json.loads(line) for line in (job_dir / contract.PROGRESS_FILE).read_text().splitlines()]
    expect(not [e for e in events if e["event"] in ("checkpoint", "restore", "exit_for_resume")],
           "something was saved or read for the grow")
    first_joined_step = next(r for r in joined if r["event"] == "step")
    rank0_steps = [r for r in members[0] if r["event"] == "step"]
    gaps = [b["time"] - a["time"] for a, b in zip(rank0_steps, rank0_steps[1:], strict=False)]
    return {"device": began["device"], "joined_at_step": began["step"],
            "grow_latency_s": round(first_joined_step["time"] - joiner_started, 3),
            "members_longest_pause_s": round(max(gaps), 3), "members_median_step_s": round(statistics.median(gaps), 4),
            "steps": rank0_steps[-1]["step"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--allow-cpu", action="store_true", help="run on CPUs where there is no GPU")
    args = parser.parse_args()
    if not torch.cuda.is_available() and not args.allow_cpu:
        print("no CUDA GPU here (--allow-cpu runs the check on CPUs)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="dlsub-regroup-check-") as tmp:
        result = run_check(check_grow_in_process, Path(tmp))
    report = {"device": "cuda" if torch.cuda.is_available() else "cpu", "torch": torch.__version__,
              "checks": {"grow_in_process": result}}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "regroup_check.json").write_text(json.dumps(report, indent=1) + "\n")
    print(("PASS" if result["passed"] else "FAIL") + " grow_in_process: " + json.dumps(result))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
