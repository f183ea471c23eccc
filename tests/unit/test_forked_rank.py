"""Unit (real torchrun, real processes on loopback; no Slurm, no Podman): torchrun run by dlsub's torchrun_main forks
each training process from itself (torch already imported) and the process is the one torchrun would have started:
the script as ``__main__`` with its arguments, default signal handlers, unbuffered output, its exit handlers run, its
exit code kept. ``DLSUB_RANK_START=exec`` starts each as a Python of its own, as torchrun does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import NO_HANG_S, REPO

from dlsub.checkpointing import forked_rank
from dlsub.checkpointing.launch import ENTRY_POINT as RANK_ENTRY
from dlsub.checkpointing.torchrun_main import ENV_RANK_START, forking, threads_per_process

pytest.importorskip("torch")

SCRIPT = textwrap.dedent(
    """
    import atexit, json, os, signal, sys
    torch_before = "torch" in sys.modules  # imported by the process it was forked from, or not
    dynamo_before = "torch._dynamo" in sys.modules  # what DistributedDataParallel imports, likewise
    exit_handlers = atexit._ncallbacks()  # before the script registers any

    def sockets():  # internet sockets open in this process, before it made any
        import socket, stat
        out = []
        for fd in map(int, os.listdir("/proc/self/fd")):
            try:
                if fd > 2 and stat.S_ISSOCK(os.fstat(fd).st_mode):
                    out.append(socket.socket(fileno=os.dup(fd)).family.name)
            except OSError:
                pass
        return [f for f in out if f in ("AF_INET", "AF_INET6")]

    import torch
    rank = int(os.environ["RANK"])
    here = os.path.dirname(os.path.abspath(__file__))
    out = os.path.join(here, f"atexit-{rank}")
    atexit.register(lambda: open(out, "w").write("ran"))
    defaults = [signal.getsignal(s) == signal.SIG_DFL for s in (signal.SIGTERM, signal.SIGUSR1)]
    seen = {"rank": rank, "torch_before": torch_before, "dynamo_before": dynamo_before, "name": __name__,
            "argv": sys.argv, "exit_handlers": exit_handlers,
            "defaults": defaults, "sigint": signal.getsignal(signal.SIGINT) == signal.default_int_handler,
            "world": os.environ["WORLD_SIZE"], "sockets": sockets(),
            "threads": [os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads()]}
    open(os.path.join(here, f"rank-{rank}.json"), "w").write(json.dumps(seen))
    print("training", rank)
    if rank == 1 and os.environ.get("UNFLUSHED"):
        sys.stdout.write("unflushed")  # as under python -u: in the pipe at once, with no flush and no exit
        os._exit(3)
    if rank == 1 and os.environ.get("EXIT_CODE"):
        sys.exit(int(os.environ["EXIT_CODE"]))
    """
)


def _torchrun(tmp_path: Path, nproc: int, entry: bool = True, **env: str) -> subprocess.CompletedProcess[str]:
    """torchrun_main as the launcher runs it: the entry point before the script, or not (a process alone)."""
    script = tmp_path / "my script; 'quoted'.py"
    script.write_text(SCRIPT)
    return subprocess.run(
        [sys.executable, "-P", "-m", "dlsub.checkpointing.torchrun_main", "--standalone", "--nnodes", "1",
         "--nproc-per-node", str(nproc), *(RANK_ENTRY if entry else []), str(script), "--lr", "0.1"],
        env={**_outside_slurm(), "PYTHONPATH": str(REPO), "PYTHONSAFEPATH": "1", **env}, cwd=tmp_path,
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=NO_HANG_S)


def _outside_slurm() -> dict[str, str]:
    """This environment without what would set the processes' threads (a Slurm job's CPUs, OpenMP's own)."""
    return {k: v for k, v in os.environ.items() if k not in ("SLURM_CPUS_ON_NODE", "OMP_NUM_THREADS")}


def _ranks(tmp_path: Path, nproc: int = 2) -> list[dict[str, object]]:
    """What each process saw, in a file of its own (their lines on one pipe could interleave)."""
    return [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in range(nproc)]


def test_each_process_is_forked_with_torch_imported_and_runs_as_a_fresh_one(tmp_path: Path) -> None:
    done = _torchrun(tmp_path, 2)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = _ranks(tmp_path)
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["world"] == "2" for r in ranks)
    script = str(tmp_path / "my script; 'quoted'.py")
    for r in ranks:
        assert r["torch_before"] is True, "forked from torchrun, where torch was imported"
        assert r["dynamo_before"] is True, "and what DistributedDataParallel imports"
        assert r["name"] == "__main__" and r["argv"] == [script, "--lr", "0.1"], r
        assert r["defaults"] == [True, True] and r["sigint"], "torchrun's handlers are not the script's"
        assert r["threads"] == ["1", 1], "torch's CPU threads as torchrun set them for several processes"
        assert r["sockets"] == [], "none of torchrun's sockets (its stores listen): a fresh process has none"
        assert (tmp_path / f"atexit-{r['rank']}").read_text() == "ran", "the script's exit handlers ran"


def test_each_process_gets_its_share_of_the_cpus_slurm_gave_the_job_on_the_node(tmp_path: Path) -> None:
    """6 CPUs on the node, 2 processes: 3 threads each, where torchrun alone gives each one."""
    done = _torchrun(tmp_path, 2, SLURM_CPUS_ON_NODE="6")
    assert done.returncode == 0, done.stderr[-3000:]
    assert [r["threads"] for r in _ranks(tmp_path)] == [["3", 3], ["3", 3]]


@pytest.mark.parametrize(("environ", "nproc", "threads"), [
    ({"SLURM_CPUS_ON_NODE": "8"}, "1", 8),
    ({"SLURM_CPUS_ON_NODE": "8"}, "3", 2),
    ({"SLURM_CPUS_ON_NODE": "2"}, "4", 1),
    ({"SLURM_CPUS_ON_NODE": "8", "OMP_NUM_THREADS": "5"}, "1", None),  # the user's, the site's or the image's
    ({}, "2", None),  # not in a Slurm job: torchrun's own rule
    ({"SLURM_CPUS_ON_NODE": "8"}, "auto", None),
    ({"SLURM_CPUS_ON_NODE": "0"}, "1", None),
])
def test_threads_per_process(environ: dict[str, str], nproc: str, threads: int | None) -> None:
    """Unit, pure."""
    assert threads_per_process(environ, nproc) == threads


def test_a_process_alone_is_forked_too_and_runs_its_script_as_python_would(tmp_path: Path) -> None:
    """One process has no entry point in its command (its output is not labelled): forked all the same, it saves
    the interpreter's start and torch's import, and nothing of a group's (DistributedDataParallel's imports)."""
    done = _torchrun(tmp_path, 1, entry=False)
    assert done.returncode == 0, done.stderr[-3000:]
    (alone,) = _ranks(tmp_path, 1)
    assert alone["torch_before"] is True and alone["dynamo_before"] is False, alone
    assert alone["name"] == "__main__" and alone["argv"] == [str(tmp_path / "my script; 'quoted'.py"), "--lr", "0.1"]
    assert alone["defaults"] == [True, True] and alone["sockets"] == [], alone
    assert "training 0" in done.stdout and "[0]" not in done.stdout, "its lines unlabelled, as before"
    assert (tmp_path / "atexit-0").read_text() == "ran"


def test_a_process_alone_imports_the_modules_beside_its_script(tmp_path: Path) -> None:
    """As ``python SCRIPT`` does: the script's folder first on sys.path (torchrun runs with -P, and the launcher sets
    no PYTHONSAFEPATH for a process alone), and no PYTHONSAFEPATH of dlsub's in its environment."""
    (tmp_path / "beside.py").write_text("VALUE = 'found beside'\n")
    script = tmp_path / "uses it.py"
    script.write_text("import os, beside\nprint(beside.VALUE, os.environ.get('PYTHONSAFEPATH'))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    done = subprocess.run(
        [sys.executable, "-P", "-m", "dlsub.checkpointing.torchrun_main", "--standalone", "--nnodes", "1",
         "--nproc-per-node", "1", str(script)],
        env={**env, "PYTHONPATH": str(REPO)}, cwd="/", stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=NO_HANG_S)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "found beside None" in done.stdout


def test_a_process_alone_exits_with_its_scripts_code(tmp_path: Path) -> None:
    script = tmp_path / "fails.py"
    script.write_text("import sys\nprint('about to fail')\nsys.exit(85)\n")
    done = subprocess.run(
        [sys.executable, "-P", "-m", "dlsub.checkpointing.torchrun_main", "--standalone", "--nnodes", "1",
         "--nproc-per-node", "1", str(script)],
        env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONSAFEPATH": "1"}, cwd=tmp_path,
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=NO_HANG_S)
    assert done.returncode != 0 and "exitcode: 85" in done.stderr, done.stderr[-3000:]
    assert "about to fail" in done.stdout


def test_output_is_unbuffered(tmp_path: Path) -> None:
    done = _torchrun(tmp_path, 2, UNFLUSHED="1")
    assert "exitcode: 3" in done.stderr and "unflushed" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]


def test_an_exit_code_is_the_scripts(tmp_path: Path) -> None:
    done = _torchrun(tmp_path, 2, EXIT_CODE="85")
    assert done.returncode != 0
    assert "exitcode: 85" in done.stderr, done.stderr[-3000:]
    assert (tmp_path / "atexit-1").read_text() == "ran", "exit handlers run before sys.exit's code is taken"


def test_exec_starts_each_process_as_a_python_of_its_own(tmp_path: Path) -> None:
    done = _torchrun(tmp_path, 2, **{ENV_RANK_START: "exec"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert [(r["torch_before"], r["dynamo_before"]) for r in _ranks(tmp_path)] == [(False, False)] * 2


def test_a_forked_process_has_the_exit_handlers_of_what_torchrun_imported_for_it(tmp_path: Path) -> None:
    """torchrun's own exit handlers are dropped in a forked process, those of the modules it imported for the
    processes (torch._dynamo's) are not: a process that imported them itself would have them."""
    count = "import atexit, torch; n = atexit._ncallbacks(); import torch._dynamo; print(atexit._ncallbacks() - n)"
    of_imports = int(subprocess.run([sys.executable, "-c", count], capture_output=True, text=True, check=True,
                                    timeout=NO_HANG_S).stdout)
    (tmp_path / "exec").mkdir()
    (tmp_path / "fork").mkdir()
    for how in ("exec", "fork"):
        done = _torchrun(tmp_path / how, 2, **({ENV_RANK_START: "exec"} if how == "exec" else {}))
        assert done.returncode == 0, done.stderr[-3000:]
    fresh = [r["exit_handlers"] for r in _ranks(tmp_path / "exec")]
    assert [r["exit_handlers"] for r in _ranks(tmp_path / "fork")] == [n + of_imports for n in fresh]


def test_only_dlsubs_entry_point_is_forked(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.distributed import run as torch_run
    from torch.distributed.elastic.multiprocessing import api

    # What forking() changes in this process for the torchrun it runs next, put back after.
    monkeypatch.setattr(api.MultiprocessContext, "_start", api.MultiprocessContext._start)
    monkeypatch.setattr(torch_run, "run_script_path", torch_run.run_script_path)
    ours = ["--standalone", "--nproc-per-node", "2", *RANK_ENTRY, "train.py", "-m", "x"]
    assert forking(ours) == ["--standalone", "--nproc-per-node", "2", "--run-path", "--start-method", "fork",
                             os.path.abspath(forked_rank.__file__), "train.py", "-m", "x"]
    theirs = ["--standalone", "--nproc-per-node", "2", "train.py"]
    assert forking(theirs) == theirs
    alone = ["--standalone", "--nnodes", "1", "--nproc-per-node", "1", "train.py", "--nproc-per-node", "2"]
    assert forking(alone) == [*alone[:5], "--run-path", "--start-method", "fork",
                              os.path.abspath(forked_rank.__file__), *alone[5:]]
    for not_a_script in (["--nproc-per-node", "1", "-m", "pkg.train"], ["--nproc-per-node", "1", "--no-python", "x"],
                         ["--nnodes", "1:2", "--nproc-per-node", "1", "train.py"]):
        assert forking(not_a_script) == not_a_script
    monkeypatch.setenv(ENV_RANK_START, "exec")
    assert forking(ours) == ours and forking(alone) == alone



STOPPED_BY_TORCHRUN = textwrap.dedent(
    """
    import os, time
    from dlsub import checkpointing
    run = checkpointing.init()
    if os.environ["RANK"] == "1":
        time.sleep(1)
        os._exit(3)  # a failure while the other trains: torchrun stops that one with SIGTERM
    while not run.should_stop():
        time.sleep(0.05)
    print("stopped by", run.stop_reason, flush=True)
    """
)


def test_a_process_torchrun_stops_with_sigterm_leaves_as_soon_as_it_has_ended(tmp_path: Path) -> None:
    """The training takes torchrun's SIGTERM as "checkpoint and stop" and ends; forked, it then waited for torchrun to
    read its return value, which torchrun closing the group never does, until SIGKILL 30 s on (every grow)."""
    script = tmp_path / "trains.py"
    script.write_text(STOPPED_BY_TORCHRUN)
    done = subprocess.run(
        [sys.executable, "-P", "-m", "dlsub.checkpointing.torchrun_main", "--standalone", "--nnodes", "1",
         "--nproc-per-node", "2", *RANK_ENTRY, str(script)],
        env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONSAFEPATH": "1", "DLSUB_JOB_DIR": str(tmp_path / "job")},
        cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=NO_HANG_S)
    assert "stopped by SIGTERM" in done.stdout, done.stdout[-2000:] + done.stderr[-3000:]
    assert "exitcode  : 3" in done.stderr, done.stderr[-3000:]
    assert "SIGKILL" not in done.stderr, "it left by itself, torchrun did not have to kill it"
