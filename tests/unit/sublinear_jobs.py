"""Unit-test helpers (pure): a toy throughput model and jobs of known length for goodput's own tests."""

from __future__ import annotations

from dlsub.policies.api import JobView


class SublinearModel:
    """A toy: goodput ``n ** 0.6`` on n GPUs wherever they are, at any batch. A second GPU adds 0.52 of the
    first's, a third 0.41, a fourth 0.36 (all below goodput's efficiency floor, 0.75)."""

    def goodput(self, placement: tuple[int, ...], batch_size: int) -> float:
        return float(sum(placement)) ** 0.6

    def best_batch(self, placement: tuple[int, ...]) -> tuple[int, float]:
        return 64, self.goodput(placement, 64)

    def step_time(self, placement: tuple[int, ...], batch_size: int) -> float:
        rate = self.goodput(placement, batch_size)
        return batch_size / rate if rate > 0 else float("inf")


def known(name: str, remaining: float, arrival: float) -> JobView:
    """A job of known length (``remaining`` s on one GPU), running on one GPU, elastic up to four."""
    return JobView(name, arrival, gpus=1, min_gpus=1, max_gpus=4, batch_size=64, remaining=remaining,
                   model=SublinearModel())
