"""Unit tests (pure; no Slurm, no simulator run): goodput's ``efficiency_floor``, the share of its first GPU's
goodput that a GPU more must add before a job of known length takes it ahead of the jobs behind it (issue 32:
0.75, was 0.25)."""

from __future__ import annotations

from dlsub.policies.api import ClusterView, JobView, Node
from dlsub.policies.goodput import GoodputPolicy


class SublinearModel:
    """A toy: goodput ``n ** 0.6`` on n GPUs wherever they are, at any batch. A second GPU adds 0.52 of the
    first's, a third 0.41, a fourth 0.36."""

    def goodput(self, placement: tuple[int, ...], batch_size: int) -> float:
        return float(sum(placement)) ** 0.6

    def best_batch(self, placement: tuple[int, ...]) -> tuple[int, float]:
        return 64, self.goodput(placement, 64)

    def step_time(self, placement: tuple[int, ...], batch_size: int) -> float:
        rate = self.goodput(placement, batch_size)
        return batch_size / rate if rate > 0 else float("inf")


def known(name: str, remaining: float, arrival: float) -> JobView:
    return JobView(name, arrival, gpus=1, min_gpus=1, max_gpus=4, batch_size=64, remaining=remaining,
                   model=SublinearModel())


def test_a_short_job_takes_gpus_that_add_less_than_the_floor_only_after_the_jobs_behind_it_have_one() -> None:
    cluster = ClusterView((Node("n0", 4),))
    short, long_ = known("short", 100.0, 0.0), known("long", 10_000.0, 1.0)
    waiting = [known(f"w{i}", 20_000.0 + i, 2.0 + i) for i in range(2)]
    jobs = [short, long_, *waiting]
    # At the old floor the shortest job grows while each GPU adds a quarter of its first: it takes two, and the
    # last of the four jobs gets none.
    old = GoodputPolicy(efficiency_floor=0.25).decide(jobs, cluster, 0.0, {})
    assert old["short"].gpus > 1 and len(old) < 4
    # At 0.75 (the default) no GPU beyond the first adds that much: every job gets one.
    new = GoodputPolicy().decide(jobs, cluster, 0.0, {})
    assert GoodputPolicy().efficiency_floor == 0.75
    assert {name: alloc.gpus for name, alloc in new.items()} == {"short": 1, "long": 1, "w0": 1, "w1": 1}


def test_spare_gpus_still_go_to_jobs_whatever_the_floor() -> None:
    """The floor orders who comes first, it leaves no GPU idle: alone on four GPUs, a job gets all four."""
    cluster = ClusterView((Node("n0", 4),))
    alone = GoodputPolicy().decide([known("only", 1_000.0, 0.0)], cluster, 0.0, {})
    assert alone["only"].gpus == 4
