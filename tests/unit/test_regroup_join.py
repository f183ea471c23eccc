"""Unit (real processes, a real gloo group on loopback, its store held by rank 0 as under dlsub's torchrun; no
Slurm, no torchrun): a worker's process joins a running group in process (issue 52, regroup_join) — the members
keep their processes, the joiner starts through dlsub's entry point with the record rank 0 wrote, gets the state
from memory, and the group trains on at the larger size with one state; the record's checks and torchrun's
arguments for a node of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import NO_HANG_S, REPO, free_port, json_records

from dlsub import contract
from dlsub.checkpointing.regroup_join import JoinPoint, standalone, worth_joining

# A training of one linear layer in the documented shape: init_process_group, init, restore, regroup_in_process,
# and a loop that trains a step and then asks should_stop. Each step's record is one JSON line.
_SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    import torch
    import torch.distributed as dist
    from dlsub import checkpointing

    steps = int(sys.argv[1])
    # Past ``steps`` until the group is this large, and then a few steps more at that size (every member sees the
    # size change at the same step, the joiner at its first): under load a joiner may start after the members
    # would have ended, and the group must still train together after it joined.
    until_world = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    AFTER_GROWN = 5
    world = int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    run = checkpointing.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    step = 0
    state = run.restore()
    if state is not None:
        model.load_state_dict(state["model"])
        step = state["step"]
    changes = []

    def snapshot():
        return {"model": model.state_dict(), "step": step}

    def regrouped(change):
        changes.append([change.membership.world_size, change.joined])

    run.regroup_in_process(snapshot, on_change=regrouped)
    print(json.dumps({"event": "began", "pid": os.getpid(), "rank": run.rank, "world": run.world_size,
                      "step": step, "restored": state is not None}), flush=True)
    grown_at = None
    while True:
        if grown_at is None and run.world_size >= until_world:
            grown_at = step
        if step >= steps and (grown_at is not None and step >= grown_at + AFTER_GROWN or step >= 100 * steps):
            break
        g = torch.Generator().manual_seed(step * 100 + run.rank)
        model.zero_grad()
        model(torch.randn(8, 4, generator=g)).pow(2).mean().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= run.world_size
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.01 * p.grad
        step += 1
        checksum = round(float(sum(p.detach().double().sum() for p in model.parameters())), 12)
        print(json.dumps({"event": "step", "pid": os.getpid(), "rank": run.rank, "world": run.world_size,
                          "step": step, "checksum": checksum}), flush=True)
        time.sleep(0.03)
        if run.should_stop():
            sys.exit(3)
    print(json.dumps({"event": "done", "changes": changes, "step": step}), flush=True)
    dist.destroy_process_group()
""")


def test_a_process_joins_a_running_group_through_the_record_and_the_members_keep_running(tmp_path: Path) -> None:
    # Rank 0 holds the group's store (torchrun's agent shares its own with no rank under dlsub: the containers
    # set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1), so it must outlive the first group in rank 0's process.
    port = free_port()
    script = tmp_path / "train one layer.py"  # a path with a space, as users have
    script.write_text(_SCRIPT)
    job_dir = tmp_path / "job"
    base = {**os.environ, "PYTHONPATH": str(REPO), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "TORCHELASTIC_USE_AGENT_STORE": "False", "TORCHELASTIC_RUN_ID": "unit", contract.ENV_JOB_DIR: str(job_dir),
            contract.ENV_ATTEMPT: "41_0"}
    outs = [tmp_path / f"member{r}.out" for r in range(2)]
    procs = []
    for rank, out in enumerate(outs):
        with open(out, "wb") as f:
            env = {**base, "RANK": str(rank), "WORLD_SIZE": "2", contract.ENV_CONTAINER: "main"}
            procs.append(subprocess.Popen([sys.executable, str(script), "60", "3"], stdout=f, env=env))
    try:
        record = contract.regroup_record(job_dir, "41_0")
        deadline = time.monotonic() + NO_HANG_S
        while not (record.exists() and any(r["event"] == "step" for r in json_records(outs[0]))):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "the members never began"
            time.sleep(0.1)
        point, why_not = worth_joining({contract.ENV_JOB_DIR: str(job_dir), contract.ENV_ATTEMPT: "41_0"})
        assert point is not None and point.port == port, (why_not, record.read_text())
        # The joiner starts as a worker's torchrun starts it: dlsub's entry point, a group of one of its own.
        joiner_out = tmp_path / "joiner.out"
        with open(joiner_out, "wb") as f:
            env = {**base, "RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": str(free_port()),
                   contract.ENV_CONTAINER: "worker", contract.ENV_REGROUP_JOIN: point.to_json()}
            procs.append(subprocess.Popen([sys.executable, "-m", "dlsub.checkpointing.rank_output", str(script), "60",
                                           "3"],
                                          stdout=f, env=env))
        for p in procs:
            assert p.wait(timeout=NO_HANG_S) == 0
    finally:
        for p in procs:
            p.kill()
    members = [json_records(out) for out in outs]
    joined = json_records(joiner_out)
    for records in members:
        assert len({r["pid"] for r in records if "pid" in r}) == 1
        steps = [r["step"] for r in records if r["event"] == "step"]
        assert steps == list(range(1, steps[-1] + 1)) and steps[-1] >= 60, "no step repeated or skipped"
        assert records[-1]["changes"] == [[3, 1]], records[-1]
    began = joined[0]
    assert began["event"] == "began" and began["rank"] == 2 and began["world"] == 3 and began["restored"], began
    assert 0 < int(began["step"]) < steps[-1]  # type: ignore[call-overload]
    # One state: every process has the same parameters at every step, the joiner from its first.
    by_step: dict[object, set[object]] = {}
    for records in (*members, joined):
        for r in records:
            if r["event"] == "step":
                by_step.setdefault(r["step"], set()).add(r["checksum"])
    assert all(len(sums) == 1 for sums in by_step.values()), "the processes' parameters diverged"
    assert [r["step"] for r in joined if r["event"] == "step"][0] == int(began["step"]) + 1  # type: ignore[call-overload]
    assert {r["world"] for r in joined if r["event"] == "step"} == {3}
    events = [json.loads(line) for line in (job_dir / "progress.jsonl").read_text().splitlines()]
    (regrouped,) = [e for e in events if e["event"] == "regrouped"]
    assert regrouped["world_size"] == 3 and regrouped["joined"] == 1 and regrouped["nodes"] == 2, regrouped
    assert not [e for e in events if e["event"] in ("checkpoint", "restore", "exit_for_resume")], \
        "nothing was saved or read for the grow: the state came from memory"


def test_a_record_is_taken_only_when_whole_and_its_store_answers(tmp_path: Path) -> None:
    env = {contract.ENV_JOB_DIR: str(tmp_path), contract.ENV_ATTEMPT: "7_0"}
    record = contract.regroup_record(tmp_path, "7_0")
    record.parent.mkdir(parents=True)
    # None written, and the training has not reached its loop: the worker waits for it (here 0.3 s) and then joins
    # through the rendezvous; once the training is in its loop (its polls event) there is nothing to wait for.
    events = tmp_path / contract.PROGRESS_FILE
    events.write_text(json.dumps({"event": "start", "attempt": "7_0"}) + "\n")
    began = time.monotonic()
    assert worth_joining(env, wait_s=0.3)[0] is None and time.monotonic() - began >= 0.3
    with open(events, "a") as f:
        f.write("not json\n" + json.dumps({"event": "polls", "attempt": "7_0"}) + "\n")
    began = time.monotonic()
    assert worth_joining(env, wait_s=NO_HANG_S)[0] is None and time.monotonic() - began < NO_HANG_S / 2
    for hostile in ("", "{", '{"addr": "h; rm -rf ~", "port": 1, "prefix": "dlsub/regroup/1", "backend": "gloo"}',
                    '{"addr": "h", "port": 70000, "prefix": "dlsub/regroup/1", "backend": "gloo"}',
                    '{"addr": "h", "port": 5, "prefix": "../x", "backend": "gloo"}', "[1, 2]"):
        record.write_text(hostile)
        assert worth_joining(env)[0] is None, hostile
    # A whole record of a store that is gone (the group restarted since): not worth joining.
    record.write_text(JoinPoint("127.0.0.1", free_port(), "dlsub/regroup/5", "gloo").to_json())
    point, why_not = worth_joining(env)
    assert point is None and "did not answer" in why_not, why_not


def test_a_joining_worker_runs_as_a_node_of_its_own() -> None:
    args = ["--nnodes", "1:2", "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:29500",
            "--rdzv-id", "job 1", "--rdzv-conf=is_host=0,join_timeout=600", "--max-restarts", "3",
            "-m", "dlsub.checkpointing.rank_output", "train.py", "--nnodes", "9"]
    assert standalone(args, args.index("dlsub.checkpointing.rank_output")) == [
        "--standalone", "--nnodes", "1", "--max-restarts", "0", "--nproc-per-node", "2", "-m",
        "dlsub.checkpointing.rank_output", "train.py", "--nnodes", "9"]


def test_a_worker_that_cannot_join_in_process_joins_through_the_rendezvous(
        capsys: pytest.CaptureFixture[str]) -> None:
    """torchrun_main's fallback: a process that could not join leaves the marker (or, killed while it joined, its
    joining marker), the standalone torchrun fails, and the caller is told to run torchrun as it was (the
    rendezvous); a failure without a marker is the training's own and is raised as torchrun raises it. torch's
    agent's error about a process that failed joining is left out of the output; about the training's own
    failure it is not."""
    import logging
    import tempfile

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from dlsub.checkpointing import torchrun_main

    ran: list[list[str]] = []
    said: list[str] = []
    torch_logs = logging.getLogger("torch.distributed.elastic")  # below the handlers torch gives its loggers
    heard = logging.Handler()
    heard.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    torch_logs.addHandler(heard)

    def failing(args: list[str], marked: bool, killed_joining: bool = False) -> None:
        ran.append(args)
        if marked:
            contract.join_failed_marker(Path(tempfile.gettempdir()), os.getpid()).touch()
        if killed_joining:  # what join_if_told leaves of a process killed while it joined
            contract.joining_marker(Path(tempfile.gettempdir()), os.getpid(), 1234).touch()
        logging.getLogger("torch.distributed.elastic.multiprocessing.api").error(
            "failed (exitcode: %s) local_rank: 0 ... Traceback", -9 if killed_joining else 1)
        raise ChildFailedError("train.py", {0: ProcessFailure(0, 1234, -9 if killed_joining else 1, "")})

    os.environ[contract.ENV_REGROUP_JOIN] = "{}"
    assert torchrun_main._joined(lambda args: failing(args, True), ["--standalone"]) is False
    assert contract.ENV_REGROUP_JOIN not in os.environ, "the processes of the rendezvous join never see the record"
    assert not contract.join_failed_marker(Path(tempfile.gettempdir()), os.getpid()).exists()
    try:
        torchrun_main._joined(lambda args: failing(args, False), ["--standalone"])
        raise AssertionError("a training's own failure was swallowed")
    except ChildFailedError:
        pass
    os.environ[contract.ENV_REGROUP_JOIN] = "{}"
    assert torchrun_main._joined(lambda args: failing(args, False, killed_joining=True), ["--standalone"]) is False
    assert not contract.joining_marker(Path(tempfile.gettempdir()), os.getpid(), 1234).exists()
    assert torchrun_main._joined(lambda args: ran.append(args), ["--standalone"]) is True
    assert len(ran) == 4
    torch_logs.removeHandler(heard)
    assert said == ["failed (exitcode: 1) local_rank: 0 ... Traceback"], "only the training's own failure is told"
    out = capsys.readouterr().err
    assert "a process could not join (exit code 1); joining through the rendezvous instead" in out, out
    assert "a process died as it joined (killed by SIGKILL); joining through the rendezvous instead" in out, out
