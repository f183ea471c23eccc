"""Unit tests (pure; no Slurm, no simulator run): goodput's ``spare_by_remaining`` (issue 32), spare GPUs valued
for a job of known length as for one of unknown length, its speed-up weighted by its remaining work, so that
spare GPUs go to the shorter of two jobs that speed up alike (in seconds saved they went to the longer)."""

from __future__ import annotations

from sublinear_jobs import known

from dlsub.policies.api import ClusterView, Node
from dlsub.policies.goodput import GoodputPolicy


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
