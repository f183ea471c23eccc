"""Benchmark: what rootless Podman adds to a dlsub job, on the live testbed.

Runs the example training (examples/train_digits.py) as the testbed user, in
alternation, N times each way on the same partition:

* container: ``dlsub train_digits.py`` (sbatch -> podman run -> launcher -> torchrun);
* bare: the same script under the same torchrun from the host's venv, in a
  Slurm batch job on the same partition (``sbatch --wrap``), same job-dir layout.

For each run it reads the job's own progress events and prints the latency
from submit to the first training step and the mean step time, then the
medians and the container/bare ratios. Run as root: `make bench`.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testbed"))
from livebed import EXAMPLES, TestbedUser, attempts, progress_events, wait_for

VENV = Path(os.environ.get("DLSUB_PREFIX", "/opt/dlsub")) / "venv"


def progress_steps(job_dir: Path) -> list[tuple[int, float]]:
    """(step, time) of each progress report the training wrote."""
    return [(e["step"], e["time"]) for e in progress_events(str(job_dir), "progress")]


def measure(submitted_at: float, job_started_at: float, job_dir: Path, warmup: int) -> dict[str, float]:
    steps = progress_steps(job_dir)
    first_step_time = steps[0][1]
    (s0, t0), (s1, t1) = steps[warmup], steps[-2]  # the last report carries the test evaluation
    return {
        "submit_to_first_step_s": first_step_time - submitted_at,
        "job_start_to_first_step_s": first_step_time - job_started_at,
        "step_time_ms": 1000 * (t1 - t0) / (s1 - s0),
    }


def slurm_job_gone(user: TestbedUser, slurm_id: str):  # type: ignore[no-untyped-def]
    """The same cheap poll (one squeue) for both kinds of run, so neither steals more CPU from the job."""
    return lambda: user.run("squeue", "-h", "-j", slurm_id, "-t", "PD,R,CG", "-o", "%i").stdout.strip() == ""


def run_container(user: TestbedUser, workdir: Path, train_args: list[str], partition: str) -> dict[str, float]:
    t0 = time.time()
    job = user.submit("--partition", partition, str(EXAMPLES / "train_digits.py"), *train_args, cwd=workdir)
    wait_for("container run", slurm_job_gone(user, str(job["slurm_job_id"])), timeout=600, interval=0.5)
    assert user.status(job["id"])["state"] == "COMPLETED", user.dlsub("logs", job["id"]).stdout
    # The batch script's first line of work.
    started = next(a["time"] for a in attempts(job["job_dir"]) if a["event"] == "start")
    return measure(t0, started, Path(job["job_dir"]), warmup=5)


def run_bare(user: TestbedUser, workdir: Path, train_args: list[str], partition: str) -> dict[str, float]:
    job_dir = Path(tempfile.mkdtemp(prefix="bare-", dir=workdir))
    os.chown(job_dir, user.uid, user.gid)
    command = " ".join(
        shlex.quote(w)
        for w in [str(VENV / "bin" / "torchrun"), "--standalone", "--nnodes", "1", "--nproc-per-node", "1",
                  str(EXAMPLES / "train_digits.py"), *train_args]
    )
    command = f"date +%s.%N > {shlex.quote(str(job_dir / 'started'))}; {command}"
    t0 = time.time()
    out = user.run(
        "sbatch", "--parsable", "--partition", partition, "--cpus-per-task=2", "--mem=4096M",
        f"--output={job_dir}/slurm-%j.out", f"--export=ALL,DLSUB_JOB_DIR={job_dir},PYTHONPATH={VENV}",
        "--wrap", command, cwd=workdir, check=True,
    )
    slurm_id = out.stdout.strip().split(";")[0]
    wait_for("bare run", slurm_job_gone(user, slurm_id), timeout=600, interval=0.5)
    return measure(t0, float((job_dir / "started").read_text()), job_dir, warmup=5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=256, help="larger steps make the ratio less noisy")
    parser.add_argument("--partition", default="cpu")
    args = parser.parse_args()
    user = TestbedUser(os.environ.get("DLSUB_TESTBED_USER", "dltest"))
    # In the user's home, shared with the nodes (the login host's /tmp is its own).
    workdir = Path(tempfile.mkdtemp(prefix="dlsub-bench-", dir=user.home))
    os.chown(workdir, user.uid, user.gid)
    train_args = ["--epochs", str(args.epochs), "--batch-size", str(args.batch_size), "--report-every", "1"]
    results: dict[str, list[dict[str, float]]] = {"container": [], "bare": []}
    for i in range(args.repeats):
        for kind, fn in (("bare", run_bare), ("container", run_container)):
            r = fn(user, workdir, train_args, args.partition)
            results[kind].append(r)
            print(f"run {i + 1} {kind:9s}: submit->first step {r['submit_to_first_step_s']:.2f} s, "
                  f"job start->first step {r['job_start_to_first_step_s']:.2f} s, step {r['step_time_ms']:.3f} ms",
                  flush=True)

    def med(kind: str, key: str) -> float:
        return statistics.median(r[key] for r in results[kind])

    c_lat, b_lat = med("container", "submit_to_first_step_s"), med("bare", "submit_to_first_step_s")
    c_start, b_start = med("container", "job_start_to_first_step_s"), med("bare", "job_start_to_first_step_s")
    c_step, b_step = med("container", "step_time_ms"), med("bare", "step_time_ms")
    best_ratio = min(r["step_time_ms"] for r in results["container"]) / min(r["step_time_ms"] for r in results["bare"])
    print()
    print(f"median submit->first step: dlsub+container {c_lat:.2f} s, sbatch+bare {b_lat:.2f} s "
          f"(includes dlsub's own planning: partition query, image check)")
    print(f"median job start->first step: container {c_start:.2f} s, bare {b_start:.2f} s, "
          f"Podman adds {c_start - b_start:+.2f} s")
    print(f"median step time:          container {c_step:.3f} ms, bare {b_step:.3f} ms, "
          f"ratio {c_step / b_step:.3f} ({100 * (c_step / b_step - 1):+.1f}%); "
          f"best-of-runs ratio {best_ratio:.3f}")
    print(json.dumps({"container_start_overhead_s": round(c_start - b_start, 3),
                      "step_time_ratio": round(c_step / b_step, 4),
                      "best_step_time_ratio": round(best_ratio, 4), "submit_overhead_s": round(c_lat - b_lat, 3),
                      "container_submit_to_first_step_s": round(c_lat, 3),
                      "bare_submit_to_first_step_s": round(b_lat, 3),
                      "container_step_ms": round(c_step, 4), "bare_step_ms": round(b_step, 4),
                      "repeats": args.repeats}))


if __name__ == "__main__":
    main()
