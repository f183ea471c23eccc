"""Unit tests (pure; no Slurm, no simulator run): goodput's ``batch_on_placement`` option, which gives a job
placed over more nodes than the packed placement its size was judged on the batch its model rates best on the
nodes it got; and the ``times_compute`` switch the simulator reads (an experiment: the live agent's jobs
report no compute part of a step)."""

from __future__ import annotations

from dlsub.policies.api import Allocation, JobView
from dlsub.policies.goodput import GoodputPolicy
from dlsub.policies.perf_models.fitted_model import BatchLimits, FittedPerformance, GradientStats
from dlsub.policies.perf_models.throughput_fit import StepReport, fit
from dlsub.sim.information import information_for

LIMITS = BatchLimits(init_batch=128, max_batch=4096, min_local=16, max_local=512)
GRADS = GradientStats(sqr=1.0, var=50.0)  # noisy gradients: larger batches keep most of their efficiency


def test_times_compute_is_what_the_simulator_gives_the_policys_jobs() -> None:
    assert information_for("online", GoodputPolicy(times_compute=True)).times_compute is True  # type: ignore[union-attr]
    assert information_for("online", GoodputPolicy()).times_compute is False  # type: ignore[union-attr]


def spread_model() -> FittedPerformance:
    """A job whose step synchronises slowly across nodes: on two nodes a larger batch pays."""
    return FittedPerformance(fit([StepReport(1, 1, 64, 0, 0.10), StepReport(1, 1, 128, 0, 0.18),
                                  StepReport(1, 2, 64, 0, 0.12), StepReport(2, 2, 64, 0, 0.40),
                                  StepReport(2, 4, 64, 0, 0.45)]), LIMITS, GRADS)


def test_batch_on_placement_retunes_a_spread_job_to_its_real_placement() -> None:
    model = spread_model()
    view = JobView("j", 0.0, gpus=1, min_gpus=1, max_gpus=8, batch_size=128, adaptive_batch=True, model=model)
    packed_best = model.best_batch((2,))[0]
    spread_best = model.best_batch((1, 1))[0]
    assert spread_best > packed_best  # the premise: across nodes, the best batch is larger
    decision = {"j": Allocation(("a", "b"), packed_best)}
    retuned = GoodputPolicy.retuned(decision, {"j": view}, 4)["j"]
    assert retuned.nodes == ("a", "b") and retuned.batch_size == spread_best
    # Packed as judged (one node): the batch stays the one the policy chose.
    kept = GoodputPolicy.retuned({"j": Allocation(("a", "a"), packed_best)}, {"j": view}, 4)["j"]
    assert kept.batch_size == packed_best
    # A job that keeps its own batch size is never retuned.
    fixed = JobView("j", 0.0, gpus=1, min_gpus=1, max_gpus=8, batch_size=128, adaptive_batch=False, model=model)
    assert GoodputPolicy.retuned(decision, {"j": fixed}, 4)["j"].batch_size == packed_best
    # Judged on one GPU a node (packing 1: a live job of whole one-GPU nodes): two nodes are its packed placement.
    paired = JobView("j", 0.0, gpus=2, min_gpus=2, max_gpus=8, batch_size=128, adaptive_batch=True, packing=1,
                     model=model)
    assert GoodputPolicy.retuned(decision, {"j": paired}, 4)["j"].batch_size == packed_best
