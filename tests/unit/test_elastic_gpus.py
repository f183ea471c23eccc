"""Unit: jobs elastic in GPUs (``dlsub --gpus MIN:MAX``), which grow and shrink by workers of a few GPUs,
on their own node first.

Pure where the name says so; the submit and Slurm-client tests run against the stateful fake Slurm behind
the client's ``_run`` seam.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlsub.checkpointing.launch import ENTRY_POINT
from dlsub.checkpointing.run_support import application
from dlsub.cli.main import main
from dlsub.contract import BATCH_SCRIPT, Tags
from dlsub.job.settings import load_settings
from dlsub.job.shape import Shape, ShapeError, resolve_shape
from dlsub.job.user_store import JobStore
from dlsub.policies.actions.kinds import ActionKind as K
from dlsub.policies.actions.partition_view import PartitionView
from dlsub.policies.actions.resize_rules import ElasticJob, WorkerTask, plan_resizes
from dlsub.policies.api import IdleNode
from dlsub.slurm_plugins.client import SlurmClient
from dlsub.slurm_plugins.fake import FakeSlurm


# ---------------------------------------------------------------- the shape (pure)
def test_gpus_min_max_alone_is_a_main_job_of_min_gpus_and_workers_of_one_gpu_each() -> None:
    assert resolve_shape(None, "1:4", None) == Shape(1, 1, 4, worker_gpus=1)
    assert resolve_shape(None, "2:8", None, 2) == Shape(2, 1, 4, worker_gpus=2)
    assert resolve_shape(None, "4:8", 4) == Shape(4, 1, 2), "with --gpus-per-node it grows by whole nodes"
    assert resolve_shape("1:2", None, 4) == Shape(4, 1, 2)


@pytest.mark.parametrize(("nodes", "gpus", "per_node", "step", "message"), [
    (None, "1:4", None, 2, "MAX - MIN must be a multiple of 2; try --gpus 1:3"),
    ("1:2", None, 4, 2, "--gpus-step 2: give a step of 1 or more GPUs, with an elastic --gpus MIN:MAX"),
    (None, "4", None, 1, "with an elastic --gpus MIN:MAX"),
    (None, "1:4", None, 0, "give a step of 1 or more"),
    (None, "0:4", None, None, "starts on 1 GPU or more"),
])
def test_steps_that_do_not_fit_the_range_are_refused_with_what_to_write(
        nodes: str | None, gpus: str, per_node: int | None, step: int | None, message: str) -> None:
    with pytest.raises(ShapeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve_shape(nodes, gpus, per_node, step)


def test_the_step_tag_round_trips_and_needs_an_elastic_range() -> None:
    tags = Tags("0123abcd", gpus=1, nodes=(1, 4), step=1)
    assert tags.comment().endswith(";nodes=1-4;step=1") and Tags.parse(tags.comment()) == tags
    assert Tags.parse("dlsub:0123abcd;gpus=1;step=1") is None, "a step without a range is not trusted"
    assert Tags.parse("dlsub:0123abcd;gpus=1;nodes=1-4;step=x") is None
    named = Tags("0123abcd", gpus=1, nodes=(1, 4), step=1, application="0" * 32)
    assert named.comment().endswith(";app=" + "0" * 32) and Tags.parse(named.comment()) == named
    assert Tags.parse("dlsub:0123abcd;gpus=1;nodes=1-4;app=xyz") is None, "an app that is no digest: no tags"


# ---------------------------------------------------------------- submitting (fake Slurm)
def test_dlsub_gpus_1_4_submits_one_gpu_and_three_held_one_gpu_workers(cli_env: FakeSlurm, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('training')\n")
    result = CliRunner().invoke(main, ["--json", "--gpus", "1:4", str(script)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert (out["gpus_per_node"], out["nodes"], out["max_nodes"], out["worker_gpus"]) == (1, 1, 4, 1)
    record = JobStore(load_settings().db_path).get(out["id"])
    assert record.elastic_range == "1 to 4 GPUs" and record.worker_tasks == 3
    main_job, workers = cli_env.jobs[out["slurm_job_id"]], cli_env.jobs[out["worker_array_id"]]
    assert main_job.options["gres"] == "gpu:1" and workers.options["gres"] == "gpu:1"
    assert workers.options["array"] == "0-2" and "step=1" in workers.options["comment"]
    assert "step=1" in main_job.options["comment"] and "nodes=1-4" in main_job.options["comment"]
    assert "pin=" not in main_job.options["comment"], "submit chose its partition: the agent may place it"
    script_text = (Path(out["job_dir"]) / BATCH_SCRIPT).read_text()
    assert "--nnodes 1:4" in script_text, "one rendezvous of the main job and up to three workers"
    status = CliRunner().invoke(main, ["status", "--json", out["id"]], catch_exceptions=False)
    row = json.loads(status.stdout)
    assert (row["min_gpus"], row["max_gpus"]) == (1, 4), "dlsub status says its range in GPUs"


def test_an_elastic_job_whose_user_names_its_partition_is_pinned_to_it(cli_env: FakeSlurm, tmp_path: Path) -> None:
    """Fake Slurm: ``-p gpu`` on an elastic job tags its main job ``pin=partition`` (the agent never places it on
    another partition); a fixed-size job named the same way is not tagged (only elastic jobs are placed)."""
    script = tmp_path / "train.py"
    script.write_text("print('training')\n")
    for argv, pinned in ((["--gpus", "1:2", "-p", "gpu"], True), (["--gpus", "1", "-p", "gpu"], False)):
        result = CliRunner().invoke(main, ["--json", *argv, str(script)], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        tags = Tags.parse(cli_env.jobs[json.loads(result.stdout)["slurm_job_id"]].options["comment"])
        assert tags is not None and tags.pinned is pinned, argv


def test_an_elastic_job_names_its_command_as_its_training_will(cli_env: FakeSlurm, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake Slurm: the main job's comment carries ``app=``, the digest the library's start event will give the
    same script and arguments (the agent places a job that waits by what earlier runs of it measured); a
    fixed-size job's does not."""
    script = tmp_path / "my train.py"
    script.write_text("print('training')\n")
    result = CliRunner().invoke(main, ["--json", "--gpus", "1:2", str(script), "--lr", "0.1"],
                                catch_exceptions=False)
    out = json.loads(result.stdout)
    tags = Tags.parse(cli_env.jobs[out["slurm_job_id"]].options["comment"])
    monkeypatch.setattr(sys, "argv", [str(script), "--lr", "0.1"])
    assert tags is not None and tags.application == application()["application"]
    fixed = json.loads(CliRunner().invoke(main, ["--json", "--gpus", "1", str(script)], catch_exceptions=False).stdout)
    assert "app=" not in cli_env.jobs[fixed["slurm_job_id"]].options["comment"]


def test_more_gpus_than_the_partition_has_is_refused_before_anything_is_written(
        cli_env: FakeSlurm, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('training')\n")
    result = CliRunner().invoke(main, ["--gpus", "1:64", "-p", "gpu", str(script)])
    assert result.exit_code != 0 and "partition gpu has 8 GPUs in all" in result.output, result.output
    assert not cli_env.submitted()


def test_the_client_points_a_held_task_at_a_node_and_refuses_a_name_slurm_would_not_print(
        fake_slurm: FakeSlurm, client: SlurmClient, tmp_path: Path) -> None:
    script = tmp_path / "w.sh"
    script.write_text("#!/bin/bash\n#SBATCH --array=0-2\n#SBATCH --hold\n#SBATCH -p gpu\nsleep 1\n")
    array = client.submit(script)
    client.point_at_node(f"{array}_1", "gpu1")
    assert fake_slurm.task(f"{array}_1").options["nodelist"] == "gpu1"
    with pytest.raises(ValueError, match="not a Slurm node name"):
        client.point_at_node(f"{array}_2", "gpu1 Partition=cpu")
    with pytest.raises(ValueError, match="not a Slurm partition name"):
        client.point_at_node(f"{array}_2", "gpu1", "gpu ReqNodeList=cpu1")


# ---------------------------------------------------------------- growing and shrinking (pure)
def held(count: int) -> tuple[WorkerTask, ...]:
    return tuple(WorkerTask(f"900_{i}", 900, "PENDING", "JobHeldUser", "gpu") for i in range(count))


def on_node(handle: str, node: str, start: float) -> WorkerTask:
    return WorkerTask(handle, 950 + start, "RUNNING", "None", "gpu", (node,), 0, start, gpus=1)


def gpu_job(workers: tuple[WorkerTask, ...]) -> ElasticJob:
    return ElasticJob("0123abcd", 901, 1001, "ann", "RUNNING", False, "gpu", gpus_per_node=1, min_members=1,
                      max_members=4, submit_time=10.0, worker_arrays=(900,), workers=workers, worker_gpus=1,
                      main_nodes=("gpu1",))


def test_a_worker_goes_to_a_free_gpu_of_the_jobs_own_node_before_an_idle_node() -> None:
    room = PartitionView("gpu", (IdleNode("gpu2", 4), IdleNode("gpu1", 1)))
    first, second, third = plan_resizes([gpu_job(held(3))], [room])
    assert (first.kind, first.node, second.node, third.node) == (K.GROW, "gpu1", "gpu2", "gpu2")
    assert first.reason.startswith("growing to 2 GPUs: gpu1, a node the job already runs on, has 1 idle GPU(s)")
    assert "none of the job's nodes (gpu1) has 1" in second.reason and third.reason.startswith("growing to 4 GPUs")


def test_a_waiting_two_gpu_job_sends_away_two_one_gpu_workers_newest_first() -> None:
    job = gpu_job((on_node("900_0", "gpu1", 100), on_node("900_1", "gpu1", 200), on_node("900_2", "gpu1", 300)))
    room = PartitionView("gpu", (IdleNode("gpu1", 0), IdleNode("gpu2", 0)), waiting_gpus=2, waiting_per_node=2)
    first, second = plan_resizes([job], [room])
    assert (first.kind, first.worker, second.worker) == (K.SHRINK, "900_2", "900_1")
    assert first.reason.startswith("shrinking to 3 GPUs") and second.reason.startswith("shrinking to 2 GPUs")


# ---------------------------------------------------------------- members of different sizes (real torch)
@pytest.mark.skipif(shutil.which("torchrun") is None and not (Path(sys.executable).parent / "torchrun").exists(),
                    reason="torchrun is not installed")
def test_torchrun_forms_one_group_of_members_with_different_local_world_sizes(tmp_path: Path) -> None:
    """Real torchrun (gloo, loopback): a member of 1 process and one of 3 form world size 4, and each
    process's run.local_world_size is its own member's."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import os, torch, torch.distributed as dist\n"
        "from dlsub.checkpointing.run import Run\n"
        "dist.init_process_group('gloo')\n"
        "t = torch.ones(1); dist.all_reduce(t)\n"
        "from pathlib import Path\n"
        "run = Run(Path(os.environ['OUT']))\n"
        "open(os.path.join(os.environ['OUT'], f'rank{run.rank}'), 'w').write("
        "f'{run.world_size} {run.local_world_size} {run.nodes} {t.item():.0f}')\n")
    from torch.distributed import TCPStore

    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    env = {**os.environ, "OUT": str(tmp_path)}
    # At least both members (an elastic job's range is 1:1+W, but with a minimum of one a member that starts
    # slowly on a loaded machine can miss the first round and wait for a second that never comes).
    # The rendezvous store is the test's own, on a port it holds from the start (no free-port race with
    # anything else on the machine), and neither member hosts it (is_host=false): with both on this host
    # each would otherwise try to, and the one that did would take the store away when it exited first.
    store = TCPStore("127.0.0.1", 0, is_master=True, multi_tenant=True, wait_for_workers=False)
    argv = [torchrun, "--nnodes=2:3", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{store.port}",
            "--rdzv-id=hetero", "--rdzv-conf=last_call_timeout=2,is_host=false"]
    # Each process through dlsub's entry point, as the launcher starts them: the probe leaves its group alive
    # at exit, as most scripts do, and the entry point ends it (without, a process died of SIGABRT at exit
    # about one run in six: run_support.end_process_group).
    members = [subprocess.Popen([*argv, f"--nproc-per-node={n}", *ENTRY_POINT, str(probe)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for n in (1, 3)]
    try:
        deadline = time.monotonic() + 180
        for member in members:
            try:
                out, _ = member.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pytest.fail("the members did not finish in 180 s:\n" + _outputs(members))
            assert member.returncode == 0, out.decode(errors="replace")[-2000:]
    finally:
        for member in members:
            if member.poll() is None:  # never left behind holding the port
                member.kill()
                member.wait()
        del store
    seen = sorted((tmp_path / f"rank{r}").read_text() for r in range(4))
    assert sorted(s.split()[1] for s in seen) == ["1", "3", "3", "3"], seen
    assert all(s.split()[0] == "4" and s.split()[2] == "2" and s.split()[3] == "4" for s in seen), seen


def _outputs(members: list[subprocess.Popen[bytes]]) -> str:
    """What each still-running member printed, for a failure's message (it is killed to read it)."""
    told = []
    for i, member in enumerate(members):
        member.kill()
        out, _ = member.communicate()
        told.append(f"--- member {i} ---\n" + (out or b"").decode(errors="replace")[-3000:])
    return "\n".join(told)


def test_a_slurm_that_refuses_the_pin_still_gets_the_worker_released(
        fake_slurm: FakeSlurm, client: SlurmClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake Slurm: a grow whose ``scontrol update ReqNodeList=`` fails releases the worker anyway (it then
    starts wherever its GPUs are idle, as grows did before pinning)."""
    from dlsub.agent.act import STEPS
    from dlsub.policies.actions.resize_rules import Resize
    from dlsub.slurm_plugins.client import SlurmError

    script = tmp_path / "w.sh"
    script.write_text("#!/bin/bash\n#SBATCH --array=0-1\n#SBATCH --hold\n#SBATCH -p gpu\nsleep 1\n")
    array = client.submit(script)

    point = client.point_at_node

    def refuse(job_id: int | str, node: str | None, partition: str | None = None) -> None:
        if node is not None:
            raise SlurmError(["scontrol", "update"], 1, "", "scontrol: error: Invalid node name specified")
        point(job_id, node, partition)

    monkeypatch.setattr(client, "point_at_node", refuse)
    grow = STEPS[K.GROW].call
    assert grow is not None
    grow(client, Resize(K.GROW, "0123abcd", 901, "test", worker=f"{array}_1", partition="gpu", node="gpu1"))
    assert fake_slurm.task(f"{array}_1").reason == "None", "released though the pin was refused"
    assert fake_slurm.task(f"{array}_0").reason == "JobHeldUser"


def test_a_grow_points_a_worker_left_on_another_partition_at_its_main_jobs_and_never_releases_it_elsewhere(
        fake_slurm: FakeSlurm, client: SlurmClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake Slurm: a worker whose main job the agent placed on another model's partition while it waited (the
    worker array stayed where it was submitted) is pointed at the main job's partition, with its node, in one
    update, then released; a Slurm that refuses that partition gets no release (the grow fails)."""
    from dlsub.agent.act import STEPS
    from dlsub.policies.actions.resize_rules import Resize
    from dlsub.slurm_plugins.client import SlurmError

    script = tmp_path / "w.sh"
    script.write_text("#!/bin/bash\n#SBATCH --array=0-1\n#SBATCH --hold\n#SBATCH -p gpu\nsleep 1\n")
    array = client.submit(script)
    grow = STEPS[K.GROW].call
    assert grow is not None
    grow(client, Resize(K.GROW, "0123abcd", 901, "test", worker=f"{array}_0", partition="gpu-dev", node="gpu2"))
    task = fake_slurm.task(f"{array}_0")
    assert (task.options["partition"], task.options["nodelist"], task.reason) == ("gpu-dev", "gpu2", "None")

    def refuse(argv: list[str]) -> None:
        if any(a.startswith("Partition=") for a in argv):
            raise SlurmError(argv, 1, "", "scontrol: error: Access/permission denied")

    run = client._run
    monkeypatch.setattr(client, "_run", lambda argv, **kw: refuse(argv) or run(argv, **kw))
    with pytest.raises(SlurmError, match="permission denied"):
        grow(client, Resize(K.GROW, "0123abcd", 901, "test", worker=f"{array}_1", partition="gpu-dev", node="gpu2"))
    task = fake_slurm.task(f"{array}_1")
    assert task.options["partition"] != "gpu-dev" and task.reason == "JobHeldUser", "released on the wrong partition"


# ---------------------------------------------------------------- sized by goodput in GPUs (pure)
def test_a_job_that_grows_in_place_keeps_its_gpus_and_adds_on_its_own_node_first() -> None:
    """place_counts on a live cluster (grow_in_place): not repacked onto the idle node, as the simulator may."""
    from dlsub.policies.api import Allocation, ClusterView, JobView, Node
    from dlsub.policies.elastic import place_counts

    cluster = ClusterView((Node("gpu1", 4), Node("gpu2", 4), Node("gpu3", 4)), grow_in_place=True)
    jobs = [JobView("a", 0.0, gpus=1, min_gpus=1, max_gpus=4),
            JobView("b", 1.0, gpus=2, min_gpus=2, max_gpus=6, step=2)]
    previous = {"a": Allocation(("gpu2",)), "b": Allocation(("gpu1", "gpu1"))}
    decision = place_counts({"a": 3, "b": 6}, jobs, cluster, previous)
    assert decision["a"].nodes == ("gpu2", "gpu2", "gpu2"), "its own node first"
    assert decision["b"].nodes == ("gpu1",) * 4 + ("gpu3",) * 2, "a whole step on one node: the roomiest"
    shrunk = place_counts({"b": 2}, jobs[1:], cluster, {"b": decision["b"]})
    assert shrunk["b"].nodes == ("gpu1", "gpu1"), "the oldest GPUs stay: the newest worker is the one that leaves"
    # The simulator's cluster re-places a job whose count changes (packed, tightest fit).
    moved = place_counts({"a": 4}, jobs[:1], ClusterView((Node("gpu1", 4), Node("gpu2", 4))), previous)
    assert moved["a"].nodes == ("gpu1",) * 4


def test_goodput_gives_a_job_its_minimum_plus_whole_steps_only() -> None:
    """JobView.step: a job of 1 to 8 GPUs whose workers have ``step`` GPUs gets its minimum plus whole steps,
    the most that fit under its maximum with perfect scaling (pure)."""
    from dlsub.policies.api import ClusterView, JobView
    from dlsub.policies.goodput import GoodputPolicy

    linear = _LinearModel()
    cluster = ClusterView.uniform(2, 4)
    for step, expected in ((1, 8), (2, 7), (3, 7), (4, 5)):
        job = JobView("j", 0.0, gpus=1, min_gpus=1, max_gpus=8, batch_size=64, remaining=1e4, step=step, model=linear)
        assert GoodputPolicy().decide([job], cluster, 0.0, {})["j"].gpus == expected, step


class _LinearModel:
    """Perfect scaling: a step takes 1 s on one GPU, 1/n on n."""

    trusted_gpus = None

    def step_time(self, placement: tuple[int, ...], batch_size: int) -> float:
        return 1.0 / sum(placement)

    def goodput(self, placement: tuple[int, ...], batch_size: int) -> float:
        return batch_size / self.step_time(placement, batch_size)

    def best_batch(self, placement: tuple[int, ...]) -> tuple[int, float]:
        return 64, self.goodput(placement, 64)


def _scaled_gpu_job(dlsub_id: str, uid: int, workers: tuple[WorkerTask, ...], rates: dict[int, float],
                    node: str = "gpu1", total: int = 5000) -> object:
    from dlsub.agent.live_models import LiveModels
    from dlsub.job_progress import MeasuredConfig, Progress

    job = ElasticJob(dlsub_id, uid * 10, uid, f"u{uid}", "RUNNING", False, "gpu", gpus_per_node=1, min_members=1,
                     max_members=4, submit_time=float(uid), worker_arrays=(uid * 100,), workers=workers, worker_gpus=1,
                     main_nodes=(node,))
    configs = tuple(MeasuredConfig(1, n, None, None, r, r * 64) for n, r in rates.items())
    return LiveModels().scaled(job, Progress(step=100, total_steps=total, configs=configs, first_time=0.0,
                                             latest_time=300.0), 300.0, None)


def test_goodput_grows_a_gpu_job_onto_the_idle_gpus_of_its_shared_node_where_the_policy_placed_them() -> None:
    """The agent's goodput sizing in GPUs (pure): gpu1 is shared with a rigid job, 2 GPUs idle there and 4 on
    gpu2; the policy adds the job's GPUs on its own node and each worker is pinned where the policy put it."""
    from dlsub.policies.actions.goodput_resize_rules import plan_by_policy
    from dlsub.policies.goodput import GoodputPolicy

    pool = tuple(WorkerTask(f"100_{i}", 100, "PENDING", "JobHeldUser", "gpu") for i in range(3))
    job = _scaled_gpu_job("0123abcd", 1, pool, {1: 2.0})
    room = PartitionView("gpu", (IdleNode("gpu1", 2), IdleNode("gpu2", 4)))
    grows = plan_by_policy([job], room, GoodputPolicy(), 300.0)  # type: ignore[list-item]
    assert [(a.kind, a.node) for a in grows] == [(K.GROW, "gpu1"), (K.GROW, "gpu1"), (K.GROW, "gpu2")], grows
    assert "placed by the policy on gpu1: gpu1, a node the job already runs on" in grows[0].reason
    assert grows[0].reason.startswith("growing to 2 GPUs (goodput policy)")


def test_another_users_job_on_the_same_node_never_shrinks_my_workers_however_well_it_says_it_scales() -> None:
    """Two users' jobs elastic in GPUs share gpu1 (pure): B's reports claim it scales 100x; A's workers stay,
    and B grows only onto what is idle."""
    from dlsub.policies.actions.goodput_resize_rules import plan_by_policy
    from dlsub.policies.goodput import GoodputPolicy

    mine = _scaled_gpu_job("aaaa0001", 1, (on_node("100_0", "gpu1", 100), on_node("100_1", "gpu1", 110)),
                           {1: 2.0, 2: 2.01, 3: 2.02})
    theirs = _scaled_gpu_job("bbbb0002", 2, tuple(WorkerTask(f"200_{i}", 200, "PENDING", "JobHeldUser", "gpu")
                                                 for i in range(3)), {1: 2.0, 2: 200.0}, total=10_000)
    assert plan_by_policy([mine, theirs], PartitionView("gpu", (IdleNode("gpu1", 0),)), GoodputPolicy(), 300.0) == []  # type: ignore[list-item]
    room = PartitionView("gpu", (IdleNode("gpu1", 0), IdleNode("gpu2", 1)))
    grows = plan_by_policy([mine, theirs], room, GoodputPolicy(),  # type: ignore[list-item]
                           300.0)
    assert [(a.kind, a.dlsub_id, a.node) for a in grows] == [(K.GROW, "bbbb0002", "gpu2")]
