"""How long a group of training processes takes to start under dlsub's torchrun: forked from it, or a Python each.

    python benchmarks/rank_start.py [--nproc 4] [--samples 5] [--json]

(``--nproc 1``: a job's one process, which the launcher runs without dlsub's
entry point, forked all the same.)

Every restart of a job (a resize, a move, a continuation) starts all of its
processes again. dlsub's torchrun (``dlsub.checkpointing.torchrun_main``)
forks them from itself, where torch is already imported
(``dlsub.checkpointing.forked_rank``); ``DLSUB_RANK_START=exec`` starts each
as torchrun does, a Python that imports torch. One sample of each, in turn,
in the same run: torchrun over ``--nproc`` processes of a script that
imports torch, joins the gloo group and all-reduces once (what a training
script does before its first step). Two times per sample: the whole run, and
from torchrun's own start (its ``import torch`` done) to every process
joined, which is what a re-formed group waits for when the launcher started
torchrun ahead (``--from-stdin``). Prints each sample, the medians and their
ratio. Needs torch; no Slurm, no Podman: run it on a quiet machine.
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

REPO = Path(__file__).resolve().parents[1]

#: Each process: torch imported (or already there), the group joined, one all-reduce; rank 0 says when.
RANK = textwrap.dedent(
    """
    import os, sys, time
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(1))
    if dist.get_rank() == 0:
        open(sys.argv[1], "w").write(repr(time.time()))
    dist.destroy_process_group()
    """
)
#: torchrun's own start: when its import of torch is done (the agent then starts the processes).
AGENT = textwrap.dedent(
    """
    import sys, time
    import torch.distributed.run
    open(sys.argv.pop(1), "w").write(repr(time.time()))
    from dlsub.checkpointing.torchrun_main import main
    sys.exit(main())
    """
)


def one(mode: str, nproc: int, work: Path) -> dict[str, float]:
    joined, agent_ready = work / f"joined-{mode}", work / f"agent-{mode}"
    for stale in (joined, agent_ready):
        stale.unlink(missing_ok=True)
    # TMPDIR: torchrun leaves a torchelastic_* folder in it each run, kept in the run's own folder, not /tmp.
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONSAFEPATH": "1", "DLSUB_RANK_START": mode, "TMPDIR": str(work)}
    started = time.time()
    # As the launcher runs it: a process alone without the entry point (launch.main), a group through it.
    entry = ["-m", "dlsub.checkpointing.rank_output"] if nproc > 1 else []
    subprocess.run([sys.executable, "-P", "-c", AGENT, str(agent_ready), "--standalone", "--nnodes", "1",
                    "--nproc-per-node", str(nproc), *entry, str(work / "rank.py"),
                    str(joined)], env=env, cwd=work, check=True, stdin=subprocess.DEVNULL,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    ended = time.time()
    ready, done = float(agent_ready.read_text()), float(joined.read_text())
    return {"total_s": round(ended - started, 2), "from_torchrun_s": round(done - ready, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows: dict[str, list[dict[str, float]]] = {"fork": [], "exec": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "rank.py").write_text(RANK)
        for i in range(args.samples):
            for mode in rows:
                rows[mode].append(one(mode, args.nproc, work))
                if not args.json:
                    r = rows[mode][-1]
                    print(f"sample {i + 1} {mode:<4}: all {args.nproc} joined {r['from_torchrun_s']:5.2f} s after "
                          f"torchrun's start, {r['total_s']:5.2f} s in all", flush=True)
    medians = {mode: {key: statistics.median(r[key] for r in runs) for key in ("from_torchrun_s", "total_s")}
               for mode, runs in rows.items()}
    if args.json:
        print(json.dumps({"nproc": args.nproc, "samples": rows, "medians": medians}))
        return
    for mode, m in medians.items():
        print(f"median {mode:<4}: joined {m['from_torchrun_s']:.2f} s after torchrun's start, "
              f"{m['total_s']:.2f} s in all")
    print(f"forked / a Python each: {medians['fork']['from_torchrun_s'] / medians['exec']['from_torchrun_s']:.2f} "
          f"after torchrun's start, {medians['fork']['total_s'] / medians['exec']['total_s']:.2f} in all "
          f"({args.nproc} processes, {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
