"""Unit (pure, no Slurm): when an elastic job grows, shrinks, or has its workers ended."""

from __future__ import annotations

import dataclasses

from dlsub.policies.actions.gpu_kind_rules import retype_waiting
from dlsub.policies.actions.kinds import ActionKind as K
from dlsub.policies.actions.move_views import Action
from dlsub.policies.actions.partition_view import PartitionView
from dlsub.policies.actions.resize_rules import ElasticJob, WorkerTask, plan_resizes
from dlsub.policies.api import IdleNode


def pool(array: int = 900, count: int = 1) -> tuple[WorkerTask, ...]:
    return tuple(WorkerTask(f"{array}_{i}", array, "PENDING", "JobHeldUser", "gpu") for i in range(count))


def running(handle: str, node: str, start: float = 100.0) -> WorkerTask:
    return WorkerTask(handle, int(handle.split("_")[0]) + 1, "RUNNING", "None", "gpu", (node,), 0, start)


def elastic(workers: tuple[WorkerTask, ...], dlsub_id: str = "0123abcd", **kw: object) -> ElasticJob:
    fields: dict[str, object] = dict(dlsub_id=dlsub_id, slurm_job_id=901, uid=1001, user="ann", state="RUNNING",
                                     ended=False, partition="gpu", gpus_per_node=2, min_members=1, max_members=2,
                                     submit_time=10.0, worker_arrays=(900,), workers=workers)
    fields.update(kw)
    return ElasticJob(**fields)  # type: ignore[arg-type]


GPU = PartitionView("gpu", (IdleNode("gpu1", 2), IdleNode("gpu2", 4)))


def test_an_idle_node_nobody_waits_for_grows_the_job() -> None:
    (action,) = plan_resizes([elastic(pool())], [GPU])
    assert action.kind == K.GROW and action.worker == "900_0" and action.partition == "gpu"
    assert "growing to 2 node(s)" in action.reason


def test_no_growth_onto_gpus_a_waiting_job_wants() -> None:
    busy = PartitionView("gpu", (IdleNode("gpu1", 0), IdleNode("gpu2", 4)), waiting_gpus=4)
    assert plan_resizes([elastic(pool())], [busy]) == []


def test_no_growth_past_max_or_while_a_released_worker_is_still_starting() -> None:
    at_max = elastic((running("900_0", "gpu2"),) + pool(count=1)[0:0])
    assert plan_resizes([at_max], [GPU]) == []
    starting = elastic((WorkerTask("900_0", 902, "PENDING", "Resources", "gpu"),))
    assert plan_resizes([starting], [GPU]) == [], "a released task that has not started yet counts as joining"


def test_a_waiting_job_that_needs_the_node_shrinks_the_job_back() -> None:
    job = elastic((running("900_0", "gpu2"),))
    waiting = PartitionView("gpu", (IdleNode("gpu1", 0), IdleNode("gpu2", 2)), waiting_gpus=4, waiting_per_node=4)
    (action,) = plan_resizes([job], [waiting])
    assert action.kind == K.SHRINK and action.worker == "900_0"
    assert "jobs waiting on gpu need 4 GPU(s) and 2 are idle" in action.reason


def test_a_worker_on_a_node_the_waiting_job_cannot_use_stays() -> None:
    job = elastic((running("900_0", "gpu2"),))
    elsewhere = PartitionView("cpu", (IdleNode("cpu1", 0),), waiting_gpus=4, waiting_per_node=4)
    assert plan_resizes([job], [GPU, elsewhere]) == []


def test_only_as_many_workers_leave_as_the_waiting_jobs_need() -> None:
    job = elastic((running("900_0", "gpu2", start=100), running("900_1", "gpu1", start=200)), max_members=3)
    room = PartitionView("gpu", (IdleNode("gpu1", 0), IdleNode("gpu2", 0)), waiting_gpus=2, waiting_per_node=2)
    (action,) = plan_resizes([job], [room])
    assert action.kind == K.SHRINK and action.worker == "900_1", "the newest worker leaves first"


def test_the_workers_of_an_ended_job_are_cancelled() -> None:
    (action,) = plan_resizes([elastic(pool(), state="COMPLETED", ended=True)], [GPU])
    assert action.kind == K.END_WORKERS and action.array == 900 and action.worker is None


def test_a_worker_that_keeps_failing_is_not_released_again() -> None:
    tired = (WorkerTask("900_0", 900, "PENDING", "JobHeldUser", "gpu", restart_count=99),)
    assert plan_resizes([elastic(tired)], [GPU]) == []


def test_the_oldest_job_grows_first_under_fifo() -> None:
    one_node = PartitionView("gpu", (IdleNode("gpu2", 2),))  # room for one 2-GPU worker
    young = elastic(pool(800), dlsub_id="bbbbbbbb", submit_time=50.0, slurm_job_id=801)
    old = elastic(pool(900), dlsub_id="aaaaaaaa", submit_time=10.0)
    (action,) = plan_resizes([young, old], [one_node])
    assert action.dlsub_id == "aaaaaaaa"


def test_a_node_with_room_for_two_workers_grows_two_jobs() -> None:
    """4 idle GPUs on one node hold two 2-GPU workers (CPUs and memory permitting): both jobs grow."""
    roomy = PartitionView("gpu", (IdleNode("gpu2", 4, 4, 8000),))
    young = elastic(pool(800), dlsub_id="bbbbbbbb", submit_time=50.0, slurm_job_id=801, cpus_per_node=2,
                    memory_per_node_mb=4000)
    old = elastic(pool(900), dlsub_id="aaaaaaaa", submit_time=10.0, cpus_per_node=2, memory_per_node_mb=4000)
    assert sorted(a.dlsub_id for a in plan_resizes([young, old], [roomy])) == ["aaaaaaaa", "bbbbbbbb"]
    short_of_memory = PartitionView("gpu", (IdleNode("gpu2", 4, 4, 6000),))
    assert [a.dlsub_id for a in plan_resizes([young, old], [short_of_memory])] == ["aaaaaaaa"]


def test_a_job_that_is_moving_or_pending_is_not_resized() -> None:
    assert plan_resizes([elastic(pool(), moving=True)], [GPU]) == []
    assert plan_resizes([elastic(pool(), state="PENDING")], [GPU]) == []


def test_a_waiting_job_that_needs_a_whole_node_shrinks_a_job_spread_over_two() -> None:
    """4 GPUs idle in all, 2 on each node: a job wanting 4 on one node cannot start until a worker leaves."""
    job = elastic((running("900_0", "gpu2"),))
    split = PartitionView("gpu", (IdleNode("gpu1", 2), IdleNode("gpu2", 2)), waiting_gpus=4, waiting_per_node=4)
    (action,) = plan_resizes([job], [split])
    assert action.kind == K.SHRINK and action.worker == "900_0"
    assert plan_resizes([elastic(pool())], [split]) == [], "and nothing grows onto them meanwhile"


def test_a_host_list_expands_within_bounds() -> None:
    """Unit (pure): Slurm's compressed host lists, and a refusal of one that names absurdly many nodes."""
    import pytest

    from dlsub.slurm_plugins.models import expand_nodes

    assert expand_nodes("gpu[1-2],cpu1") == ["gpu1", "gpu2", "cpu1"]
    assert expand_nodes("n[001-003,7]") == ["n001", "n002", "n003", "n7"]
    assert expand_nodes("") == []
    with pytest.raises(ValueError, match="names more than"):
        expand_nodes("n[0-999999999]")


def test_two_jobs_one_gpu_worker_each_both_leave_for_a_job_that_needs_two_on_their_node() -> None:
    """gpu1 full: two jobs' 1-GPU workers and their 1-GPU mains; a job waits for 2 GPUs on one node. Neither
    worker frees enough alone, both together do: both leave (the live framework test's shape)."""
    old = elastic((running("900_0", "gpu1"),), dlsub_id="aaaaaaaa", gpus_per_node=1, submit_time=10.0)
    young = elastic((running("800_0", "gpu1"),), dlsub_id="bbbbbbbb", gpus_per_node=1, submit_time=50.0,
                    slurm_job_id=801, worker_arrays=(800,))
    full = PartitionView("gpu", (IdleNode("gpu1", 0), IdleNode("gpu2", 0)), waiting_gpus=2, waiting_per_node=2)
    actions = plan_resizes([old, young], [full])
    assert [(a.kind, a.worker) for a in actions] == [(K.SHRINK, "800_0"), (K.SHRINK, "900_0")], actions
    wants_one = PartitionView("gpu", (IdleNode("gpu1", 0), IdleNode("gpu2", 0)), waiting_gpus=1, waiting_per_node=1)
    (action,) = plan_resizes([old, young], [wants_one])
    assert action.worker == "800_0", "one GPU wanted: only the newest job's worker leaves"
    one_leaving = elastic((WorkerTask("800_0", 801, "RUNNING", "None", "gpu", ("gpu1",), 0, 100.0, leaving=True),),
                          dlsub_id="bbbbbbbb", gpus_per_node=1, submit_time=50.0, slurm_job_id=801,
                          worker_arrays=(800,))
    (action,) = plan_resizes([old, one_leaving], [full])
    assert action.worker == "900_0", "the next tick: the other leaves too, the first already on its way"


# ---------------------------------------------------------------- jobs waiting for one kind of GPU
A100, V100 = "a100", "v100"


def test_a_job_waiting_for_one_kind_shrinks_a_worker_on_that_kind_not_the_newest_jobs_on_another() -> None:
    """A job asks for gres:gpu:a100:1. Newest first would send away the v100 job's worker, whose GPU it cannot
    use (and nobody may grow onto while it waits): the older job's worker on a100 leaves instead."""
    older = elastic((running("900_0", "gpu1"),), dlsub_id="0000a100", submit_time=10.0, gpus_per_node=1,
                    gpu_type=A100)
    newer = elastic((running("800_0", "gpu2"),), dlsub_id="0000b100", slurm_job_id=801, worker_arrays=(800,),
                    submit_time=20.0, gpus_per_node=1, gpu_type=V100)
    full = (IdleNode("gpu1", 0, gpu_type=A100), IdleNode("gpu2", 0, gpu_type=V100))
    (action,) = plan_resizes([older, newer], [PartitionView("gpu", full, 1, 1, ((A100, 1),))])
    assert (action.kind, action.dlsub_id, action.worker) == (K.SHRINK, "0000a100", "900_0")
    untyped = plan_resizes([older, newer], [PartitionView("gpu", full, 1, 1)])
    assert [(a.kind, a.dlsub_id) for a in untyped] == [(K.SHRINK, "0000b100")], "any kind: newest first, as before"


def test_idle_gpus_of_another_kind_neither_count_for_a_typed_waiting_job_nor_are_kept_for_it() -> None:
    """v100 GPUs are idle and the waiting job wants an a100: the a100 worker still leaves for it, and the v100
    job may grow onto the idle v100 (they are nobody's), but never onto an idle a100 it waits for."""
    on_a100 = elastic((running("900_0", "gpu1"),), dlsub_id="0000a100", gpus_per_node=1, gpu_type=A100)
    room = PartitionView("gpu", (IdleNode("gpu1", 0, gpu_type=A100), IdleNode("gpu2", 2, gpu_type=V100)), 1, 1,
                         ((A100, 1),))
    (action,) = plan_resizes([on_a100], [room])
    assert (action.kind, action.worker) == (K.SHRINK, "900_0")
    grower = elastic(pool(), dlsub_id="0000b100", slurm_job_id=801, gpus_per_node=1, gpu_type=V100,
                     worker_gpus=1, main_nodes=("gpu2",))
    (grow,) = plan_resizes([grower], [room])
    assert (grow.kind, grow.node) == (K.GROW, "gpu2")
    kept = PartitionView("gpu", (IdleNode("gpu1", 1, gpu_type=A100), IdleNode("gpu2", 0, gpu_type=V100)), 1, 1,
                         ((A100, 1),))
    assert plan_resizes([grower], [kept]) == [], "the idle a100 is the waiting job's"


def test_a_job_placed_on_a_kind_this_tick_counts_against_that_kind_in_the_same_tick() -> None:
    """The waiting job was read untyped; once placed on v100 its GPU is v100's, so the v100 worker leaves for it
    (not the newer a100 job's); placed back on any kind, it is untyped again."""
    waiting = elastic((), dlsub_id="0000c100", state="PENDING", gpus_per_node=1, waiting=True)
    on_v100 = elastic((running("900_0", "gpu2"),), dlsub_id="0000a100", submit_time=10.0, gpus_per_node=1,
                      gpu_type=V100)
    on_a100 = elastic((running("800_0", "gpu1"),), dlsub_id="0000b100", slurm_job_id=801, worker_arrays=(800,),
                      submit_time=20.0, gpus_per_node=1, gpu_type=A100)
    room = PartitionView("gpu", (IdleNode("gpu1", 0, gpu_type=A100), IdleNode("gpu2", 0, gpu_type=V100)), 1, 1)
    place = Action(K.PLACE, "0000c100", 901, "placed", partition="gpu", gpus=1, gpu_type=V100)
    placed = retype_waiting(room, [place], {"0000c100": waiting})
    assert placed.waiting_by_kind == ((V100, 1),)
    (action,) = plan_resizes([on_v100, on_a100], [placed])
    assert (action.kind, action.dlsub_id) == (K.SHRINK, "0000a100")
    pinned = dataclasses.replace(waiting, asked_gpu_type=V100)
    unplace = dataclasses.replace(place, gpu_type="")
    assert retype_waiting(placed, [unplace], {"0000c100": pinned}).waiting_by_kind == ()


def test_a_job_whose_training_finished_is_not_grown() -> None:
    """Its training wrote its finished event; its container is still exiting. A grow would restart the group
    to train nothing (a live run's job was grown so, resumed at its last step and failed four times)."""
    assert plan_resizes([elastic(pool(), finished=True)], [GPU]) == []
    assert plan_resizes([elastic(pool())], [GPU]) != []
