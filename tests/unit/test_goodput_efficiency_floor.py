"""Unit tests (pure; no Slurm, no simulator run): goodput's ``efficiency_floor``, the share of its first GPU's
goodput that a GPU more must add before a job of known length takes it ahead of the jobs behind it (issue 32:
0.75, was 0.25)."""

from __future__ import annotations

from sublinear_jobs import known

from dlsub.policies.api import ClusterView, Node
from dlsub.policies.goodput import GoodputPolicy


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
