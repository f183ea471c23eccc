"""Unit tests (pure; no Slurm, no simulator run): goodput's two issue-54 options, both off by default:
``spare_floor``, a marginal-GPU efficiency threshold on the spare GPUs of step 4, and ``las_ties``, jobs of equal
rank served least attained service first."""

from __future__ import annotations

from sublinear_jobs import SublinearModel, known

from dlsub.policies.api import Allocation, ClusterView, JobView, Node
from dlsub.policies.goodput import GoodputPolicy


def guessed(name: str, arrival: float, progress: float = 0.0) -> JobView:
    """A job that states no length (goodput guesses it), elastic up to four GPUs, ``progress`` done (on the toy
    model one GPU does one unit a second)."""
    return JobView(name, arrival, gpus=1, min_gpus=1, max_gpus=4, batch_size=64, progress=progress,
                   model=SublinearModel())


def test_spare_gpus_go_only_while_each_adds_the_floors_share_of_one() -> None:
    """On the toy model a second GPU adds 0.52 of the first, a third 0.41, a fourth 0.36: alone on four GPUs,
    a job of unknown length takes all four by default, two at a floor of 0.45, one at 0.6."""
    cluster = ClusterView((Node("n0", 4),))
    job = guessed("only", 0.0)
    assert GoodputPolicy().spare_floor == 0.0
    assert GoodputPolicy().decide([job], cluster, 0.0, {})["only"].gpus == 4
    assert GoodputPolicy(spare_floor=0.45).decide([job], cluster, 0.0, {})["only"].gpus == 2
    assert GoodputPolicy(spare_floor=0.6).decide([job], cluster, 0.0, {})["only"].gpus == 1


def test_the_spare_floor_holds_jobs_of_known_length_too_and_with_packed_values() -> None:
    cluster = ClusterView((Node("n0", 4),))
    job = known("only", 1_000.0, 0.0)
    for place_aware in (True, False):
        assert GoodputPolicy(place_aware=place_aware).decide([job], cluster, 0.0, {})["only"].gpus == 4
        floored = GoodputPolicy(place_aware=place_aware, spare_floor=0.45).decide([job], cluster, 0.0, {})
        assert floored["only"].gpus == 2


def test_equal_ranks_go_to_the_job_with_least_service_under_las_ties() -> None:
    """A running job of unknown length that has done five hours on one GPU ranks with a newcomer (its level is
    four hours, ranked a level down: one hour, the newcomer's guess). By arrival it keeps its GPU; with
    ``las_ties`` the newcomer, who has done nothing, takes it."""
    cluster = ClusterView((Node("n0", 1),))
    old = guessed("old", 0.0, progress=5 * 3600.0)
    new = guessed("new", 100.0)
    previous = {"old": Allocation(("n0",), 64)}
    assert set(GoodputPolicy().decide([old, new], cluster, 20_000.0, previous)) == {"old"}
    assert set(GoodputPolicy(las_ties=True).decide([old, new], cluster, 20_000.0, previous)) == {"new"}


def test_las_ties_leave_a_running_job_a_level_below_in_place() -> None:
    """Under an hour of work a running job ranks a level below a newcomer: it keeps its GPU either way."""
    cluster = ClusterView((Node("n0", 1),))
    old = guessed("old", 0.0, progress=1800.0)
    new = guessed("new", 100.0)
    previous = {"old": Allocation(("n0",), 64)}
    assert set(GoodputPolicy(las_ties=True).decide([old, new], cluster, 2_000.0, previous)) == {"old"}
