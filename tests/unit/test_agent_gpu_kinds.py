"""Unit tests with the stateful fake Slurm (its one ``_run`` seam) and a fake clock: the agent across GPU kinds
(issue 33, item 4). The fake's gpu1 names its GPUs ``gpu:a100:4`` and gpu2 ``gpu:v100:4``, as the testbed's
GRES do; the jobs' progress files are what dlsub's library writes (start events naming ``gpu_type``, as the
batch script reads it from the node's GRES, then progress reports).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from agent_world import ME, NOW, Crash, World, policy
from click.testing import CliRunner

from dlsub.agent.agent_store import AgentStore
from dlsub.agent.live_models import sizing_policy
from dlsub.agent.observe import Observation, observe
from dlsub.agent.reconcile import Agent
from dlsub.cli.agent_commands import why as why_command
from dlsub.contract import gpu_type_in_gres
from dlsub.job_progress import ProgressSummary
from dlsub.jobdir import check_progress_event
from dlsub.policies.goodput import GoodputPolicy
from dlsub.policies.goodput_types import TypedGoodputPolicy
from dlsub.site_config.policy_file import PolicyFileError
from dlsub.slurm_plugins.models import Partition, SlurmJob

A, B = "0000a100", "0000b100"  # dlsub ids are 8 hex digits



def observed(agent: Agent, slurm_jobs: list[SlurmJob], partitions: list[Partition]) -> Observation:
    """The agent's observe step alone, on the store as its next tick would read it."""
    return observe(agent.observing, agent.store.snapshot(), slurm_jobs, partitions, NOW, 1e18)

def typed(world: World) -> World:
    """The fake's GPU nodes of two kinds, as the testbed's gpu partition has them."""
    world.fake.nodes["gpu1"].gpu_type = "a100"
    world.fake.nodes["gpu2"].gpu_type = "v100"
    return world


def tags(dlsub_id: str, max_gpus: int = 4) -> str:
    """An elastic job of 1 to ``max_gpus`` GPUs in steps of one (``--gpus 1:N``)."""
    return f"dlsub:{dlsub_id};mode=ideal;ideal=gpu;gpus=1;nodes=1-{max_gpus};step=1"


def reports(job_dir: Path, job_id: int, runs: list[tuple[str, int, float]], *, batch: int = 64,
            end: float = NOW, start: dict[str, Any] | None = None) -> None:
    """The library's events: for each (kind, GPUs, steps/s), a start on that kind with the group's size
    (``start``: more fields of it) and 4 reports 5 s apart; the last run's last report at ``end``."""
    events: list[dict[str, Any]] = []
    t, step = end - 60 * len(runs) + 40, 0
    for kind, gpus, rate in runs:
        events.append({"event": "start", "time": t - 20, "attempt": f"{job_id}-0", "world_size": gpus,
                       "nodes": 1, "gpu_type": kind, **(start or {})})
        for _ in range(4):
            step += round(5 * rate)
            events.append({"event": "progress", "time": t, "attempt": f"{job_id}-0", "step": step,
                           "samples": step * batch, "total_steps": 200000})
            t += 5
        t += 40
    path = job_dir / "progress.jsonl"
    with open(path, "a") as f:
        f.write("".join(json.dumps(e) + "\n" for e in events))
    os.chown(path, job_dir.stat().st_uid, job_dir.stat().st_gid)


def elastic(world: World, dlsub_id: str, node: str, *, uid: int = ME, user: str = "alice",
            workers: int = 3, start: float = NOW - 600) -> tuple[int, int, Path]:
    """An elastic job elastic in GPUs: its held worker array of 1-GPU tasks, then its 1-GPU main job on
    ``node``. Returns (main job, worker array, job directory)."""
    array, job_dir = world.worker_array(dlsub_id, tags(dlsub_id, workers + 1), uid=uid, user=user, tasks=workers,
                                        gpus_per_node=1)
    main, _ = world.submit(dlsub_id, uid=uid, user=user, comment=tags(dlsub_id, workers + 1), partition="gpu",
                           gres="gpu:1", start_on=node, job_dir=job_dir, start=start)
    if uid != os.getuid():  # the agent reads a job directory only when it is its user's
        if os.getuid() != 0:
            pytest.skip("giving a job directory to another uid needs root")
        for path in (job_dir.parent, job_dir, *job_dir.iterdir()):
            os.chown(path, uid, uid)
    return main, array, job_dir


@pytest.mark.parametrize(("gres", "kind"), [
    ("gpu:a100:4", "a100"), ("gpu:a100:4(S:0-1)", "a100"), ("gres/gpu:v100=2", "v100"),
    ("gres:gpu:t4:1", "t4"), ("gpu:4", None), ("", None), (None, None),
    ("gpu:a100:2,gpu:v100:2", None), ("gpu:a100:2,gpu:2", None), ("gpu:a;b:2", None),
])
def test_the_one_kind_a_gres_names(gres: str | None, kind: str | None) -> None:
    """Unit, pure: one kind named, or None (untyped, several kinds, or a name no GPU type has)."""
    assert gpu_type_in_gres(gres) == kind


def test_sinfo_gives_each_node_its_kind_and_untyped_stays_none(tmp_path: Path) -> None:
    """Unit with the fake Slurm: typed GRES give the node's kind; the untyped fake (today's) gives None."""
    world = World(tmp_path)
    plain = {n.name: n.gpu_type for p in world.client.partitions() for n in p.nodes}
    assert plain == {"cpu1": None, "cpu2": None, "gpu1": None, "gpu2": None}
    typed(world)
    nodes = {n.name: n for p in world.client.partitions() for n in p.nodes}
    assert (nodes["gpu1"].gpu_type, nodes["gpu2"].gpu_type, nodes["cpu1"].gpu_type) == ("a100", "v100", None)
    assert nodes["gpu1"].gpus == 4


def test_observation_has_node_kinds_and_each_jobs_throughput_per_kind(tmp_path: Path) -> None:
    """Unit with the fake Slurm: the observation names each typed node's kind, each elastic job's kind (its main
    job's node's), and what each job measured on each kind it ran on, apart (Alice's job ran on v100, then
    a100; Bob's only on v100). One squeue and one sinfo: no Slurm call per job."""
    world = typed(World(tmp_path))
    main_a, _, dir_a = elastic(world, A, "gpu1")
    main_b, _, dir_b = elastic(world, B, "gpu2", uid=ME + 4242, user="bob")
    reports(dir_a, main_a, [("v100", 1, 2.0), ("a100", 1, 6.0)])
    reports(dir_b, main_b, [("v100", 1, 3.0)])
    agent = world.agent()
    jobs, partitions = world.client.jobs(), world.client.partitions()
    calls = len(world.fake.calls)
    seen = observed(agent, jobs, partitions)
    assert world.fake.calls[calls:] == [], "observing reads no more of Slurm than the tick's squeue and sinfo"
    assert seen.node_types == {"gpu1": "a100", "gpu2": "v100"}
    kinds = {j.dlsub_id: j.gpu_type for j in seen.elastic}
    assert kinds == {A: "a100", B: "v100"}
    rooms = {r.name: {n.name: n.gpu_type for n in r.nodes} for r in seen.partitions}
    assert rooms["gpu"] == {"gpu1": "a100", "gpu2": "v100"}
    by_kind = seen.elastic_progress[A].measured_by_type
    assert set(by_kind) == {"a100", "v100"}
    assert by_kind["a100"][(1, 1)][0] == pytest.approx(6.0, rel=0.05)
    assert by_kind["v100"][(1, 1)][0] == pytest.approx(2.0, rel=0.05)
    assert by_kind["a100"][(1, 1)][1] == pytest.approx(6.0 * 64, rel=0.05), "samples/s, from the reports"
    assert set(seen.elastic_progress[B].measured_by_type) == {"v100"}


def test_jobs_waiting_for_one_kind_are_counted_for_that_kind(tmp_path: Path) -> None:
    """Unit with the fake Slurm: the room's waiting GPUs, and of them those asked for as one kind, per kind
    (``--gres=gpu:a100:1``); a job asking for a kind no node of the partition has waits for nothing here."""
    world = typed(World(tmp_path))
    elastic(world, A, "gpu1", workers=0)
    world.submit("0000c100", uid=ME + 1, user="carol", comment="", partition="gpu", gres="gpu:a100:1",
                 start_on=None)
    world.submit("0000d100", uid=ME + 2, user="dave", comment="", partition="gpu", gres="gpu:2", start_on=None)
    t4, _ = world.submit("0000e100", uid=ME + 3, user="erin", comment="", partition="gpu", gres="gpu:1",
                         start_on=None)
    world.fake.jobs[t4].options["gres"] = "gpu:t4:1"  # Slurm refuses the kind at submit; a node may go since
    agent = world.agent()
    seen = observed(agent, world.client.jobs(), world.client.partitions())
    (room,) = [r for r in seen.partitions if r.name == "gpu"]
    assert (room.waiting_gpus, room.waiting_by_kind, room.untyped_waiting()) == (3, (("a100", 1),), 2)


def test_untyped_nodes_and_reports_leave_no_kinds(tmp_path: Path) -> None:
    """Unit with the fake Slurm: today's untyped cluster: no node kinds, no job kind, nothing per kind."""
    world = World(tmp_path)
    main, _, job_dir = elastic(world, A, "gpu1")
    with open(job_dir / "progress.jsonl", "a") as f:
        f.write(json.dumps({"event": "start", "time": NOW - 60, "attempt": f"{main}-0", "world_size": 1}) + "\n")
        for i in range(4):
            f.write(json.dumps({"event": "progress", "time": NOW - 40 + 5 * i, "attempt": f"{main}-0",
                                "step": 10 * i, "samples": 640 * i}) + "\n")
    seen = observed(world.agent(), world.client.jobs(), world.client.partitions())
    assert seen.node_types == {}
    assert [j.gpu_type for j in seen.elastic] == [None]
    assert seen.elastic_progress[A].measured_by_type == {}
    assert seen.elastic_progress[A].measured, "what it measured untyped is still measured"


# ---------------------------------------------------------------- deciding and acting across kinds

def across(**overrides: Any) -> Any:
    """The agent's policy.toml: goodput, sizing across GPU kinds (``[goodput] across_gpu_types``)."""
    return policy(policy="goodput", goodput={"across_gpu_types": True}, **overrides)


def checkpointed(job_dir: Path, job_id: int) -> None:
    path = job_dir / "progress.jsonl"
    with open(path, "a") as f:
        f.write(json.dumps({"event": "checkpoint", "time": NOW - 2, "step": 100, "seq": 1,
                            "attempt": f"{job_id}-0"}) + "\n")
    os.chown(path, job_dir.stat().st_uid, job_dir.stat().st_gid)


def decisions(world: World, dlsub_id: str, kind: str | None = None) -> list[str]:
    assert world.store is not None
    return [d.reason for d in world.store.decisions() if d.dlsub_id == dlsub_id and (kind is None or d.kind == kind)]


def test_the_policy_key_is_off_by_default_and_needs_goodput() -> None:
    """Unit, pure: [goodput] across_gpu_types is off unless asked for, a bool, and only with policy goodput."""
    assert policy().goodput.across_gpu_types is False
    assert across().goodput.across_gpu_types is True
    with pytest.raises(PolicyFileError, match="only the goodput policy"):
        policy(policy="fifo", goodput={"across_gpu_types": True})
    with pytest.raises(PolicyFileError, match="expected bool"):
        policy(policy="goodput", goodput={"across_gpu_types": "yes"})
    with pytest.raises(PolicyFileError, match="unknown key"):
        policy(policy="goodput", goodput={"across_gpu_type": True})
    assert isinstance(sizing_policy(across()), TypedGoodputPolicy)
    assert type(sizing_policy(policy(policy="goodput"))) is GoodputPolicy, "off: the homogeneous class, as before"


def test_a_job_faster_on_the_other_kind_is_moved_there_through_the_write_ahead_move(tmp_path: Path) -> None:
    """Unit with the fake Slurm: Alice's elastic job runs on a100 (gpu1) at 2 steps/s; it ran on v100 before at
    8 steps/s, and v100 (gpu2) is idle. The typed goodput policy puts it on v100: the agent writes the move
    ahead (target kind v100), signals its main job (checkpoint, requeue held), points it at
    gres:gpu:v100:1 through the one client, releases it, and finishes the move once it runs there.
    `dlsub why` has the kinds and the figures, measured and predicted."""
    world = typed(World(tmp_path, across()))
    main, array, job_dir = elastic(world, A, "gpu1")
    reports(job_dir, main, [("v100", 1, 8.0), ("a100", 1, 2.0)])
    checkpointed(job_dir, main)
    agent = world.agent()
    agent.tick(NOW)
    job = world.fake.jobs[main]
    assert job.signals == ["USR2"], "the main job is asked to checkpoint for a move"
    assert world.store is not None
    (row,) = world.store.moves()
    assert (row["target_partition"], row["target_gpus"], row["target_gpu_type"]) == ("gpu", 1, "v100")
    (why,) = decisions(world, A, "move")
    assert "measured 128 samples/s on a100 (1 GPU), predicted 5" in why and "samples/s on v100 (1 GPU" in why, why
    assert "moved" in why and "goodput policy across GPU kinds" in why
    assert all(world.fake.task(f"{array}_{i}").reason == "JobHeldUser" for i in range(3)), "no grow while moving"
    world.batch_script_moves(job_dir, main)
    agent.tick(NOW + 5)
    updates = [c for c in world.fake.calls if c[:2] == ["scontrol", "update"] and f"jobid={main}" in c]
    assert updates == [["scontrol", "update", f"jobid={main}", "Partition=gpu", "TresPerNode=gres:gpu:v100:1"]]
    assert job.options["gres"] == "gpu:v100:1"
    assert job.reason == "None", "released"
    world.fake.start(main, "gpu2", int(NOW + 130))
    agent.tick(NOW + 130)
    assert world.store.moves() == []
    assert any("running on gpu (v100)" in r for r in decisions(world, A, "move-done"))
    shown = CliRunner().invoke(why_command, [A, "--db", str(world.db)])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert any(" move " in line and "measured 128 samples/s on a100 (1 GPU), predicted 5" in line
               and "on v100" in line and "moved" in line for line in lines), shown.output
    assert any("move-done" in line and "running on gpu (v100)" in line for line in lines), shown.output


def test_a_crash_after_the_retarget_is_sent_resumes_the_move(tmp_path: Path) -> None:
    """Unit with the fake Slurm: the agent dies right after Slurm took the typed retarget, before it recorded it;
    the next agent on the same store asks again (the same update) and releases the job."""
    world = typed(World(tmp_path, across()))
    main, _, job_dir = elastic(world, A, "gpu1")
    reports(job_dir, main, [("v100", 1, 8.0), ("a100", 1, 2.0)])
    checkpointed(job_dir, main)
    world.agent().tick(NOW)
    world.batch_script_moves(job_dir, main)
    world.crash_once_at(("scontrol", "update"), "after", "move-updated")
    with pytest.raises(Crash):
        world.agent().tick(NOW + 5)
    assert world.fake.jobs[main].options["gres"] == "gpu:v100:1" and world.fake.jobs[main].reason == "JobHeldUser"
    world.agent().tick(NOW + 10)
    assert world.fake.jobs[main].reason == "None", "released after the restart"
    assert world.fake.jobs[main].options["gres"] == "gpu:v100:1"


def test_the_key_off_leaves_a_typed_cluster_as_one_pool(tmp_path: Path) -> None:
    """Unit with the fake Slurm: the same job and cluster with the key off (policy goodput): no move, no note
    about kinds, and the same Slurm calls as on the untyped cluster."""
    calls = []
    for kinds in (False, True):
        world = World(tmp_path / str(kinds), policy(policy="goodput"))
        if kinds:
            typed(world)
        main, _, job_dir = elastic(world, A, "gpu1")
        reports(job_dir, main, [("v100", 1, 8.0), ("a100", 1, 2.0)])
        checkpointed(job_dir, main)
        start = len(world.fake.calls)
        world.agent().tick(NOW)
        assert world.fake.jobs[main].signals == []
        assert not any("GPU kinds" in r for r in decisions(world, A))
        calls.append([c for c in world.fake.calls[start:] if c[:2] != ["scontrol", "--version"]])
    assert calls[0] == calls[1]


def test_another_users_reports_never_move_a_job(tmp_path: Path) -> None:
    """Unit with the fake Slurm, two users: Alice's job runs on gpu1's a100s, where it is fastest by its own
    figures. Bob's job on v100 claims to be a hundred times faster on a100 (his reports are his word). The
    typed policy would rather give gpu1 to Bob's job; Alice's job is never signalled, retargeted or shrunk
    (a note says it stays, with its figures), and only Bob's own job moves."""
    world = typed(World(tmp_path, across()))
    world.fake.nodes["gpu1"].gpus = 2
    main_a, array_a, dir_a = elastic(world, A, "gpu1", workers=1)
    reports(dir_a, main_a, [("v100", 1, 2.0), ("a100", 1, 8.0)])
    checkpointed(dir_a, main_a)
    main_b, _, dir_b = elastic(world, B, "gpu2", uid=ME + 4242, user="bob", workers=1)
    reports(dir_b, main_b, [("a100", 1, 100.0), ("v100", 1, 1.0)])
    checkpointed(dir_b, main_b)
    before = world.snapshot(main_a)
    agent = world.agent()
    for t in (NOW, NOW + 5, NOW + 10):
        agent.tick(t)
    assert world.snapshot(main_a) == before
    assert world.mutating_calls(main_a) == [] and world.mutating_calls(array_a) == []
    assert any(r.startswith("stays on a100") and "measured 512 samples/s on a100 (1 GPU)" in r
               for r in decisions(world, A)), decisions(world, A)
    assert world.fake.jobs[main_b].signals == ["USR2"], "Bob's own job moves to the a100 it claims"



def test_retarget_asks_for_typed_gres_through_the_one_client_and_refuses_a_bad_kind(tmp_path: Path) -> None:
    """Unit with the fake Slurm: the one client's retarget names the kind in TresPerNode; a kind that is no GRES
    type's name (it would reach scontrol's arguments) is refused before Slurm is asked."""
    world = World(tmp_path)
    job, _ = world.submit("0000abcd", partition="gpu", gres="gpu:2", start_on=None)
    world.client.retarget(job, "gpu", 2, gpu_type="v100")
    assert world.fake.calls[-1] == ["scontrol", "update", f"jobid={job}", "Partition=gpu",
                                    "TresPerNode=gres:gpu:v100:2"]
    world.client.retarget(job, "gpu", 2)
    assert world.fake.calls[-1][-1] == "TresPerNode=gres:gpu:2", "untyped as before"
    calls = len(world.fake.calls)
    for bad in ("v100 TimeLimit=9", "a100;x", "../a"):
        with pytest.raises(ValueError, match="not a GPU type"):
            world.client.retarget(job, "gpu", 2, gpu_type=bad)
    assert len(world.fake.calls) == calls


def test_a_store_from_before_moves_named_a_kind_gains_the_column(tmp_path: Path) -> None:
    """Unit (SQLite): an agent database whose moves table predates target_gpu_type opens, and its moves read
    with no kind."""
    store = AgentStore(tmp_path / "agent.db")
    store.conn.execute("insert into moves (uid, slurm_job_id, dlsub_id, kind, phase, target_partition, target_gpus,"
                       " since, signals) values (1, 2, '0000abcd', 'move', 'signalled', 'gpu', 1, 0, 1)")
    store.conn.execute("ALTER TABLE moves DROP COLUMN target_gpu_type")
    store.conn.commit()
    store.conn.close()
    again = AgentStore(tmp_path / "agent.db")
    (row,) = again.move_rows().values()
    assert (row.target_partition, row.target_gpu_type) == ("gpu", "")


DIGEST = {"application": "0123456789abcdef0123456789abcdef"}


def two_runs_of_one_command(world: World) -> tuple[int, int, Path]:
    """Two of Alice's elastic jobs of one command (the start events' digest): the first ran at 8 steps/s on v100
    (gpu2) and checkpointed; the second's main job runs on a100 (gpu1) with nothing written yet. Returns (first
    main job, second main job, the second's directory)."""
    first, _, first_dir = elastic(world, "000f1257", "gpu2", workers=1)
    reports(first_dir, first, [("v100", 1, 8.0)], start=DIGEST)
    checkpointed(first_dir, first)
    second, _, second_dir = elastic(world, "0005ec0d", "gpu1", workers=1)
    return first, second, second_dir


def test_a_kind_the_job_never_ran_on_is_bootstrapped_from_its_commands_earlier_runs(tmp_path: Path) -> None:
    """Unit with the fake Slurm: two of Alice's jobs run the same command (the start events' application
    digest). The first runs on v100 at 8 steps/s on one GPU; the second runs on a100 at 2 steps/s and has never
    run on v100. As the simulator's typed policy bootstraps a kind from one-GPU profiles, the second job's
    v100 rate is its own a100 model scaled by the one-GPU rates on the two kinds (8 / 2): it moves to v100,
    and `dlsub why` says the figure was bootstrapped and from what."""
    world = typed(World(tmp_path, across()))
    first, second, second_dir = two_runs_of_one_command(world)
    reports(second_dir, second, [("a100", 1, 2.0)], start=DIGEST)
    checkpointed(second_dir, second)
    agent = world.agent()
    agent.tick(NOW)
    agent.tick(NOW + 5)
    assert world.fake.jobs[second].signals == ["USR2"]
    assert world.fake.jobs[first].signals == [], "the first job stays on the kind that is fastest for it"
    (why,) = decisions(world, "0005ec0d", "move")
    assert "measured 128 samples/s on a100 (1 GPU), predicted 512 samples/s on v100 (1 GPU; bootstrapped: its " \
        "a100 model x 4.00, the one-GPU rate earlier runs of its command measured on v100 over its own on a100)" \
        in why, why


def test_a_job_that_polls_is_moved_across_kinds_only_once_it_has_measured_its_rate_where_it_runs(
        tmp_path: Path) -> None:
    """Unit with the fake Slurm: an earlier job of Alice's command measured 8 steps/s on v100. A second run of it
    has just started on a100: a start there and its loop's first should_stop() (the "polls" event: it saves when
    asked), no report yet. What is known of it on a100 is no measurement: it is not moved (`dlsub why` says it
    waits for a rate measured where it runs). Three reports later it is, on its measured figure."""
    world = typed(World(tmp_path, across()))
    _, second, job_dir = two_runs_of_one_command(world)
    attempt = f"{second}-0"
    events = [{"event": "start", "time": NOW - 8, "attempt": attempt, "world_size": 1, "nodes": 1,
               "gpu_type": "a100", **DIGEST}, {"event": "polls", "time": NOW - 4, "attempt": attempt}]
    with open(job_dir / "progress.jsonl", "a") as f:
        f.write("".join(json.dumps(e) + "\n" for e in events))
    agent = world.agent()
    agent.tick(NOW)
    agent.tick(NOW + 1)
    assert world.fake.jobs[second].signals == [], "not moved before it measured its rate where it runs"
    assert not any("not measured" in r for r in decisions(world, "000f1257"))
    with open(job_dir / "progress.jsonl", "a") as f:
        f.write("".join(json.dumps({"event": "progress", "time": NOW + t, "attempt": attempt, "step": 2 * t,
                                    "samples": 2 * t * 64, "total_steps": 200000}) + "\n" for t in (2, 7, 12)))
    agent.tick(NOW + 13)
    agent.tick(NOW + 14)
    assert world.fake.jobs[second].signals == ["USR2"], "measured where it runs, saving when asked: moved"
    (why,) = decisions(world, "0005ec0d", "move")
    assert "measured 128 samples/s on a100 (1 GPU)" in why, why


def test_the_agent_keeps_a_start_events_application_digest() -> None:
    """Unit, pure: the checked start event keeps the command's digest (earlier runs of the same command are
    found by it); one that is not a digest does not reach the summary."""
    summary = ProgressSummary()
    digest = "0123456789abcdef0123456789abcdef"
    checked = check_progress_event({"event": "start", "time": NOW, "application": digest})
    assert checked is not None
    summary.feed(checked)
    assert summary.progress().application == digest
    bad = check_progress_event({"event": "start", "time": NOW, "application": "not a digest"})
    assert bad is not None
    summary = ProgressSummary()
    summary.feed(bad)
    assert summary.progress().application is None


@pytest.mark.parametrize(("age_s", "restart_s", "moves"), [(30.0, 15.0, False), (30.0, 0.001, True),
                                                          (3600.0, 15.0, True)])
def test_a_job_moves_only_when_its_gain_beats_the_restart_by_the_policys_own_rule(
        tmp_path: Path, age_s: float, restart_s: float, moves: bool) -> None:
    """Unit with the fake Slurm: the same job, 1.25x faster on v100 by its own figures, submitted 30 s or an hour
    ago. The typed policy's restart share (the restart, [moves] restart_cost_s + min_saving_s, over the work
    it is guessed to have left, its age) leaves a young job a third of the gain: it stays; the same young job
    with a restart that costs nothing moves, and so does an hour-old one (it keeps 95%)."""
    world = typed(World(tmp_path, across(moves={"restart_cost_s": restart_s, "min_saving_s": 0.001})))
    main, _, job_dir = elastic(world, A, "gpu1", start=NOW - min(age_s, 600))
    world.fake.jobs[main].submit_time = int(NOW - age_s)
    reports(job_dir, main, [("v100", 1, 2.5), ("a100", 1, 2.0)])
    checkpointed(job_dir, main)
    world.agent().tick(NOW)
    assert (world.fake.jobs[main].signals == ["USR2"]) is moves
    assert bool(decisions(world, A, "move")) is moves


# ---------------------------------------------------------------- elastic jobs that wait, placed on a kind
APP = "0123456789abcdef0123456789abcdef"


def earlier_runs(world: World) -> tuple[int, Path]:
    """Alice's running job of the command APP, on v100, which measured it 4x as fast on v100 as on a100."""
    main, _, job_dir = elastic(world, "000f1257", "gpu2", workers=1)
    reports(job_dir, main, [("a100", 1, 2.0), ("v100", 1, 8.0)], start={"application": APP})
    return main, job_dir


def waiting_job(world: World, dlsub_id: str, gres: str = "gpu:1", app: str = APP) -> int:
    """An elastic job of the command ``app`` that waits for a GPU (``--gpus 1:2``)."""
    array, job_dir = world.worker_array(dlsub_id, tags(dlsub_id, 2), tasks=1, gpus_per_node=1)
    comment = f"{tags(dlsub_id, 2)};app={app}"
    main, _ = world.submit(dlsub_id, comment=comment, partition="gpu", gres=gres, start_on=None, job_dir=job_dir)
    world.fake.jobs[main].reason = "Resources"
    return main


def test_a_waiting_elastic_job_is_asked_for_as_the_kind_its_commands_earlier_runs_were_fastest_on(
        tmp_path: Path) -> None:
    """Unit with the fake Slurm: Alice's waiting job names the command (submit's ``app=``) her running job
    measured 4x as fast on v100: the typed policy places it on v100, and its request becomes
    gres:gpu:v100:1; `dlsub why` says why, with the figures. The same job with the key off is left as it is."""
    for key in (True, False):
        world = typed(World(tmp_path / str(key), across() if key else policy(policy="goodput")))
        earlier_runs(world)
        main = waiting_job(world, "0000f0a1")
        agent = world.agent()
        agent.tick(NOW)
        agent.tick(NOW + 5)
        asked = world.fake.jobs[main].options.get("gres")
        assert asked == ("gpu:v100:1" if key else "gpu:1"), asked
        placed = decisions(world, "0000f0a1", "place")
        assert bool(placed) is key


def test_the_placing_is_said_with_its_figures(tmp_path: Path) -> None:
    """Unit with the fake Slurm: the place decision's words, once (asked for as v100 on the first tick)."""
    world = typed(World(tmp_path, across()))
    earlier_runs(world)
    waiting_job(world, "0000f0a1")
    agent = world.agent()
    agent.tick(NOW)
    agent.tick(NOW + 5)
    (why,) = decisions(world, "0000f0a1", "place")
    assert why.startswith("waiting for v100 (goodput policy across GPU kinds): its speed on one GPU of each kind, "
                          "against the slowest, predicted from what it or its user's earlier runs of the same command "
                          "measured there: v100 4.00x, a100 1.00x; asked for as gres:gpu:v100:1"), why


def test_a_kind_its_user_asked_for_is_never_changed(tmp_path: Path) -> None:
    """Unit with the fake Slurm: the same waiting job, its user having asked for an a100 (--gres=gpu:a100:1,
    in its submit record): it keeps it, though its command runs 4x as fast on v100."""
    world = typed(World(tmp_path, across()))
    earlier_runs(world)
    main = waiting_job(world, "0000f0a1", gres="gpu:a100:1")
    world.agent().tick(NOW)
    assert world.fake.jobs[main].options.get("gres") == "gpu:a100:1"
    assert decisions(world, "0000f0a1", "place") == []


def test_a_job_waiting_for_a_kind_no_node_of_which_can_be_freed_is_asked_for_as_any_kind_again(
        tmp_path: Path) -> None:
    """Unit with the fake Slurm: a job the agent asked for as v100 (its submit record names no kind) waits while
    another user's rigid job holds all four v100 GPUs: it is asked for as any kind again, with the reason.
    A command nothing is known of is not placed at all."""
    world = typed(World(tmp_path, across()))
    world.submit("0000b0b0", uid=ME + 1, user="bob", comment="", partition="gpu", gres="gpu:v100:4",
                 start_on="gpu2")
    main = waiting_job(world, "0000f0a1")
    world.fake.jobs[main].options["gres"] = "gpu:v100:1"  # as the agent's place left it
    unknown = waiting_job(world, "0000f0a2", app="f" * 32)
    world.agent().tick(NOW)
    assert world.fake.jobs[main].options.get("gres") == "gpu:1"
    (why,) = decisions(world, "0000f0a1", "place")
    assert why.startswith("waiting for any kind of GPU again (goodput policy across GPU kinds): no node of v100 "
                          "has 1 GPU idle or held by elastic workers for it, and gpu1 has them idle"), why
    assert world.fake.jobs[unknown].options.get("gres") == "gpu:1" and decisions(world, "0000f0a2", "place") == []


def test_a_placed_job_keeps_its_kind_while_no_other_kind_is_idle(tmp_path: Path) -> None:
    """Unit with the fake Slurm: the same job, v100 held by Bob and a100 by Carol: asked for as any kind it
    would start no sooner, and a snapshot in which a GPU freed for it was just taken must not unplace it."""
    world = typed(World(tmp_path, across()))
    world.submit("0000b0b0", uid=ME + 1, user="bob", comment="", partition="gpu", gres="gpu:v100:4",
                 start_on="gpu2")
    world.submit("0000c0c0", uid=ME + 2, user="carol", comment="", partition="gpu", gres="gpu:a100:4",
                 start_on="gpu1")
    main = waiting_job(world, "0000f0a1")
    world.fake.jobs[main].options["gres"] = "gpu:v100:1"
    world.agent().tick(NOW)
    assert world.fake.jobs[main].options.get("gres") == "gpu:v100:1"
    assert decisions(world, "0000f0a1", "place") == []


def test_placing_a_job_that_slurm_started_meanwhile_is_no_error(tmp_path: Path) -> None:
    """Unit with the fake Slurm: Slurm starts the job between the tick's read of the queue and its placing:
    scontrol says it is no longer pending, and nothing is recorded as failed."""
    world = typed(World(tmp_path, across()))
    earlier_runs(world)
    main = waiting_job(world, "0000f0a1")
    real = world.fake.__call__

    def start_first(argv: Any) -> Any:
        if list(argv[:2]) == ["scontrol", "update"] and f"jobid={main}" in argv:
            world.fake.start(main, "gpu1", int(NOW))
        return real(argv)

    world.client._runner = start_first
    world.agent().tick(NOW)
    assert world.fake.jobs[main].state == "RUNNING", "setup: Slurm started it as it was being placed"
    assert decisions(world, "0000f0a1", "place") and decisions(world, "0000f0a1", "error") == []


# ---------------------------------------------------------------- what jobs that are not elastic measured
def fixed_run(world: World, dlsub_id: str, kind_rates: list[tuple[str, float]], *, uid: int = ME,
              user: str = "alice", app: str = APP, partition: str = "gpu") -> int:
    """A job of ``app`` that is not elastic, of 1 GPU, as `dlsub estimate` submits its profiling runs (mode
    ideal, --gres=gpu:KIND:1), which measured each (kind, steps/s) of ``kind_rates`` in turn; it runs on the
    last kind's node (gpu1: a100, gpu2: v100) in ``partition`` (gpu-dev has the same two nodes)."""
    kind = kind_rates[-1][0]
    node = "gpu1" if kind == "a100" else "gpu2"
    job_dir = world.tmp / f"home-{uid}" / dlsub_id
    job_dir.mkdir(parents=True)
    if uid != os.getuid():
        if os.getuid() != 0:
            pytest.skip("giving a job directory to another uid needs root")
        os.chown(job_dir.parent, uid, uid)
        os.chown(job_dir, uid, uid)
    main, _ = world.submit(dlsub_id, uid=uid, user=user,
                           comment=f"dlsub:{dlsub_id};mode=ideal;ideal={partition};gpus=1", partition=partition,
                           gres=f"gpu:{kind}:1", start_on=node, job_dir=job_dir)
    for path in job_dir.iterdir():
        os.chown(path, uid, uid)
    reports(job_dir, main, [(k, 1, rate) for k, rate in kind_rates], start={"application": app})
    return main


@pytest.mark.parametrize("whose", ["alice", "bob", "another command", "another partition", "none"])
def test_a_profile_of_a_kind_by_a_job_that_is_not_elastic_is_what_the_commands_elastic_jobs_learn_it_from(
        tmp_path: Path, whose: str) -> None:
    """Unit with the fake Slurm, two users: a job that is not elastic (a `dlsub estimate` profiling run: the
    same command, arguments and batch as `dlsub submit --from-estimate` runs) measured the command APP at
    8 steps/s on one v100. Alice's elastic job of APP runs on a100 at 2 steps/s and has never run on v100.
    Her own profile is what the typed policy bootstraps v100 from: the job moves there, and `dlsub why` says
    from what. Bob's profile of the same command, a profile of another command, or none leave her job as it
    is (the policy knows nothing of v100 for it), as does her own profile on gpu-dev (the same nodes, but
    another partition: a site may give it other limits, so its runs stand only for its own jobs); Bob's own
    elastic job of APP moves on his profile."""
    world = typed(World(tmp_path, across()))
    bob = ME + 4242
    main, _, job_dir = elastic(world, A, "gpu1", workers=1)
    reports(job_dir, main, [("a100", 1, 2.0)], start={"application": APP})
    checkpointed(job_dir, main)
    if whose == "bob":
        bobs, _, bob_dir = elastic(world, B, "gpu1", uid=bob, user="bob", workers=1)
        reports(bob_dir, bobs, [("a100", 1, 2.0)], start={"application": APP})
        checkpointed(bob_dir, bobs)
    if whose != "none":
        fixed_run(world, "0000e571", [("v100", 8.0)], uid=bob if whose == "bob" else ME,
                  user="bob" if whose == "bob" else "alice",
                  app=APP if whose != "another command" else "f" * 32,
                  partition="gpu-dev" if whose == "another partition" else "gpu")
    agent = world.agent()
    agent.tick(NOW)
    agent.tick(NOW + 5)
    moved = world.fake.jobs[main].signals == ["USR2"]
    assert moved is (whose == "alice"), (whose, decisions(world, A))
    if whose == "alice":
        (why,) = decisions(world, A, "move")
        assert "predicted 512 samples/s on v100 (1 GPU; bootstrapped: its a100 model x 4.00, the one-GPU rate " \
            "earlier runs of its command measured on v100" in why, why
    if whose == "bob":
        assert world.fake.jobs[bobs].signals == ["USR2"], "Bob's profile is read, and used for his own job"


def test_a_waiting_elastic_job_is_placed_on_the_kind_its_profiles_measured_fastest(tmp_path: Path) -> None:
    """Unit with the fake Slurm: a `dlsub estimate` profile of both kinds (a100 2 steps/s, then v100 8), by a
    job that is not elastic and has ended its profile of a100; Alice's elastic job of the same command waits,
    having never run: it is asked for as v100, the kind its profiles measured fastest."""
    world = typed(World(tmp_path, across()))
    fixed_run(world, "0000e571", [("a100", 2.0), ("v100", 8.0)])
    main = waiting_job(world, "0000f0a1")
    agent = world.agent()
    agent.tick(NOW)
    agent.tick(NOW + 5)
    assert world.fake.jobs[main].options.get("gres") == "gpu:v100:1"
    (why,) = decisions(world, "0000f0a1", "place")
    assert "v100 4.00x, a100 1.00x" in why, why


def test_kind_runs_are_of_jobs_that_are_not_elastic_on_named_kinds_only(tmp_path: Path) -> None:
    """Unit with the fake Slurm: the observation's kind runs are the fixed-size job's typed configurations with
    its command; an elastic job's are not among them (its own view has them), nor an untyped run's."""
    world = typed(World(tmp_path, across()))
    main, _, job_dir = elastic(world, A, "gpu1", workers=1)
    reports(job_dir, main, [("a100", 1, 2.0)], start={"application": APP})
    fixed_run(world, "0000e571", [("v100", 8.0)])
    untyped_dir = world.tmp / f"home-{ME}" / "0000e572"
    untyped_dir.mkdir()
    untyped, _ = world.submit("0000e572", comment="dlsub:0000e572;mode=ideal;ideal=gpu;gpus=1", partition="gpu",
                              gres="gpu:1", start_on="gpu2", job_dir=untyped_dir)
    reports(untyped_dir, untyped, [("", 1, 8.0)], start={"application": APP})
    seen = observed(world.agent(), world.client.jobs(), world.client.partitions())
    (run,) = seen.kind_runs
    assert (run.uid, run.partition, run.dlsub_id, run.application) == (ME, "gpu", "0000e571", APP)
    (config,) = run.configs
    assert (config.gpu_type, config.replicas) == ("v100", 1)
    assert config.steps_per_s == pytest.approx(8.0, rel=0.05)


def test_a_profile_that_ended_between_two_ticks_is_read_once_as_it_ends_and_learnt(tmp_path: Path) -> None:
    """Unit with the fake Slurm: `dlsub estimate`'s profiling run of v100 (a few seconds) started and ended
    between two ticks: the agent first sees it COMPLETED. Its files are read once as it ends, so Alice's
    elastic job of the same command learns v100 from it and moves there."""
    world = typed(World(tmp_path, across()))
    main, _, job_dir = elastic(world, A, "gpu1", workers=1)
    reports(job_dir, main, [("a100", 1, 2.0)], start={"application": APP})
    checkpointed(job_dir, main)
    profile = fixed_run(world, "0000e571", [("v100", 8.0)])
    world.fake.set_job_state(profile, "COMPLETED")
    agent = world.agent()
    agent.tick(NOW)
    agent.tick(NOW + 5)
    assert world.fake.jobs[main].signals == ["USR2"], decisions(world, A)


def test_fixed_size_runs_are_learnt_only_where_the_site_sizes_jobs_across_kinds(tmp_path: Path) -> None:
    """Unit with the fake Slurm: with goodput but without [goodput] across_gpu_types, the observation has no
    kind runs (nothing would use them: the partition's GPUs are one pool)."""
    world = typed(World(tmp_path, policy(policy="goodput")))
    fixed_run(world, "0000e571", [("v100", 8.0)])
    seen = observed(world.agent(), world.client.jobs(), world.client.partitions())
    assert seen.kind_runs == ()
    world = typed(World(tmp_path / "across", across()))
    fixed_run(world, "0000e571", [("v100", 8.0)])
    seen = observed(world.agent(), world.client.jobs(), world.client.partitions())
    assert [r.dlsub_id for r in seen.kind_runs] == ["0000e571"]


def test_a_moved_job_that_slurm_requeues_while_its_kind_is_taken_is_asked_for_as_any_kind_again(
        tmp_path: Path) -> None:
    """Unit with the fake Slurm: Alice's elastic job (submitted for any kind) ran on a100 and then on v100, where
    the agent's move left it asking for gres:gpu:v100:1. Slurm requeues it (say its node failed) while Bob's
    rigid job holds all four v100 GPUs and gpu1 is idle: the kind is the agent's, not hers, so it is asked for
    as any kind again rather than waiting for v100."""
    world = typed(World(tmp_path, across()))
    world.submit("0000b0b0", uid=ME + 1, user="bob", comment="", partition="gpu", gres="gpu:v100:4",
                 start_on="gpu2")
    main, _, job_dir = elastic(world, A, "gpu1", workers=1)
    reports(job_dir, main, [("a100", 1, 2.0), ("v100", 1, 8.0)], start={"application": APP})
    agent = world.agent()
    agent.tick(NOW)  # first seen as it runs: its request names no kind
    job = world.fake.jobs[main]
    world.fake.requeue_held(main)
    job.reason = "Resources"  # requeued by Slurm, not held
    job.options["gres"] = "gpu:v100:1"  # as the move left it
    agent.tick(NOW + 30)
    assert job.options.get("gres") == "gpu:1", decisions(world, A)
    assert any(d.startswith("waiting for any kind of GPU again") for d in decisions(world, A, "place")), \
        decisions(world, A)
