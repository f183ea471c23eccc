"""Unit tests (pure; no Slurm, no simulator run): goodput's ``spare_by_remaining`` (issue 32), spare GPUs valued
for a job of known length as for one of unknown length, its speed-up weighted by its remaining work, so that
spare GPUs go to the shorter of two jobs that speed up alike (in seconds saved they went to the longer)."""

from __future__ import annotations

from dlsub.policies.api import ClusterView, JobView, Node
from dlsub.policies.goodput import GoodputPolicy


class SublinearModel:
    """A toy: goodput ``n ** 0.6`` on n GPUs wherever they are, at any batch (a second GPU adds 0.52 of the
    first's: below the efficiency floor, so each job is given one and the rest are spare)."""

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


def test_spare_gpus_go_to_the_shorter_of_two_known_jobs() -> None:
    cluster = ClusterView((Node("n0", 4),))
    jobs = [known("short", 100.0, 0.0), known("long", 10_000.0, 1.0)]
    # Valued in seconds saved, a GPU saves the long job a hundred times what it saves the short one.
    old = GoodputPolicy(spare_by_remaining=False).decide(jobs, cluster, 0.0, {})
    assert (old["short"].gpus, old["long"].gpus) == (1, 3)
    new = GoodputPolicy(spare_by_remaining=True).decide(jobs, cluster, 0.0, {})
    assert (new["short"].gpus, new["long"].gpus) == (3, 1)
    # Off by default (not shown to help at every load on untouched workloads).
    assert not GoodputPolicy().spare_by_remaining
