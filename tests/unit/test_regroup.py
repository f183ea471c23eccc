"""Unit (real processes, a real gloo group on loopback, a real TCPStore; no Slurm, no torchrun): a group
re-forms in process (issue 52) — the ranks that stay keep their pids and their state, a rank leaves, a process
joins and gets the state from memory, and a joiner that dies mid-way ends in RegroupFailed with the state intact.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from conftest import NO_HANG_S, REPO, free_port, json_records, ranks_ended, run_ranks

from dlsub import contract

# A data-parallel "training" of one linear layer: each step every rank computes a gradient on data of its own
# (seeded by step and rank), the gradients are averaged with an all-reduce and applied. Every line of output
# is one JSON record; the test reads them.
_TRAINER = textwrap.dedent("""
    import json, os, signal, sys, time
    from datetime import timedelta
    import torch
    import torch.distributed as dist
    from dlsub.checkpointing.regroup import ElasticGroup, RegroupFailed

    role, leave_at, timeout_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    port = int(os.environ["MASTER_PORT"])

    def say(**record):
        print(json.dumps({"pid": os.getpid(), **record}), flush=True)

    if role == "member":
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        store = dist.TCPStore("127.0.0.1", port, is_master=rank == 0, timeout=timedelta(seconds=timeout_s),
                              wait_for_workers=False)
        dist.init_process_group("gloo", store=dist.PrefixStore("first", store), rank=rank, world_size=world)
        group = ElasticGroup.member(store, timeout_s=timeout_s)
        terminated = []  # SIGTERM, as torchrun stops its processes: only a flag, as dlsub's Run sets one
        signal.signal(signal.SIGTERM, lambda *_: terminated.append(1))
        group.interrupted = lambda: bool(terminated)
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        step, joined_at, joining = 0, None, False
    else:
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=timeout_s))
        group, change = ElasticGroup.join(store, timeout_s=timeout_s)
        model = torch.nn.Linear(4, 1)
        model.load_state_dict(change.state["model"])
        step = joined_at = change.state["step"]
        joining = True  # join() returns where the members' reform() does: at this step's training
        say(event="joined", step=step, rank=change.membership.rank, world=change.membership.world_size)

    def checksum():
        return round(float(sum(p.detach().double().sum() for p in model.parameters())), 12)

    while joined_at is None or step < joined_at + 20:
        if step == leave_at and group.membership.rank == 1 and role == "member":
            group.leave()
        if not joining and group.due():
            try:
                change = group.reform(lambda: {"model": model.state_dict(), "step": step})
            except RegroupFailed as exc:
                say(event="fallback", step=step, checksum=checksum(), error=str(exc)[:200])
                sys.exit(0)
            if change.left:
                say(event="left", step=step)
                sys.exit(0)
            if change.joined:
                joined_at = step
            say(event="reformed", step=step, rank=change.membership.rank, world=change.membership.world_size,
                paused_s=change.paused_s)
        joining = False
        g = torch.Generator().manual_seed(step * 100 + group.membership.rank)
        x = torch.randn(8, 4, generator=g)
        model.zero_grad()
        model(x).pow(2).mean().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= group.membership.world_size
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.01 * p.grad
        step += 1
        say(event="step", step=step, rank=group.membership.rank, world=group.membership.world_size,
            checksum=checksum())
        time.sleep(0.02)
    dist.destroy_process_group()
""")

# A process that asks to join and dies before the group forms (kill -9 mid-way).
# Joins through the library with its failpoint set: it dies (SIGKILL) once the members have planned its place.
_DYING_JOINER = textwrap.dedent("""
    import os
    from datetime import timedelta
    import torch.distributed as dist
    from dlsub.checkpointing.regroup import ElasticGroup

    store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timedelta(seconds=60))
    ElasticGroup.join(store)
    print("joined", flush=True)
""")


def _start(script: str, args: list[str], env: dict[str, str], out: Path) -> subprocess.Popen[bytes]:
    with open(out, "wb") as f:
        return subprocess.Popen([sys.executable, "-c", script, *args], stdout=f,
                                env={**os.environ, "PYTHONPATH": str(REPO), **env})


def _wait_for(predicate: object, procs: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + NO_HANG_S
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "hung"
        assert all(p.poll() in (None, 0) for p in procs), [p.poll() for p in procs]
        time.sleep(0.1)


Members = tuple[list[Path], list[subprocess.Popen[bytes]], dict[str, str]]


def _members(tmp_path: Path, world: int, leave_at: int, timeout_s: float) -> Members:
    """``world`` member processes of generation 0 on a fresh port: their output files, processes and env."""
    env = {"MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world)}
    outs = [tmp_path / f"rank{r}.out" for r in range(world)]
    procs = [_start(_TRAINER, ["member", str(leave_at), str(timeout_s)], {**env, "RANK": str(r)}, outs[r])
             for r in range(world)]
    return outs, procs, env


def test_a_rank_leaves_and_a_process_joins_while_the_ranks_that_stay_keep_running(tmp_path: Path) -> None:
    outs, procs, env = _members(tmp_path, 3, leave_at=5, timeout_s=NO_HANG_S)
    try:
        _wait_for(lambda: any(r["event"] == "left" for r in json_records(outs[1])), procs)
        joiner_out = tmp_path / "joiner.out"
        procs.append(_start(_TRAINER, ["joiner", "-1", str(NO_HANG_S)], env, joiner_out))
        for p in procs:
            assert p.wait(timeout=NO_HANG_S) == 0
    finally:
        for p in procs:
            p.kill()
    stayed = [json_records(outs[0]), json_records(outs[2])]
    left, joined = json_records(outs[1]), json_records(joiner_out)

    # The rank that left did so at the step it asked, and the group re-formed without it.
    assert left[-1]["event"] == "left" and left[-1]["step"] == 5
    for records in stayed:
        assert len({r["pid"] for r in records}) == 1, "a rank that stays keeps its process"
        steps = [r["step"] for r in records if r["event"] == "step"]
        assert steps == list(range(1, steps[-1] + 1)), "no step repeated or skipped"
        worlds = [r["world"] for r in records if r["event"] == "reformed"]
        assert worlds == [2, 3], worlds
    # Old rank 2 is rank 1 of the two that stayed, and the joiner takes the next place.
    assert [r["rank"] for r in stayed[1] if r["event"] == "reformed"] == [1, 1]
    assert joined[0]["event"] == "joined" and joined[0]["rank"] == 2 and joined[0]["world"] == 3

    # The state is one: every member has the same parameters at every step, the joiner from its first.
    by_step: dict[object, set[object]] = {}
    for records in (*stayed, left, joined):
        for r in records:
            if r["event"] == "step":
                by_step.setdefault(r["step"], set()).add(r["checksum"])
    assert all(len(sums) == 1 for sums in by_step.values()), "the ranks' parameters diverged"
    joined_steps = [r["step"] for r in joined if r["event"] == "step"]
    assert joined_steps[0] == joined[0]["step"] + 1, "the joiner carried on from the members' step"


def _kill_a_joiner(outs: list[Path], procs: list[subprocess.Popen[bytes]], env: dict[str, str]) -> None:
    """Once the members train, a process joins them and is killed (-9) once they planned its place."""
    from dlsub.checkpointing.regroup import FAILPOINT_ENV

    _wait_for(lambda: any(r["event"] == "step" for r in json_records(outs[0])), procs)
    dying = subprocess.run([sys.executable, "-c", _DYING_JOINER], capture_output=True, text=True,
                           env={**os.environ, **env, "PYTHONPATH": str(REPO), FAILPOINT_ENV: "joining:planned"},
                           timeout=NO_HANG_S, check=False)
    assert dying.returncode == -signal.SIGKILL and "joined" not in dying.stdout, dying


def test_a_joiner_killed_mid_way_leaves_the_members_to_fall_back_with_their_state(tmp_path: Path) -> None:
    """kill -9 of a joining process once the members planned its place (``joining:planned``): they cannot form
    the new group, and fall back with the state of their last step."""
    outs, procs, env = _members(tmp_path, 2, leave_at=-1, timeout_s=5.0)
    try:
        _kill_a_joiner(outs, procs, env)
        for p in procs:
            assert p.wait(timeout=NO_HANG_S) == 0
    finally:
        for p in procs:
            p.kill()
    ends = [json_records(out)[-1] for out in outs]
    assert [e["event"] for e in ends] == ["fallback", "fallback"], ends
    assert "2 of 3 members of the new group came within the timeout" in str(ends[0]["error"]), ends
    last_steps = [[r for r in json_records(out) if r["event"] == "step"][-1] for out in outs]
    # Both hold the state of the last step they took, the same on both: the checkpoint of the fallback is whole.
    assert ends[0]["checksum"] == ends[1]["checksum"] == last_steps[0]["checksum"] == last_steps[1]["checksum"]
    assert ends[0]["step"] == last_steps[0]["step"]


def test_members_waiting_for_a_killed_joiner_give_up_when_told_to_stop(tmp_path: Path) -> None:
    """The joiner killed once the members planned its place, then SIGTERM to the members (what their torchrun
    does when the worker joins its rendezvous instead): they give up the wait at once, not at the timeout (60 s
    here; torchrun kills what has not exited 30 s after its SIGTERM), with the state of their last step."""
    outs, procs, env = _members(tmp_path, 2, leave_at=-1, timeout_s=60.0)
    try:
        _kill_a_joiner(outs, procs, env)
        told = time.monotonic()
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            assert p.wait(timeout=NO_HANG_S) == 0
        waited_s = time.monotonic() - told
    finally:
        for p in procs:
            p.kill()
    ends = [json_records(out)[-1] for out in outs]
    assert [e["event"] for e in ends] == ["fallback", "fallback"], ends
    assert all("stopped while" in str(e["error"]) for e in ends), ends
    assert waited_s < 60, "they gave up when told, not at the timeout"


# ---------------------------------------------------------------- the library's side: Run.regroup_in_process

_RUN_RANK = textwrap.dedent("""
    import json, os, signal, sys
    import torch
    import torch.distributed as dist
    from dlsub import checkpointing

    dist.init_process_group("gloo")
    run = checkpointing.init(sys.argv[1])
    changes = []
    assert run.regroup_in_process(lambda: {"step": 3}, on_change=lambda change: changes.append(change.membership))
    pid = os.getpid()
    if run.rank == int(sys.argv[2]):
        os.kill(pid, signal.SIGUSR2)  # the launcher's leave request (contract.LEAVE_SIGNAL)
    stop = run.should_stop()
    if stop:
        run.save({"step": 3})  # what the documented loop does: writes nothing on a rank that left
        print(json.dumps({"stop": True, "reason": run.stop_reason}), flush=True)
        run.exit_for_resume()
    total = torch.tensor([1])
    dist.all_reduce(total)  # the new group works
    print(json.dumps({"stop": False, "rank": run.rank, "world": run.world_size, "summed": int(total.item()),
                      "changes": [[m.rank, m.world_size] for m in changes], "pid_kept": pid == os.getpid()}))
""")


def test_a_rank_asked_to_leave_leaves_and_the_others_go_on_in_a_smaller_group(tmp_path: Path) -> None:
    from dlsub.checkpointing.run import STOP_LEFT

    job = tmp_path / "job"
    # For the ranks' parent, torchrun's stand-in here.
    marker = contract.left_in_process_marker(Path(tempfile.gettempdir()), os.getpid())
    under_torchrun = {"TORCHELASTIC_RUN_ID": "unit"}  # a rank that leaves exits 0, and tells its parent
    try:
        outs = [json.loads(line) for line in run_ranks(_RUN_RANK, [str(job), "1"], [under_torchrun] * 3)]
        assert marker.exists(), "the rank that left told its torchrun, which takes its node out of the rendezvous"
    finally:
        marker.unlink(missing_ok=True)
    assert outs[1] == {"stop": True, "reason": STOP_LEFT}
    assert outs[0] == {"stop": False, "rank": 0, "world": 2, "summed": 2, "changes": [[0, 2]], "pid_kept": True}
    assert outs[2] == {"stop": False, "rank": 1, "world": 2, "summed": 2, "changes": [[1, 2]], "pid_kept": True}
    events = [json.loads(line) for line in (job / "progress.jsonl").read_text().splitlines()]
    regrouped = [e for e in events if e["event"] == "regrouped"]
    assert len(regrouped) == 1 and regrouped[0]["world_size"] == 2 and regrouped[0]["left"] == 1
    assert not any(e["event"] in ("checkpoint", "exit_for_resume") for e in events), \
        "nothing was checkpointed: the group went on from memory"


def test_a_rank_killed_during_the_re_formation_ends_in_the_restart_with_its_checkpoint(tmp_path: Path) -> None:
    """kill -9 during the re-formation: of the rank that leaves, or one that stays, before they all know the plan,
    and the group falls back (every rank that lives stops with "regroup-failed", rank 0 checkpoints); of the rank
    that leaves once it has left the old group, and the others re-form without it as if it had exited."""
    from dlsub.checkpointing.regroup import FAILPOINT_ENV
    from dlsub.checkpointing.run import STOP_REGROUP_FAILED

    torchrun = {"TORCHELASTIC_RUN_ID": "unit"}
    marker = contract.left_in_process_marker(Path(tempfile.gettempdir()), os.getpid())
    try:
        job = tmp_path / "agreed"
        dies = {**torchrun, FAILPOINT_ENV: "leaving:agreed"}
        ends = ranks_ended(_RUN_RANK, [str(job), "1"], [torchrun, dies, torchrun])
        assert ends[1][0] == -signal.SIGKILL
        assert [(code, json.loads(line)) for code, line in (ends[0], ends[2])] == \
            [(0, {"stop": True, "reason": STOP_REGROUP_FAILED})] * 2
        events = [json.loads(line)["event"] for line in (job / "progress.jsonl").read_text().splitlines()]
        assert "checkpoint" in events and "exit_for_resume" in events and "regrouped" not in events

        # A rank that stays dies once they agreed: the same fallback, for the one leaving too.
        job = tmp_path / "staying"
        dies = {**torchrun, FAILPOINT_ENV: "staying:agreed"}
        ends = ranks_ended(_RUN_RANK, [str(job), "1"], [torchrun, torchrun, dies])
        assert ends[2][0] == -signal.SIGKILL
        assert [(code, json.loads(line)) for code, line in ends[:2]] == \
            [(0, {"stop": True, "reason": STOP_REGROUP_FAILED})] * 2
        assert "checkpoint" in (job / "progress.jsonl").read_text()

        job = tmp_path / "left"
        dies = {**torchrun, FAILPOINT_ENV: "leaving:left-the-old-group"}
        ends = ranks_ended(_RUN_RANK, [str(job), "1"], [torchrun, dies, torchrun])
        assert ends[1][0] == -signal.SIGKILL
        assert [json.loads(line)["world"] for _, line in (ends[0], ends[2])] == [2, 2]
        assert [code for code, _ in (ends[0], ends[2])] == [0, 0]
    finally:
        marker.unlink(missing_ok=True)


def test_rank_0_may_leave_and_then_it_writes_nothing_of_the_jobs(tmp_path: Path) -> None:
    """torchrun numbers the nodes of a round in no fixed order, so the worker that leaves may hold rank 0: it then
    writes no resume marker and no event (the job would be requeued after it finished), and the lowest rank that
    stays is rank 0 of the new group and writes the re-formation's event."""
    job = tmp_path / "job"
    marker = contract.left_in_process_marker(Path(tempfile.gettempdir()), os.getpid())
    try:
        under_torchrun = {"TORCHELASTIC_RUN_ID": "unit"}
        outs = [json.loads(line) for line in run_ranks(_RUN_RANK, [str(job), "0"], [under_torchrun] * 3,
                                                       agent_store=True)]
    finally:
        marker.unlink(missing_ok=True)
    assert outs[0] == {"stop": True, "reason": "left"}
    assert [(o["rank"], o["world"]) for o in outs[1:]] == [(0, 2), (1, 2)]
    events = [json.loads(line) for line in (job / "progress.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events if e["event"] != "polls"] == ["start", "regrouped"], events
    assert not list(job.glob("attempts/*.resume")), "the rank that left asked for no resume"
