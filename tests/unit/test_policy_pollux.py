"""Unit tests (pure; no Slurm): the ``pollux`` baseline's rules and invariants."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

import numpy as np
import pytest

import dlsub.policies.pollux as pollux_module
from dlsub.policies.api import Allocation, ClusterView, JobView, check_decision
from dlsub.policies.pollux import (
    EPSILON,
    PolluxPolicy,
    SpeedupMemo,
    TightestFit,
    choose_counts,
    fill_idle,
    grant,
    minimise,
    minimise_relaxed,
    place_pollux,
    restart_factor,
)
from dlsub.policies.registry import get_policy
from dlsub.sim.performance import performance_at
from dlsub.sim.workload import POLLUX_DIR


@dataclass
class Scaling:
    """Goodput ``gpus ** power`` at any batch; ``seen`` GPUs reported on (None: an oracle's model)."""

    power: float = 0.9
    seen: int | None = None

    @property
    def fitted(self) -> object:
        return None if self.seen is None else SimpleNamespace(max_replicas=self.seen)

    def step_time(self, placement: tuple[int, ...], batch_size: int) -> float:
        return 1.0

    def goodput(self, placement: tuple[int, ...], batch_size: int) -> float:
        return float(sum(placement)) ** self.power

    def best_batch(self, placement: tuple[int, ...]) -> tuple[int, float]:
        return 64 * sum(placement), self.goodput(placement, 0)


def job(name: str, model: Scaling | None = None, *, arrival: float = 0.0, hi: int = 64, restarts: int = 0,
        service: float = 0.0) -> JobView:
    return JobView(name=name, arrival_s=arrival, gpus=1, min_gpus=1, max_gpus=hi, batch_size=64,
                   adaptive_batch=True, attained_gpu_s=service, restarts=restarts,
                   model=model if model is not None else Scaling())


def counts(decision: dict[str, Allocation]) -> dict[str, int]:
    return {name: alloc.gpus for name, alloc in decision.items() if alloc.gpus}


def test_registered() -> None:
    assert get_policy("pollux").name == "pollux"


def test_minimise_is_exact() -> None:
    rng = random.Random(3)
    for _ in range(40):
        capacity = rng.randint(0, 6)
        costs = [np.array([rng.uniform(0, 10) for _ in range(rng.randint(1, 5))]) for _ in range(rng.randint(1, 4))]
        got = minimise(costs, capacity)
        assert sum(got) <= capacity
        best = min(sum(c[n] for c, n in zip(costs, ns, strict=True))
                   for ns in itertools.product(*(range(len(c)) for c in costs)) if sum(ns) <= capacity)
        assert sum(c[n] for c, n in zip(costs, got, strict=True)) == pytest.approx(best)


def test_every_job_runs_before_any_widens() -> None:
    cluster = ClusterView.uniform(2, 4)
    jobs = [job(f"j{i}", arrival=float(i)) for i in range(6)]
    got = counts(PolluxPolicy().decide(jobs, cluster, 600.0, {}))
    assert set(got) == {j.name for j in jobs} and sum(got.values()) == 8


def test_min_replicas_zero_a_job_may_get_nothing() -> None:
    cluster = ClusterView.uniform(1, 4)
    jobs = [job(f"j{i}", arrival=float(i)) for i in range(5)]
    decision = PolluxPolicy().decide(jobs, cluster, 600.0, {})
    check_decision(decision, jobs, cluster)
    assert sorted(counts(decision).values()) == [1, 1, 1, 1], "one job is left with nothing"
    # A running job can lose all its GPUs: five waiting jobs with better speed-ups than its own.
    running = job("old", Scaling(power=0.1, seen=4), restarts=30, arrival=0.0)
    fresh = [job(f"new{i}", Scaling(power=1.0, seen=4), arrival=500.0) for i in range(4)]
    previous = {"old": Allocation(("n000",) * 4)}
    got = counts(PolluxPolicy().decide([running, *fresh], cluster, 3600.0, previous))
    assert "old" not in got and sum(got.values()) == 4


def test_restart_penalty_keeps_a_job_that_restarted_too_often() -> None:
    cluster = ClusterView.uniform(1, 4)
    previous = {"a": Allocation(("n000",))}
    calm = job("a", Scaling(power=1.0, seen=2), restarts=0)
    assert counts(PolluxPolicy().decide([calm], cluster, 3600.0, previous)) == {"a": 4}
    # Restarted so often that its age is all restarts: any change leaves it nothing, so it stays.
    churned = job("a", Scaling(power=1.0, seen=2), restarts=200)
    assert restart_factor(churned, 3600.0, 30.0) == 0.0
    assert counts(PolluxPolicy().decide([churned], cluster, 3600.0, previous)) == {"a": 1}


def test_restart_factor_is_pollux_formula() -> None:
    assert restart_factor(job("a", restarts=2, arrival=100.0), 400.0, 30.0) == pytest.approx((300 - 60) / 330)


def test_trust_cap_is_twice_the_most_gpus_reported_on() -> None:
    cluster = ClusterView.uniform(4, 4)
    policy = PolluxPolicy()
    assert counts(policy.decide([job("a", Scaling(power=1.0, seen=3))], cluster, 60.0, {})) == {"a": 6}
    assert counts(policy.decide([job("a", Scaling(power=1.0, seen=0))], cluster, 60.0, {})) == {"a": 1}
    assert counts(policy.decide([job("a", Scaling(power=1.0, seen=None), hi=5)], cluster, 60.0, {})) == {"a": 5}


def test_never_more_gpus_than_exist_on_real_traces() -> None:
    """Oracle models of the Pollux applications, many jobs, uneven histories: every decision fits."""
    rng = random.Random(7)
    apps = ["bert", "cifar10", "deepspeech2", "imagenet", "yolov3"]
    from dlsub.sim.apps import load_application

    for trial in range(5):
        cluster = ClusterView.uniform(rng.randint(1, 4), 4)
        jobs = []
        for i in range(rng.randint(1, 30)):
            app = load_application(POLLUX_DIR / "traces" / rng.choice(apps))
            jobs.append(JobView(name=f"t{trial}-{i}", arrival_s=rng.uniform(0, 600), gpus=1, min_gpus=1,
                                max_gpus=min(64, app.max_batch_size // app.min_local_bsz),
                                batch_size=app.init_batch_size, adaptive_batch=True,
                                attained_gpu_s=rng.uniform(0, 1e4), restarts=rng.randint(0, 5),
                                model=performance_at(app, rng.randrange(3))))
        previous: dict[str, Allocation] = {}
        for now in (600.0, 660.0, 720.0):
            decision = PolluxPolicy().decide(jobs, cluster, now, previous)
            check_decision(decision, jobs, cluster)
            assert sum(a.gpus for a in decision.values()) <= cluster.total_gpus
            assert all(a.batch_size for a in decision.values()), "every job is given its re-tuned batch"
            previous = decision


def test_a_job_that_needs_a_node_gets_a_node_or_nothing() -> None:
    cluster = ClusterView.uniform(2, 4)
    wide = JobView(name="wide", arrival_s=0.0, gpus=4, min_gpus=4, max_gpus=8, batch_size=64,
                   adaptive_batch=True, model=Scaling(seen=4))
    small = [job(f"s{i}", Scaling(seen=1), arrival=float(i)) for i in range(6)]
    decision = PolluxPolicy().decide([wide, *small], cluster, 600.0, {})
    check_decision(decision, [wide, *small], cluster)
    assert counts(decision).get("wide", 0) in (0, 4, 5, 6, 7, 8)


def _cost_by_nodes(across: float) -> Callable[[str, tuple[str, ...]], float]:
    """Cost of a job on ``nodes``: its inverse speed-up, ``across`` of each GPU lost when it spans nodes."""
    def cost(name: str, nodes: tuple[str, ...]) -> float:
        if not nodes:
            return 1000.0
        speed = len(nodes) * (across if len(set(nodes)) > 1 else 1.0)
        return 1.0 / speed
    return cost


def test_placement_one_multi_node_job_per_node() -> None:
    cluster = ClusterView.uniform(2, 4)
    big = Allocation(("n000", "n000", "n001", "n001"))
    jobs = {"big": job("big"), "x": job("x")}
    # x's 3 GPUs would have to span both nodes, which big already spans: it gets the 2 one node holds.
    got = place_pollux({"big": 4, "x": 3}, jobs, cluster, {"big": big}, _cost_by_nodes(0.9), {"big": 4, "x": 3})
    assert got["big"] == big
    assert len(set(got["x"].nodes)) == 1 and got["x"].gpus == 2


def test_placement_spreads_only_where_the_job_gains() -> None:
    cluster = ClusterView.uniform(2, 4)
    previous = {"a": Allocation(("n000", "n000")), "b": Allocation(("n001", "n001"))}
    jobs = {name: job(name) for name in ("a", "b", "x")}
    wanted = {"a": 2, "b": 2, "x": 4}
    caps = {"a": 2, "b": 2, "x": 4}
    # Four GPUs over two nodes at 0.9 a GPU (speed 3.6) beat two on one node (2): spread.
    spread = place_pollux(wanted, jobs, cluster, previous, _cost_by_nodes(0.9), caps)
    assert spread["x"].gpus == 4 and len(set(spread["x"].nodes)) == 2
    # At 0.4 a GPU (speed 1.6) two on one node are better: x gets 2, and the 2 left idle stay so
    # (x cannot grow on a node it is not on, nor a or b past their caps).
    packed = place_pollux(wanted, jobs, cluster, previous, _cost_by_nodes(0.4), caps)
    assert packed["x"].gpus == 2 and len(set(packed["x"].nodes)) == 1


def test_placement_idle_gpus_go_to_a_waiting_job() -> None:
    cluster = ClusterView.uniform(2, 4)
    previous = {"a": Allocation(("n000", "n000", "n000")), "b": Allocation(("n001", "n001", "n001"))}
    jobs = {name: job(name) for name in ("a", "b", "w")}
    # The counts leave w nothing, and a GPU idle on each node: w gets one (its cost falls from 1000).
    got = place_pollux({"a": 3, "b": 3}, jobs, cluster, previous, _cost_by_nodes(0.9), {"a": 3, "b": 3, "w": 4})
    assert got["w"].gpus == 1


def _first_minimum_per_row(costs: list[np.ndarray], capacity: int) -> list[int]:
    """The knapsack by its (capacity x counts) matrix per job and the first minimum of each row: what
    minimise computed before it worked on slices, kept here as the reference it must match exactly."""
    dp = np.full(capacity + 1, math.inf)
    dp[0] = 0.0
    used = np.arange(capacity + 1)[:, None]
    choices = []
    for cost in costs:
        counts = np.arange(min(len(cost) - 1, capacity) + 1)[None, :]
        before = used - counts
        candidates = np.where(before >= 0, dp[np.clip(before, 0, None)], math.inf) + cost[: counts.shape[1]]
        best = np.argmin(candidates, axis=1)
        dp = candidates[np.arange(capacity + 1), best]
        choices.append(best)
    left = int(np.argmin(dp))
    result = []
    for best in reversed(choices):
        result.append(int(best[left]))
        left -= result[-1]
    return result[::-1]


def test_minimise_matches_the_matrix_knapsack_exactly_ties_and_infinities_included() -> None:
    """Unit: the sliced DP chooses exactly what the matrix form chooses, on costs rounded to force ties and
    with the counts below a job's minimum infinite (as decide gives them), wider jobs than capacity too."""
    rng = np.random.default_rng(5)
    for _ in range(30):
        capacity = int(rng.integers(0, 60))
        costs = []
        for _ in range(int(rng.integers(1, 25))):
            width = int(rng.integers(1, 20))
            cost = np.round(1.0 / (np.concatenate(([0.0], np.cumsum(rng.random(width)))) + 1e-3), 1)
            cost[1: int(rng.integers(1, 4))] = math.inf
            costs.append(cost)
        assert minimise(costs, capacity) == _first_minimum_per_row(costs, capacity)


def test_minimise_ties_go_to_fewer_gpus() -> None:
    """Unit: a job whose cost is the same on 1, 2 and 3 GPUs gets 1; the GPUs it leaves go to no one."""
    assert minimise([np.array([5.0, 1.0, 1.0, 1.0]), np.array([5.0, 2.0, 2.0])], 6) == [1, 1]


@dataclass
class _CountingScaling(Scaling):
    """Scaling whose best batch has twice the goodput of any fixed one, counting the placements asked."""

    asked: list[tuple[int, ...]] = field(default_factory=list)

    def best_batch(self, placement: tuple[int, ...]) -> tuple[int, float]:
        self.asked.append(placement)
        return 64, 2 * self.goodput(placement, 64)


def test_speedups_are_shared_by_jobs_on_one_model_within_a_decision_and_kept_apart_otherwise() -> None:
    """Unit: a second job on the same model gets the same row without asking the model again; a job on
    another model asks its own; a job that keeps its batch size is not served the adaptive job's row (its
    speed-ups use its fixed batch); each row is the one computed without the memo."""
    policy, shared, other = PolluxPolicy(), _CountingScaling(0.5), _CountingScaling(0.5)
    memo: SpeedupMemo = {}
    first = policy.speedups(job("a", shared), 8, 2, 4, memo)
    asked = len(shared.asked)
    assert asked > 0 and policy.speedups(job("b", shared), 8, 2, 4, memo) is first and len(shared.asked) == asked
    assert list(policy.speedups(job("c", other), 8, 2, 4, memo)) == list(first) and len(other.asked) == asked
    fixed = replace(job("d", shared), adaptive_batch=False)
    assert list(policy.speedups(fixed, 8, 2, 4, memo)) == list(policy.speedups(fixed, 8, 2, 4))
    assert len(shared.asked) == asked and len(memo) == 3
    assert list(first) == list(policy.speedups(job("a", shared), 8, 2, 4))


def test_minimise_relaxed_is_within_one_jobs_change_of_exact_and_fits() -> None:
    """The price-a-GPU knapsack (pollux above EXACT_CELLS) against the exact one, on costs shaped as
    pollux's are (1 / (speed-up + epsilon), speed-ups concave in GPUs, some jobs needing a minimum)."""
    rng = random.Random(11)
    for _ in range(60):
        costs = []
        for _ in range(rng.randint(1, 40)):
            power, hi, lo = rng.uniform(0.3, 1.0), rng.randint(1, 16), rng.choice([1, 1, 1, 2, 4])
            cost = np.array([1000.0] + [1.0 / (n ** power + 1e-3) for n in range(1, hi + 1)])
            cost[1:lo] = math.inf
            costs.append(cost)
        capacity = rng.randint(0, 120)
        exact, relaxed = minimise(costs, capacity), minimise_relaxed(costs, capacity)
        assert sum(relaxed) <= capacity
        assert all(n == 0 or math.isfinite(cost[n]) for cost, n in zip(costs, relaxed, strict=True))
        exact_total, relaxed_total = (sum(cost[n] for cost, n in zip(costs, counts, strict=True))
                                      for counts in (exact, relaxed))
        # Optimal but for the jobs the price leaves between two counts: within one job's largest change.
        spread = max(cost[0] - min(cost) for cost in costs)
        assert exact_total <= relaxed_total + 1e-9 <= exact_total + spread + 1e-9
        if sum(int(np.argmin(cost)) for cost in costs) <= capacity:
            assert relaxed == [int(np.argmin(cost)) for cost in costs]  # nothing binds: each at its best


def test_minimise_relaxed_on_convex_costs_is_exact() -> None:
    """Where every job's cost falls ever more slowly with its GPUs, the price-a-GPU optimum is the exact one."""
    rng = random.Random(5)
    for _ in range(40):
        offsets = [rng.uniform(0.1, 2.0) for _ in range(rng.randint(1, 30))]
        costs = [np.array([1.0 / (n + offset) for n in range(rng.randint(2, 9))]) for offset in offsets]
        capacity = rng.randint(0, 100)
        exact, relaxed = minimise(costs, capacity), minimise_relaxed(costs, capacity)
        assert sum(c[n] for c, n in zip(costs, relaxed, strict=True)) == pytest.approx(
            sum(c[n] for c, n in zip(costs, exact, strict=True)), rel=1e-12)


def test_choose_counts_is_exact_below_the_limit_and_relaxed_above(monkeypatch: pytest.MonkeyPatch) -> None:
    costs = [np.array([3.0, 1.0, 0.9, 0.2]), np.array([3.0, 0.5, 0.4, 0.1])]
    assert choose_counts(costs, 3) == minimise(costs, 3)
    monkeypatch.setattr(pollux_module, "EXACT_CELLS", 1)
    called = []
    monkeypatch.setattr(pollux_module, "minimise_relaxed", lambda c, k: called.append(k) or [0, 0])
    assert choose_counts(costs, 3) == [0, 0] and called == [3]


def _fill_by_every_node(decision: dict[str, Allocation], free: dict[str, int], jobs: dict[str, JobView],
                        cost_at: Callable[[str, tuple[str, ...]], float],
                        caps: dict[str, int]) -> dict[str, Allocation]:
    """The idle-GPU fill as it was written first, trying every node for every job: the reference that
    fill_idle must match exactly."""
    while True:
        best: tuple[float, str, tuple[str, ...]] | None = None
        for node in (node for node in free if free[node] > 0):
            for name in jobs:
                held = decision[name].nodes if name in decision else ()
                if set(held) - {node}:
                    continue
                before = cost_at(name, held)
                for extra in range(1, min(free[node], caps[name] - len(held)) + 1):
                    gain = before - cost_at(name, held + (node,) * extra)
                    if gain > 0 and (best is None or gain > best[0]):
                        best = (gain, name, held + (node,) * extra)
        if best is None:
            return decision
        grant(decision, free, jobs, best[1], best[2])


def _pollux_cost(jobs: dict[str, JobView], previous: dict[str, Allocation]) -> Callable[[str, tuple[str, ...]], float]:
    """Pollux's cost of a job on nodes at 300 s (fair share 2), as its decision gives place_pollux."""
    policy = PolluxPolicy()

    def cost_at(name: str, placed: tuple[str, ...]) -> float:
        scaled = policy.speedup(jobs[name], tuple(Counter(placed).values()), 2) if placed else 0.0
        had = previous.get(name)
        if had is None or Counter(had.nodes) != Counter(placed):
            scaled *= restart_factor(jobs[name], 300.0, 30.0)
        return 1.0 / (scaled + EPSILON)

    return cost_at


def test_fill_idle_matches_trying_every_node() -> None:
    """Pollux's own cost (speed-up where the GPUs are, restart factor unless they are the job's old ones)
    on random clusters: the same grants as the search over every node, ties included."""
    rng = random.Random(7)
    for _ in range(150):
        cluster = ClusterView.uniform(rng.randint(1, 5), rng.choice([2, 4]))
        names = [f"j{i}" for i in range(rng.randint(1, 6))]
        jobs = {name: job(name, Scaling(power=rng.choice([0.5, 0.9, 1.0])), arrival=rng.choice([0.0, 500.0]))
                for name in names}
        nodes = [node.name for node in cluster.nodes]
        previous = {name: Allocation((rng.choice(nodes),) * rng.randint(1, 2)) for name in names
                    if rng.random() < 0.5}
        decision: dict[str, Allocation] = {}
        free = dict(cluster.capacity())
        for name in names:  # some jobs already placed on one node, or two
            if rng.random() < 0.5:
                room = [node for node in nodes if free[node] > 0]
                if room:
                    picked = tuple(rng.choice(room) for _ in range(rng.randint(1, 2)))
                    if all(free[node] >= picked.count(node) for node in picked):
                        decision[name] = Allocation(picked)
                        for node in picked:
                            free[node] -= 1
        caps = {name: rng.randint(1, 6) for name in names}
        cost_at = _pollux_cost(jobs, previous)
        want = _fill_by_every_node(dict(decision), dict(free), jobs, cost_at, caps)
        assert fill_idle(dict(decision), dict(free), jobs, previous, cost_at, caps) == want


def test_tightest_fit_agrees_with_a_scan() -> None:
    rng = random.Random(2)
    free = {f"n{i}": rng.randint(0, 8) for i in range(40)}
    tightest = TightestFit(free)
    for _ in range(200):
        most = max(free.values())
        assert tightest.most() == most
        if most == 0:
            break
        want = rng.randint(1, most)
        node = tightest.node(want)
        assert node == min((n for n in free if free[n] >= want), key=free.__getitem__)
        free[node] -= rng.randint(1, want)
        tightest.changed({node})


def test_minimise_relaxed_leaves_jobs_that_cannot_go_without_to_the_table() -> None:
    costs = [np.array([math.inf, 2.0, 1.0]), np.array([5.0, 1.0, 0.5])]
    assert minimise_relaxed(costs, 2) == minimise(costs, 2) == [1, 1]
