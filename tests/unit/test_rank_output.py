"""Unit: labelled output lines with a real torchrun and real processes (no Slurm, no Podman, no GPU).

The command the batch script runs in the container (rendered by
containers/podman.py: the launcher, torchrun, dlsub's entry point, the
script) runs here in a temp dir: training processes that print at the same
moment (a barrier on files) come out line by line whole, each labelled with
its global rank (and its node in a gang of two local "nodes" joined by a c10d
rendezvous on 127.0.0.1); a partial last line survives its process's death;
one process alone is not labelled at all.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

import pytest
from conftest import NO_HANG_S, free_port

from dlsub.checkpointing.output_mux import PIPE_LINE_MAX
from dlsub.containers.podman import ContainerSpec, Raw, podman_run_words
from dlsub.job.output_lines import OutputFilter, Selection

REPO = Path(__file__).resolve().parents[2]
TORCHRUN = Path(sys.executable).parent / "torchrun"
LINES = 200

PRINTER = textwrap.dedent(
    """
    import os, signal, sys, time
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    barrier = sys.argv[1]
    open(os.path.join(barrier, f"ready-{rank}"), "w").close()
    while len([n for n in os.listdir(barrier) if n.startswith("ready-")]) < world:
        time.sleep(0.001)
    for i in range(int(sys.argv[2])):
        # Unbuffered (torchrun runs python -u): each argument, separator and newline is its own write.
        print("rank", rank, "line", i, "of", world)
        if i % 50 == 0:
            print("rank", rank, "stderr", i, file=sys.stderr)
    print(f"[{(rank + 1) % world}]:a fake label printed by rank {rank}")
    print(f"rank {rank} bar 1%\\rrank {rank} bar 50%\\rrank {rank} bar 100%")
    print(f"rank {rank} long " + "é" * int(sys.argv[3]))
    sys.stdout.write(f"rank {rank} partial, no newline")
    sys.stdout.flush()
    if rank == world - 1 and sys.argv[4] == "die":
        # The last rank dies without a newline, once the others are done (torchrun then ends the group).
        while len([n for n in os.listdir(barrier) if n.startswith("done-")]) < world - 1:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGKILL)
    open(os.path.join(barrier, f"done-{rank}"), "w").close()
    """
)


def container_command(spec: ContainerSpec, raw: dict[str, str]) -> list[str]:
    """What the rendered batch script runs inside the container, runnable here (this Python, this torchrun)."""
    words = podman_run_words(spec, Raw('"$container"'), Raw('"${gpu_args[@]}"'), [])
    command = [raw[w] if isinstance(w, Raw) else w for w in words[words.index(spec.image) + 1:]]
    local = {"python3": sys.executable, "torchrun": str(TORCHRUN)}
    return [local.get(w, w) for w in command]


def spec_for(tmp_path: Path, nproc: int, args: tuple[str, ...], nnodes: str | None = None) -> ContainerSpec:
    script = tmp_path / "printer.py"
    script.write_text(PRINTER)
    return ContainerSpec(image="img", script=script, script_args=args, job_dir=tmp_path / "job", workdir=tmp_path,
                         library_dir=REPO / "dlsub", nproc_per_node=nproc, nnodes=nnodes, rendezvous_id="r1")


def environment(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DLSUB_", "SLURM", "TORCHELASTIC", "RANK"))}
    (tmp_path / "job").mkdir(exist_ok=True)
    return dict(env, PYTHONPATH=str(REPO), DLSUB_JOB_DIR=str(tmp_path / "job"), OMP_NUM_THREADS="1", **extra)


def barrier(tmp_path: Path) -> str:
    path = tmp_path / "barrier"
    path.mkdir()
    return str(path)


def check_rank_lines(lines: list[str], label: re.Pattern[str], world: int, long_chars: int,
                     died: int | None = None) -> dict[int, set[str]]:
    """Every line is labelled and whole, each process's lines are all there in order; the nodes of each rank."""
    by_rank: dict[int, list[str]] = defaultdict(list)
    nodes: dict[int, set[str]] = defaultdict(set)
    for line in lines:
        match = label.match(line)
        assert match, f"a line without dlsub's label: {line!r}"
        if match["source"] == "dlsub":
            continue
        rank = int(match["source"])
        nodes[rank].add(match["node"] or "")
        text = line[match.end():]
        assert text.startswith((f"rank {rank} ", "[")) or set(text) == {"é"}, f"another's line as {rank}'s: {line!r}"
        by_rank[rank].append(text)
    assert sorted(by_rank) == list(range(world))
    for rank, texts in by_rank.items():
        stdout = [t for t in texts if " line " in t]
        assert stdout == [f"rank {rank} line {i} of {world}" for i in range(LINES)], f"rank {rank}'s lines"
        assert [t for t in texts if " stderr " in t] == [f"rank {rank} stderr {i}" for i in range(0, LINES, 50)]
        # stdout and stderr in the order the process wrote them (one pipe, as Slurm's output file has them).
        for i in range(0, LINES, 50):
            assert texts[texts.index(f"rank {rank} line {i} of {world}") + 1] == f"rank {rank} stderr {i}"
        assert f"[{(rank + 1) % world}]:a fake label printed by rank {rank}" in texts
        # \r ends a line as torchrun's --tee has it; the pieces of a long line carry the label each.
        assert [t for t in texts if " bar " in t] == [f"rank {rank} bar {p}" for p in ("1%", "50%", "100%")]
        assert "".join(t for t in texts if t.startswith(f"rank {rank} long ") or set(t) == {"é"}) \
            == f"rank {rank} long " + "é" * long_chars
        assert texts[-1] == f"rank {rank} partial, no newline", f"rank {rank}'s partial last line, then no more"
    return nodes


def test_four_processes_on_one_node_print_whole_lines_labelled_with_their_rank(tmp_path: Path) -> None:
    spec = spec_for(tmp_path, 4, (barrier(tmp_path), str(LINES), "3000", "live"))
    # stdout a pipe, as a gang node's into srun: lines are cut below Slurm's 1024-byte I/O message.
    proc = subprocess.run(container_command(spec, {}), cwd=tmp_path, env=environment(tmp_path),
                          capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stdout.decode()[-3000:]
    assert proc.stderr == b"", "the launcher writes everything, labelled, to stdout"
    raw = proc.stdout.split(b"\n")
    assert raw[-1] == b"" and all(len(line) + 1 <= PIPE_LINE_MAX for line in raw)
    lines = [line.decode("utf-8") for line in raw[:-1]]  # every piece of a long line is valid UTF-8
    check_rank_lines(lines, re.compile(r"\[(?P<node>)(?P<source>[0-9]|dlsub)\]:"), world=4, long_chars=3000)
    # What `dlsub logs --rank 2` keeps: rank 2's lines, its fake label too, and no line another rank labelled [2].
    out_runs = OutputFilter(Selection(rank=2)).feed(proc.stdout)
    kept = b"".join(data for batch, data in out_runs if not batch).decode().splitlines()
    assert kept and all(line.startswith("[2]:") for line in kept)
    assert "[2]:[3]:a fake label printed by rank 2" in kept
    assert not any("printed by rank 1" in line for line in kept)


def test_a_partial_last_line_survives_its_process_being_killed(tmp_path: Path) -> None:
    spec = spec_for(tmp_path, 2, (barrier(tmp_path), str(LINES), "10", "die"))
    out = tmp_path / "slurm-1.out"
    with open(out, "ab") as f:  # as Slurm opens a one-node job's output file (--open-mode=append)
        proc = subprocess.run(container_command(spec, {}), cwd=tmp_path, env=environment(tmp_path), stdout=f,
                              stderr=subprocess.STDOUT, timeout=300)
    assert proc.returncode != 0, "torchrun reports the killed process"
    lines = out.read_text().split("\n")
    assert lines[-1] == "", "the file ends with a whole line"
    check_rank_lines(lines[:-1], re.compile(r"\[(?P<node>)(?P<source>[0-9]|dlsub)\]:"), world=2, long_chars=10)
    assert any(line.startswith("[dlsub]:") and "Signal 9" in line for line in lines), "torchrun's report, labelled"


def test_a_gang_of_two_nodes_labels_lines_with_node_and_global_rank(tmp_path: Path) -> None:
    spec = spec_for(tmp_path, 2, (barrier(tmp_path), str(LINES), "10", "live"), nnodes="2")
    endpoint = f"127.0.0.1:{free_port()}"
    procs, outputs = [], []
    for index, node in enumerate(("n1", "n2")):
        command = container_command(spec, {'"${DLSUB_RDZV_ENDPOINT}"': endpoint,
                                           '"${rdzv_conf}"': f"is_host={int(index == 0)},join_timeout=120,"
                                                             "last_call_timeout=3"})
        outputs.append(tmp_path / f"{node}.out")
        with open(outputs[-1], "ab") as f:
            procs.append(subprocess.Popen(command, cwd=tmp_path, stdout=f, stderr=subprocess.STDOUT,
                                          env=environment(tmp_path, DLSUB_NNODES="2", SLURMD_NODENAME=node)))
    try:
        codes = [p.wait(timeout=300) for p in procs]
    finally:
        for p in procs:
            p.kill()
    text = "".join(o.read_text() for o in outputs)
    assert codes == [0, 0], text[-3000:]
    label = re.compile(r"\[(?P<node>n1|n2)/(?P<source>[0-9]|dlsub)\]:")
    nodes = check_rank_lines(text.splitlines(), label, world=4, long_chars=10)
    assert all(len(n) == 1 for n in nodes.values()), "a rank's lines name one node"
    assert sorted(n for ns in nodes.values() for n in ns) == ["n1", "n1", "n2", "n2"]
    for node, output in zip(("n1", "n2"), outputs, strict=True):
        assert all(line.startswith(f"[{node}/") for line in output.read_text().splitlines())


def test_one_process_alone_writes_exactly_what_its_script_writes(tmp_path: Path) -> None:
    script = tmp_path / "alone.py"
    script.write_text('import sys\nprint("one", 1, "[3]:x")\nprint("err", file=sys.stderr)\n'
                      'print("a\\rb")\nsys.stdout.write("partial")\n')
    spec = ContainerSpec(image="img", script=script, script_args=(), job_dir=tmp_path / "job", workdir=tmp_path,
                         library_dir=REPO / "dlsub", nproc_per_node=1)
    env = environment(tmp_path)
    with_dlsub = subprocess.run(container_command(spec, {}), cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, timeout=120)
    plain = subprocess.run([sys.executable, "-u", str(script)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=NO_HANG_S)
    assert with_dlsub.returncode == 0
    assert with_dlsub.stdout == plain.stdout == b"one 1 [3]:x\nerr\na\rb\npartial"
    # A failure: torchrun's report names the script, as it did before dlsub's entry point existed.
    script.write_text("raise SystemExit(3)\n")
    failed = subprocess.run(container_command(spec, {}), cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=120)
    assert failed.returncode == 1 and f"{script} FAILED" in failed.stdout and "[dlsub]" not in failed.stdout


@pytest.mark.parametrize("nproc", [2])
def test_without_the_launcher_the_entry_point_only_runs_the_script(tmp_path: Path, nproc: int) -> None:
    # torchrun run by hand (no $DLSUB_OUTPUT_SOCKET): the processes write unlabelled, as before.
    script = tmp_path / "hello.py"
    # One write per line: unlabelled lines of two processes may interleave where a print makes several writes
    # (unbuffered, "hello from" and " 0" went out apart under load), and no line should here.
    script.write_text('import os, sys\nsys.stdout.write(f"hello from {os.environ[\'RANK\']}\\n")\n')
    proc = subprocess.run([str(TORCHRUN), "--standalone", "--nnodes", "1", "--nproc-per-node", str(nproc),
                           "-m", "dlsub.checkpointing.rank_output", str(script)], cwd=tmp_path,
                          env=environment(tmp_path), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["hello from 0", "hello from 1"]


def test_the_launcher_labels_only_several_processes_started_through_the_entry_point(tmp_path: Path) -> None:
    script = tmp_path / "say.py"
    script.write_text('print("said")\n')
    env = environment(tmp_path)

    def launch(*argv: str) -> str:
        return subprocess.run([sys.executable, "-m", "dlsub.checkpointing.launch", *argv], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=NO_HANG_S).stdout

    entry = ["-m", "dlsub.checkpointing.rank_output"]
    # One process: the entry point is dropped, the script runs as it always has.
    assert launch("--nproc-per-node", "1", "--", sys.executable, *entry, str(script)) == "said\n"
    # A script rendered before labels existed (no entry point) runs as it did, even with several processes.
    assert launch("--nproc-per-node", "2", "--", sys.executable, str(script)) == "said\n"
    # With the entry point and several processes (here one, RANK set by hand): labelled.
    env["RANK"] = "5"
    assert launch("--nproc-per-node", "2", "--", sys.executable, *entry, str(script)) == "[5]:said\n"


def test_the_entry_point_runs_the_script_as_python_would_and_ends_its_group_after_its_exit_handlers(
        tmp_path: Path) -> None:
    """Real gloo group of one: the script is ``__main__`` with its own argv and directory first on sys.path,
    its exit handlers still see its group alive, and the entry point destroys the group after them, before
    the interpreter finalizes (a group left alive can kill a process with SIGABRT at exit)."""
    script = tmp_path / "dir with space" / "train.py"
    script.parent.mkdir()
    (script.parent / "helper_mod.py").write_text("VALUE = 'imported from the script directory'\n")
    script.write_text(textwrap.dedent("""
        import atexit, sys
        import torch, torch.distributed as dist
        import helper_mod
        destroy = dist.destroy_process_group
        def spy(*args, **kwargs):
            print("destroyed, alive before:", dist.is_initialized())
            return destroy(*args, **kwargs)
        dist.destroy_process_group = spy
        dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
        t = torch.ones(1)
        dist.all_reduce(t)
        atexit.register(lambda: print("the script's exit handler sees the group:", dist.is_initialized()))
        print(__name__, sys.argv[1:], helper_mod.VALUE)
    """))
    store = tmp_path / "store"
    proc = subprocess.run([sys.executable, "-u", "-m", "dlsub.checkpointing.rank_output", str(script), str(store),
                           "x;y"], cwd=tmp_path, env=environment(tmp_path), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        f"__main__ [{str(store)!r}, 'x;y'] imported from the script directory",
        "the script's exit handler sees the group: True",
        "destroyed, alive before: True",
    ], proc.stdout + proc.stderr
    # A script's failure is still the process's: its exception and exit status.
    script.write_text("raise SystemExit(3)\n")
    failed = subprocess.run([sys.executable, "-u", "-m", "dlsub.checkpointing.rank_output", str(script)],
                            cwd=tmp_path, env=environment(tmp_path), capture_output=True, text=True, timeout=NO_HANG_S)
    assert failed.returncode == 3, failed.stderr
