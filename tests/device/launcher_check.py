"""The device check of dlsub's container side: jobs on a real GPU through dlsub's container launcher.

    python tests/device/launcher_check.py [--out DIR] [--allow-cpu]

For a machine with one CUDA GPU and torch, no Slurm and no Podman (the
``device`` machines): what each node's container runs is taken from dlsub
itself (``containers.podman.podman_run_lines``, the lines the batch script
runs under ``podman run``): dlsub's launcher (``checkpointing.launch``),
torchrun with dlsub's options, the rank entry point and the training script,
with the environment the ``--env`` lines give the container, and dlsub's
library found as the container finds it at its mount path. Only ``podman
run`` itself is left out, and Slurm's side: which node, GPUs and rendezvous
port the batch launcher hands the container are set here.

* ``one_gpu``: a job of 1 GPU (``torchrun --standalone``, NCCL at world size
  1) runs ``tests/device/gpu_train.py`` to its end: exit 0, the GPU's name
  and the step times.
* ``nccl_two_ranks``: whether NCCL takes two ranks on the one GPU (it has
  refused since NCCL 2.5, "Duplicate GPU detected"); the elastic group uses
  NCCL if it does, gloo over the CUDA tensors if not, and says which.
* ``elastic``: an elastic job (``torchrun --nnodes 1:2``, c10d rendezvous on
  loopback) trains as one process; a second member's launcher starts (an
  elastic worker's: ``--elastic --follow``) and joins: the group checkpoints,
  re-forms at world size 2, restores and trains (grow latency: the member's
  start to the first step at world size 2). Then the member is asked to
  leave with SIGUSR1 (what the agent's shrink sends): it checkpoints, leaves
  with 85, and the main re-forms at 1 (shrink latency: the signal to the
  first step at world size 1). Last the main gets SIGUSR1 (a time limit):
  it exits 85 with a checkpoint at the step it reported last.

Each check prints one line and goes into ``DIR/launcher_check.json``; exit 0
only when every check passed. ``--allow-cpu`` runs the same on CPUs and gloo.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from device_checks import Failed, expect, free_port, run_check  # noqa: E402

from dlsub import contract  # noqa: E402
from dlsub.containers.podman import LIBRARY_MOUNT, ContainerSpec, Raw, podman_run_lines  # noqa: E402

TRAIN = REPO / "tests" / "device" / "gpu_train.py"
LAUNCH = ["python3", "-P", "-m", "dlsub.checkpointing.launch"]
#: The main's and a worker's rendezvous settings, as the batch launcher gives them (slurm_plugins/launcher/roles.py).
RDZV_CONF = "is_host={},join_timeout=600,last_call_timeout=3"


def on_gpu() -> bool:
    return torch.cuda.is_available()


# ------------------------------------------------------------------ one node's container, without podman run
def container_command(spec: ContainerSpec, values: dict[str, str], lib: Path,
                      host_env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The command and environment of ``spec``'s container: the words after the image in dlsub's ``podman
    run`` lines, the batch script's variables (``"${name}"``) replaced by ``values``; the environment from
    the ``--env`` lines (``NAME=VALUE`` as written, ``NAME`` from ``host_env`` as Podman takes it from the
    batch script's), with the library's mount path standing for ``lib``."""
    words = [word for line in podman_run_lines(spec, Raw("dlsub-check"), Raw('"${gpu_args[@]}"'), [])
             for word in line]
    start = next(i for i in range(len(words)) if words[i:i + len(LAUNCH)] == LAUNCH)

    def filled(word: str) -> str:
        if not isinstance(word, Raw):
            return word
        value = re.sub(r'"?\$\{(\w+)\}"?', lambda m: values[m.group(1)], word)
        expect("$" not in value, f"unfilled shell word {word!r} in dlsub's container command")
        return value

    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR", "USER")}
    for option, word in zip(words[:start], words[1:start + 1], strict=True):
        if option != "--env":
            continue
        word = filled(word)
        name, sep, value = word.partition("=")
        if sep:
            env[name] = value.replace(LIBRARY_MOUNT, str(lib))
        elif name in host_env:
            env[name] = host_env[name]
    argv = [filled(word) for word in words[start:]]
    argv[0] = sys.executable
    return argv, env


def library_view(tmp: Path) -> Path:
    """A folder holding ``dlsub`` as the container's mount path does (the package, read through a link)."""
    lib = tmp / "lib"
    lib.mkdir()
    (lib / "dlsub").symlink_to(REPO / "dlsub")
    return lib


class Node:
    """One node's container: the launcher's process, its output in a file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], workdir: Path, log: Path) -> None:
        self.name, self.log = name, log
        self.started = time.time()
        with open(log, "wb") as out:
            self.process = subprocess.Popen(argv, env=env, cwd=workdir, stdin=subprocess.DEVNULL, stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    def signal(self, sig: signal.Signals) -> None:
        self.process.send_signal(sig)

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise Failed(f"{self.name} did not exit within {timeout:.0f} s: {self.tail()}") from None

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-2500:]

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def events(job_dir: Path) -> list[dict[str, Any]]:
    path = job_dir / contract.PROGRESS_FILE
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def wait_for(what: str, found: Callable[[], Any], nodes: list[Node], timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = found()
        if value:
            return value
        for node in nodes:
            if node.process.poll() is not None:
                raise Failed(f"{node.name} exited {node.process.returncode} while waiting for {what}: {node.tail()}")
        time.sleep(0.05)
    raise Failed(f"timed out after {timeout:.0f} s waiting for {what}: " + " | ".join(n.tail()[-800:] for n in nodes))


def first_step_at(job_dir: Path, world_size: int, after: float) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The group's start at ``world_size`` after ``after``, and the first progress after that start."""
    seen = events(job_dir)
    starts = [e for e in seen if e["event"] == contract.EVENT_START and e.get("world_size") == world_size
              and e["time"] >= after]
    if not starts:
        return None
    steps = [e for e in seen if e["event"] == contract.EVENT_PROGRESS and e["time"] >= starts[0]["time"]]
    return (starts[0], steps[0]) if steps else None


def first_after(job_dir: Path, kind: str, after: float) -> dict[str, Any] | None:
    return next((e for e in events(job_dir) if e["event"] == kind and e["time"] >= after), None)


def last_step(job_dir: Path) -> int:
    return max((e["step"] for e in events(job_dir) if e["event"] == contract.EVENT_PROGRESS), default=0)


def timings(job_dir: Path) -> list[dict[str, Any]]:
    path = job_dir / "timings.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def step_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    times = [t for r in records for t in r["step_ms"][2:]]  # the first steps warm up (kernels, allocator)
    return {"steps": sum(r["steps"] for r in records),
            "step_ms_median": round(statistics.median(times), 3) if times else None,
            "step_ms_p90": round(sorted(times)[int(0.9 * (len(times) - 1))], 3) if times else None}


class Bench:
    """The job directories, library view and the environment the batch launcher would give the containers."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.lib = library_view(tmp)
        self.host_env = {"CUDA_VISIBLE_DEVICES": "0" if on_gpu() else "",
                         # the interface the batch script picks for gloo and NCCL: loopback, both members are here
                         **{name: "lo" for name in contract.SOCKET_IFNAME_ENV}}
        #: The elastic group's backend: NCCL on a GPU unless it refuses two ranks on one (check_nccl_two_ranks).
        self.elastic_backend = "nccl" if on_gpu() else "gloo"

    def job(self, name: str) -> Path:
        job_dir = self.tmp / name
        job_dir.mkdir()
        return job_dir

    def node(self, name: str, job_dir: Path, script_args: tuple[str, ...], attempt: str, *,
             elastic: bool = False, follow: bool = False, endpoint: str = "", is_host: bool = True,
             extra_env: dict[str, str] | None = None) -> Node:
        spec = ContainerSpec(image="localhost/dlsub-torch:cuda", script=TRAIN, script_args=script_args,
                             job_dir=job_dir, workdir=job_dir, library_dir=REPO / "dlsub",
                             nnodes="1:2" if elastic else None, rendezvous_id="launcher-check", follow=follow)
        host_env = {**self.host_env, contract.ENV_JOB_DIR: str(job_dir), contract.ENV_ATTEMPT: attempt,
                    contract.ENV_CONTAINER: f"dlsub-check-{name}", contract.ENV_RDZV_ENDPOINT: endpoint}
        argv, env = container_command(spec, {"nproc": "1", "DLSUB_RDZV_ENDPOINT": endpoint,
                                             "rdzv_conf": RDZV_CONF.format(int(is_host)),
                                             "container_cuda_devices": self.host_env["CUDA_VISIBLE_DEVICES"]},
                                      self.lib, host_env)
        env.update(extra_env or {})
        return Node(name, argv, env, job_dir, self.tmp / f"{name}.log")


# ------------------------------------------------------------------ the checks
def check_one_gpu(bench: Bench) -> dict[str, Any]:
    job = bench.job("one_gpu")
    node = bench.node("one-gpu", job, ("--steps", "200"), "1")
    try:
        status = node.wait(240)
    finally:
        node.stop()
    expect(status == 0, f"the 1-GPU job's launcher exited {status}: {node.tail()}")
    runs = timings(job)
    expect(len(runs) == 1 and runs[0]["steps"] == 200 and not runs[0]["stopped"], f"the job ran {runs}")
    expect(any(e["event"] == contract.EVENT_FINISHED for e in events(job)), "no finished event")
    if on_gpu():
        expect(runs[0]["backend"] == "nccl", f"the 1-GPU job's group is {runs[0]['backend']}, not nccl")
    return {"device_name": runs[0]["device_name"], "cuda": runs[0]["cuda"], "backend": runs[0]["backend"],
            "exit": status, "wall_s": round(time.time() - node.started, 2), **step_summary(runs)}


PROBE = """
import os, torch, torch.distributed as dist
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
dist.init_process_group("nccl")
t = torch.ones(1, device="cuda")
dist.all_reduce(t)
print("NCCL all_reduce over", dist.get_world_size(), "ranks on one GPU:", t.item(), flush=True)
"""


def check_nccl_two_ranks(bench: Bench) -> dict[str, Any]:
    if not on_gpu():
        return {"nccl": None, "elastic_backend": "gloo", "why": "no GPU"}
    probe = bench.tmp / "nccl_probe.py"
    probe.write_text(PROBE)
    env = {**os.environ, "NCCL_SOCKET_IFNAME": "lo", "NCCL_DEBUG": "WARN"}
    try:
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                               "2", str(probe)], capture_output=True, text=True, timeout=120, env=env)
        output, code = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as exc:
        output, code = f"{exc.stdout or ''}{exc.stderr or ''} (timed out)", None
    refused = re.search(r"Duplicate GPU detected[^\n]*", output)
    accepted = code == 0
    bench.elastic_backend = "nccl" if accepted else "gloo"
    return {"nccl_accepted": accepted, "exit": code, "nccl_said": refused.group(0) if refused else output[-400:],
            "elastic_backend": bench.elastic_backend}


def check_elastic(bench: Bench) -> dict[str, Any]:
    job = bench.job("elastic")
    endpoint = f"127.0.0.1:{free_port()}"
    backend = bench.elastic_backend
    extra = {"GPU_CHECK_BACKEND": backend}
    args = ("--steps", "100000", "--throttle", "0.02")
    main = bench.node("main", job, args, "1", elastic=True, endpoint=endpoint, extra_env=extra)
    nodes = [main]
    try:
        wait_for("30 steps at world size 1", lambda: last_step(job) >= 30, nodes, 180)
        joined = time.time()
        worker = bench.node("worker", job, args, "1", elastic=True, follow=True, endpoint=endpoint, is_host=False,
                            extra_env=extra)
        nodes.append(worker)
        start2, step2 = wait_for("the first step at world size 2",
                                 lambda: first_step_at(job, 2, joined), nodes, 180)
        stop = first_after(job, contract.EVENT_CHECKPOINT, joined)
        restore = first_after(job, contract.EVENT_RESTORE, joined)
        expect(stop is not None and restore is not None and restore["step"] == stop["step"],
               f"the grow's checkpoint {stop} and restore {restore} differ")
        assert stop is not None and restore is not None
        grown_at = step2["step"]
        wait_for("40 steps at world size 2", lambda: last_step(job) >= grown_at + 40, nodes, 120)
        asked = time.time()
        worker.signal(signal.SIGUSR1)
        start1, step1 = wait_for("the first step at world size 1 after the shrink",
                                 lambda: first_step_at(job, 1, asked), [main], 180)
        left = worker.wait(60)
        expect(left == contract.RESUME_EXIT_CODE, f"the worker left with {left}, not {contract.RESUME_EXIT_CODE}")
        shrink_stop = first_after(job, contract.EVENT_CHECKPOINT, asked)
        shrink_restore = first_after(job, contract.EVENT_RESTORE, asked)
        expect(shrink_stop is not None and shrink_restore is not None
               and shrink_restore["step"] == shrink_stop["step"],
               f"the shrink's checkpoint {shrink_stop} and restore {shrink_restore} differ")
        assert shrink_stop is not None and shrink_restore is not None
        shrunk_at = step1["step"]
        wait_for("20 steps at world size 1 again", lambda: last_step(job) >= shrunk_at + 20, [main], 120)
        main.signal(signal.SIGUSR1)
        ended = main.wait(120)
        expect(ended == contract.RESUME_EXIT_CODE, f"the main exited {ended} after SIGUSR1: {main.tail()}")
        final = [e for e in events(job) if e["event"] == contract.EVENT_CHECKPOINT][-1]
        expect(final["step"] == last_step(job), f"the last checkpoint is at {final['step']}, the last step "
                                                f"reported {last_step(job)}")
    finally:
        for node in nodes:
            node.stop()
    runs = timings(job)
    by_world = {size: step_summary([r for r in runs if r["world_size"] == size]) for size in (1, 2)}
    expect(all(r["backend"] == backend for r in runs), f"the group's backends: {[r['backend'] for r in runs]}")
    return {
        "backend": backend, "device_name": runs[0]["device_name"] if runs else None,
        "grow": {"latency_s": round(step2["time"] - joined, 2),
                 "checkpoint_s": round(stop["time"] - joined, 2), "started_s": round(start2["time"] - joined, 2),
                 "restored_s": round(restore["time"] - joined, 2), "at_step": stop["step"]},
        "shrink": {"latency_s": round(step1["time"] - asked, 2),
                   "checkpoint_s": round(shrink_stop["time"] - asked, 2),
                   "started_s": round(start1["time"] - asked, 2),
                   "restored_s": round(shrink_restore["time"] - asked, 2), "at_step": shrink_stop["step"]},
        "stopped_at_step": final["step"], "runs": len(runs),
        "world_1": by_world[1], "world_2": by_world[2]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT") or ".", help="where launcher_check.json goes")
    parser.add_argument("--allow-cpu", action="store_true", help="run on CPU and gloo where there is no GPU")
    parser.add_argument("--keep", action="store_true", help="keep the job directories and logs (printed)")
    args = parser.parse_args()
    if not on_gpu() and not args.allow_cpu:
        parser.error("no CUDA GPU here (torch.cuda.is_available() is False); --allow-cpu runs on CPU and gloo")
    checks: dict[str, Callable[[Bench], dict[str, Any]]] = {
        "one_gpu": check_one_gpu, "nccl_two_ranks": check_nccl_two_ranks, "elastic": check_elastic}
    report: dict[str, Any] = {"device": "cuda" if on_gpu() else "cpu", "torch": torch.__version__, "checks": {}}
    failed = 0
    tmp = Path(tempfile.mkdtemp(prefix="dlsub-launcher-check."))
    bench = Bench(tmp)
    for name, check in checks.items():
        result = run_check(check, bench)
        failed += not result["passed"]
        report["checks"][name] = result
        shown = {k: v for k, v in result.items() if k != "traceback"}
        print(f"{'PASS' if result['passed'] else 'FAIL'} {name}: {json.dumps(shown, default=str)[:2500]}", flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, "launcher_check.json").write_text(json.dumps(report, indent=1, default=str))
    if args.keep:
        print(f"job directories and logs in {tmp}")
    else:
        subprocess.run(["rm", "-rf", "--", str(tmp)], check=False)
    print(f"{len(checks) - failed} passed, {failed} failed; report in {Path(args.out, 'launcher_check.json')}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
