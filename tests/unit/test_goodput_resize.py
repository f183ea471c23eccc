"""Unit (pure, no Slurm): an elastic policy sizes elastic jobs on what they measured
(policies/actions/goodput_resize_rules.py).

The jobs' models are fitted from measured rates exactly as the agent fits
them (dlsub.agent.live_models); the policy is ``goodput``.
"""

from __future__ import annotations

import dataclasses

from dlsub.agent.live_models import LiveModels
from dlsub.job_progress import MeasuredConfig, Progress
from dlsub.policies.actions.goodput_resize_rules import ScaledJob, measured_text, model_text, plan_by_policy
from dlsub.policies.actions.kinds import ActionKind as K
from dlsub.policies.actions.partition_view import PartitionView
from dlsub.policies.actions.resize_rules import ElasticJob, WorkerTask
from dlsub.policies.api import IdleNode
from dlsub.policies.goodput import GoodputPolicy
from dlsub.policies.perf_models.fitted_model import NO_GAIN, GradientStats

NOW = 1_000_000.0
BATCH = 64
POLICY = GoodputPolicy(restart_penalty_s=20.0, restart_weight=1.0)


def job(dlsub_id: str, *, uid: int, nodes: int, max_members: int, submit: float, workers_running: int = 0,
        pool: int = 2) -> ElasticJob:
    running = tuple(WorkerTask(f"{uid}{i}_0", 100 + i, "RUNNING", "None", "gpu", (f"gpu{i}",),
                               start_time=NOW - 100 + i) for i in range(workers_running))
    held = tuple(WorkerTask(f"{uid}{i}_1", 200 + i, "PENDING", "JobHeldUser", "gpu") for i in range(pool))
    return ElasticJob(dlsub_id, slurm_job_id=uid, uid=uid, user=f"u{uid}", state="RUNNING", ended=False,
                      partition="gpu", gpus_per_node=2, min_members=1, max_members=max_members, submit_time=submit,
                      worker_arrays=(uid * 10,), workers=running + held, cpus_per_node=2, memory_per_node_mb=4096)


def measured(rates: dict[int, float]) -> tuple[MeasuredConfig, ...]:
    """Steps/s at each node count (2 GPUs a node), with samples/s at a global batch of BATCH (not reported)."""
    return tuple(MeasuredConfig(n, 2 * n, None, None, r, r * BATCH) for n, r in rates.items())


def scaled(models: LiveModels, j: ElasticJob, rates: dict[int, float], step: int = 100,
           total: int = 5000) -> ScaledJob:
    progress = Progress(step=step, total_steps=total, configs=measured(rates), first_time=NOW - 300,
                        latest_time=NOW)
    return models.scaled(j, progress, NOW, None)


def test_the_spare_node_goes_to_the_job_that_scales_well_not_the_older_one() -> None:
    models = LiveModels()
    # The poor scaler came first and has run on 1 and 2 nodes: no faster on 2.
    poor = scaled(models, job("poor", uid=1, nodes=2, max_members=3, submit=NOW - 900, workers_running=1),
                  {1: 2.0, 2: 2.02})
    # The good scaler has run on 1 node only; its model is the fit plus Pollux's optimistic prior.
    good = scaled(models, job("good", uid=2, nodes=1, max_members=2, submit=NOW - 300), {1: 2.0})
    room = PartitionView("gpu", (IdleNode("gpu2", 2),))
    actions = plan_by_policy([poor, good], room, POLICY, NOW)
    assert [(a.kind, a.dlsub_id) for a in actions] == [(K.GROW, "good")]
    reason = actions[0].reason
    assert "growing to 2 nodes" in reason and "measured 1 node (2 GPUs) 128 samples/s" in reason
    assert "predicted 2 nodes" in reason and "saved" in reason


def test_a_node_is_taken_from_a_poor_scaler_only_to_give_it_to_a_better_one() -> None:
    models = LiveModels()
    poor = scaled(models, job("poor", uid=1, nodes=2, max_members=3, submit=NOW - 900, workers_running=1),
                  {1: 2.0, 2: 2.02})
    alone = plan_by_policy([poor], PartitionView("gpu", ()), POLICY, NOW)
    assert alone == [], "nobody else wants the node: the job keeps it (a shrink would only cost a restart)"
    # Less work left than the poor scaler (goodput serves the shorter first: with equal work the tie between
    # the two went by the float noise of their fits).
    good = scaled(models, job("good", uid=1, nodes=1, max_members=2, submit=NOW - 300), {1: 2.0, 2: 3.9},
                  total=4000)
    actions = plan_by_policy([poor, good], PartitionView("gpu", ()), POLICY, NOW)
    assert [(a.kind, a.dlsub_id) for a in actions] == [(K.SHRINK, "poor")]
    assert "another elastic job of yours gains more" in actions[0].reason
    assert "measured 1 node" in actions[0].reason


def test_the_policy_is_told_the_restarts_the_jobs_start_events_count() -> None:
    models = LiveModels()
    j = job("j", uid=1, nodes=1, max_members=2, submit=NOW - 300)
    progress = Progress(step=100, total_steps=5000, configs=measured({1: 2.0}), first_time=NOW - 300,
                        latest_time=NOW, starts=4)
    assert models.scaled(j, progress, NOW, None).view.restarts == 3, "three restarts after its first start"
    assert scaled(models, j, {1: 2.0}).view.restarts == 0


def test_another_users_reported_throughput_never_shrinks_my_job() -> None:
    """Its reports are its own word (it could inflate them): my node is not taken for it."""
    models = LiveModels()
    mine = scaled(models, job("mine", uid=1, nodes=2, max_members=3, submit=NOW - 900, workers_running=1),
                  {1: 2.0, 2: 2.02})
    boasts = scaled(models, job("boasts", uid=2, nodes=1, max_members=2, submit=NOW - 300), {1: 2.0, 2: 400.0})
    assert plan_by_policy([mine, boasts], PartitionView("gpu", ()), POLICY, NOW) == []


def test_a_user_at_the_gpu_limit_does_not_grow() -> None:
    models = LiveModels()
    good = scaled(models, job("good", uid=2, nodes=1, max_members=2, submit=NOW - 300), {1: 2.0, 2: 3.9})
    room = PartitionView("gpu", (IdleNode("gpu2", 2),))
    assert plan_by_policy([good], room, POLICY, NOW, headroom={2: 0}) == []
    assert [a.kind for a in plan_by_policy([good], room, POLICY, NOW, headroom={2: 2})] == [K.GROW]


def test_waiting_jobs_keep_their_claim_on_idle_nodes() -> None:
    models = LiveModels()
    good = scaled(models, job("good", uid=2, nodes=1, max_members=2, submit=NOW - 300), {1: 2.0, 2: 3.9})
    room = PartitionView("gpu", (IdleNode("gpu2", 2),), waiting_gpus=2, waiting_per_node=2)
    assert plan_by_policy([good], room, POLICY, NOW) == []


def test_a_job_that_measured_nothing_says_its_model_is_the_prior() -> None:
    models = LiveModels()
    fresh = scaled(models, job("fresh", uid=3, nodes=1, max_members=2, submit=NOW), {})
    assert measured_text(fresh) == "nothing yet (the model is the prior)"
    assert fresh.view.remaining == 4900.0 and fresh.view.gpus == 2 and fresh.view.max_gpus == 4


def test_idle_gpus_on_a_node_without_the_cpus_or_memory_for_a_worker_are_no_slot() -> None:
    models = LiveModels()
    good = scaled(models, job("good", uid=2, nodes=1, max_members=2, submit=NOW - 300), {1: 2.0, 2: 3.9})
    short_of_memory = PartitionView("gpu", (IdleNode("gpu2", 2, 4, 3904),))
    assert plan_by_policy([good], short_of_memory, POLICY, NOW) == [], "a 4 GB worker would wait there"
    short_of_cpus = PartitionView("gpu", (IdleNode("gpu2", 2, 1, 8000),))
    assert plan_by_policy([good], short_of_cpus, POLICY, NOW) == []
    roomy = PartitionView("gpu", (IdleNode("gpu2", 2, 2, 4096),))
    assert [a.kind for a in plan_by_policy([good], roomy, POLICY, NOW)] == [K.GROW]


def test_a_waiting_job_takes_its_node_from_the_newest_elastic_job_first() -> None:
    """resize.plan_resizes (any policy): the older job keeps its worker, as efifo does in the simulator."""
    from dlsub.policies.actions.resize_rules import plan_resizes

    older = job("older", uid=1, nodes=2, max_members=2, submit=NOW - 900, workers_running=1)
    newer = job("newer", uid=2, nodes=2, max_members=2, submit=NOW - 300, workers_running=1)
    room = PartitionView("gpu", (IdleNode("gpu0", 0), IdleNode("gpu1", 0)), waiting_gpus=2, waiting_per_node=2)
    for jobs in ([older, newer], [newer, older]):
        actions = plan_resizes(jobs, [room])
        assert [(a.kind, a.dlsub_id) for a in actions] == [(K.SHRINK, "newer")], actions


def test_each_job_is_checked_against_its_own_worker_shape() -> None:
    """Another job asking for a whole node's worth per worker does not hide a node a smaller job fits."""
    models = LiveModels()
    small = scaled(models, job("small", uid=1, nodes=1, max_members=2, submit=NOW - 300), {1: 2.0, 2: 3.9})
    big_job = dataclasses.replace(job("big", uid=2, nodes=1, max_members=2, submit=NOW - 900, pool=0),
                                  gpus_per_node=4, cpus_per_node=4, memory_per_node_mb=8000)
    big = scaled(models, big_job, {1: 2.0})
    room = PartitionView("gpu", (IdleNode("gpu2", 2, 2, 4096),))
    assert [(a.kind, a.dlsub_id) for a in plan_by_policy([small, big], room, POLICY, NOW)] == [(K.GROW, "small")]


def test_a_declared_batch_too_small_for_its_limits_does_not_stop_the_partition() -> None:
    """limits whose per-replica maximum dwarfs the batch used to make split_batch divide by zero."""
    from dlsub.batch_split import BatchLimits, split_batch

    huge = BatchLimits(init_batch=10**9, max_batch=10**9, min_local=10**9, max_local=10**9)
    assert split_batch(huge, 4, 1) == (1, 0)


def test_a_new_job_starts_from_what_its_users_earlier_run_of_the_same_command_measured() -> None:
    """Throughput history is kept per (user, partition, command digest): never another user's word."""
    models = LiveModels()

    def run_of(dlsub_id: str, uid: int, rates: dict[int, float], command: str | None = "a" * 32,
               grads: tuple[float, float] | None = None) -> ScaledJob:
        progress = Progress(step=100, configs=measured(rates), first_time=NOW - 300, latest_time=NOW,
                            application=command, grads=grads)
        return models.scaled(job(dlsub_id, uid=uid, nodes=1, max_members=3, submit=NOW), progress, NOW, None)

    def replicas_known(scaled: ScaledJob) -> int:
        return scaled.view.model.fitted.max_replicas  # type: ignore[attr-defined, no-any-return]

    run_of("earlier", 1, {1: 2.0, 2: 3.9, 3: 5.7}, grads=(1.0, 8.0))
    models.forget_except(set())  # it ended: its model goes, its measurements stay
    fresh = run_of("fresh", 1, {})
    assert replicas_known(fresh) == 6
    assert measured_text(fresh) == "nothing yet; earlier runs of the command measured 3 other configurations"
    assert measured_text(run_of("fresh", 1, {1: 2.0})).endswith("measured 2 other configurations")
    assert fresh.view.model.grads == GradientStats(1.0, 8.0)  # type: ignore[attr-defined]
    assert run_of("fresh", 1, {}, grads=(2.0, 1.0)).view.model.grads == GradientStats(2.0, 1.0)  # type: ignore[attr-defined]
    assert replicas_known(run_of("other-args", 1, {}, command="b" * 32)) == 0
    assert replicas_known(run_of("no-digest", 1, {}, command=None)) == 0
    other_user = run_of("other-user", 2, {})
    assert replicas_known(other_user) == 0 and other_user.view.model.grads == NO_GAIN  # type: ignore[attr-defined]
    # Its own first report, three times slower than the earlier run's: another model; that run is left out.
    assert replicas_known(run_of("slower", 1, {1: 0.6})) == 2


def test_a_job_is_sized_on_what_it_measured_on_the_kind_of_gpu_it_runs_on() -> None:
    """Unit (pure): what a job measured on another kind of GPU (before a move) is left out of its fit, and an
    earlier run of the same command lends its measurements only on the same kind."""
    models = LiveModels()
    on_a100 = tuple(dataclasses.replace(c, gpu_type="a100") for c in measured({1: 2.0, 2: 3.9, 3: 5.7}))
    on_v100 = tuple(dataclasses.replace(c, gpu_type="v100") for c in measured({1: 0.5}))

    def sized(dlsub_id: str, configs: tuple[MeasuredConfig, ...], gpu_type: str) -> ScaledJob:
        progress = Progress(step=100, configs=configs, first_time=NOW - 300, latest_time=NOW,
                            application="a" * 32, gpu_type=gpu_type)
        return models.scaled(job(dlsub_id, uid=1, nodes=1, max_members=3, submit=NOW), progress, NOW, None)

    assert sized("first", on_a100, "a100").borrowed == 0
    models.forget_except(set())  # it ended; its a100 measurements stay in the history
    moved = sized("moved", on_a100 + on_v100, "v100")  # another run, moved from a100 to v100
    assert moved.measured == {(1, 2): (0.5, 0.5 * BATCH)} and moved.borrowed == 0
    assert measured_text(moved) == f"1 node (2 GPUs) {0.5 * BATCH:.0f} samples/s on v100", "dlsub why names the kind"
    assert moved.view.model.fitted.max_replicas == 2  # type: ignore[attr-defined]
    models.forget_except(set())
    assert sized("again-a100", (), "a100").borrowed == 3, "the a100 run's three sizes, on a100"
    assert sized("again-v100", (), "v100").borrowed == 1, "only the v100 one, on v100"


def test_every_resize_reason_says_which_model_sized_the_job() -> None:
    """``dlsub why`` shows the reason: the prior, the job's own fit, or a fit with earlier runs' configurations."""
    models = LiveModels()
    fresh = scaled(models, job("fresh", uid=3, nodes=1, max_members=2, submit=NOW), {})
    assert model_text(fresh) == "the throughput model's prior (it has measured nothing yet)"
    ran = scaled(models, job("ran", uid=3, nodes=2, max_members=3, submit=NOW), {1: 2.0, 2: 3.9})
    assert model_text(ran) == "its throughput fit on 2 sizes it ran"
    assert model_text(dataclasses.replace(ran, borrowed=1)) == \
        "its throughput fit on 2 sizes it ran and 1 configuration of earlier runs of its command"
    assert model_text(dataclasses.replace(ran, view=dataclasses.replace(ran.view, model=None))) == \
        "no model (its own size)"
    good = scaled(models, job("good", uid=2, nodes=1, max_members=2, submit=NOW - 300), {1: 2.0})
    (grow,) = plan_by_policy([good], PartitionView("gpu", (IdleNode("gpu2", 2),)), POLICY, NOW)
    assert "sized on its throughput fit on 1 size it ran; measured 1 node" in grow.reason


def test_jobs_of_whole_nodes_on_larger_nodes_are_judged_on_their_own_placement() -> None:
    """The live goodput test's moment (pure): two of one user's jobs of 2-GPU nodes on the testbed's 4-GPU nodes,
    another user's job on gpu1. The poor scaler measured 2 nodes no faster than 1; asked about 4 GPUs packed on
    one node (4,), a placement it can never run at, its fit promised more and it kept the node the good scaler
    gains from. Asked about (2, 2), as it runs, it gives the node back."""
    models = LiveModels()
    poor_worker = WorkerTask("10_0", 11, "RUNNING", "None", "gpu", ("gpu2",), start_time=NOW - 200)
    poor = dataclasses.replace(job("poor", uid=1, nodes=2, max_members=2, submit=NOW - 600, pool=0),
                               workers=(poor_worker,), main_nodes=("gpu1",))
    good = dataclasses.replace(job("good", uid=1, nodes=1, max_members=2, submit=NOW - 60, pool=1),
                               main_nodes=("gpu2",))
    # Both declare ~11,000 steps, about the live test's 400 digits epochs: within what goodput trusts a
    # declaration for (trust_declared times the guess, ~8,600 steps here), so they are sized on their lengths.
    jobs = [scaled(models, poor, {1: 153 / BATCH, 2: 149 / BATCH}, total=11_000),
            scaled(models, good, {1: 153 / BATCH}, total=11_000)]
    room = PartitionView("gpu", (IdleNode("gpu1", 0, 1, 6000), IdleNode("gpu2", 0, 2, 6000)))
    actions = plan_by_policy(jobs, room, POLICY, NOW)
    assert [(a.kind, a.dlsub_id, a.worker) for a in actions] == [(K.SHRINK, "poor", "10_0")], actions


def test_a_batch_tuned_on_the_placement_says_so_in_the_reason() -> None:
    """goodput's ``batch_on_placement``: the batch a grow hands a job is its model's best on the nodes it was
    placed on, and ``dlsub why`` says so; without the option the reason names the batch alone."""
    limits = {"init": BATCH, "max": 16 * BATCH, "local_min": 8, "local_max": 4 * BATCH}

    def grow(policy: GoodputPolicy) -> str:
        models = LiveModels()
        progress = Progress(step=100, total_steps=5000, configs=measured({1: 2.0}), first_time=NOW - 300,
                            latest_time=NOW, batch_limits=limits)
        good = models.scaled(job("good", uid=2, nodes=1, max_members=2, submit=NOW - 300), progress, NOW, None)
        (action,) = plan_by_policy([good], PartitionView("gpu", (IdleNode("gpu2", 2),)), policy, NOW)
        return action.reason

    tuned = grow(POLICY)  # the option is goodput's default
    assert "micro-step(s) of" in tuned and "the best its model rates on the 2 nodes it was placed on" in tuned
    # place_aware (the default too): the reason says where the GPUs were valued
    assert "its GPUs valued where they are: on 2 nodes" in tuned
    plain = grow(GoodputPolicy(restart_penalty_s=20.0, restart_weight=1.0, batch_on_placement=False,
                               place_aware=False))
    assert "micro-step(s) of" in plain and "it was placed on" not in plain and "valued where" not in plain


def test_the_policy_grows_no_job_whose_training_finished() -> None:
    """The same good scaler and spare node, its training finished (its group is on its way out): no grow."""
    models = LiveModels()
    done = dataclasses.replace(job("good", uid=2, nodes=1, max_members=2, submit=NOW - 300), finished=True)
    room = PartitionView("gpu", (IdleNode("gpu2", 2),))
    assert plan_by_policy([scaled(models, done, {1: 2.0})], room, POLICY, NOW) == []
    going = job("good", uid=2, nodes=1, max_members=2, submit=NOW - 300)
    assert plan_by_policy([scaled(models, going, {1: 2.0})], room, POLICY, NOW) != []
