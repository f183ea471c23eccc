"""Unit tests (pure; no Slurm): what the simulator charges a resize in place and a restart (issue 52).

A resize in place (the same kind of GPUs, grown onto a superset or shrunk onto a subset of the GPUs a job
held on each node) pays ``SimConfig.resize_penalty_s`` (dlsub's measured grow in process, 6 s, by default; a
shrink ``SimConfig.shrink_penalty_s``, 0.4 s); a move to other
nodes or another kind, and every start after waiting, the restart penalty; ``resize_penalty_s=None``
charges a resize a restart, as before.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import ClassVar

import pytest

from dlsub.policies.api import Allocation, Allocations, ClusterView, Decision, Jobs, Node, Policy
from dlsub.policies.registry import get_policy
from dlsub.sim.engine import SimConfig, SimJob, make_jobs, resized_in_place, simulate
from dlsub.sim.workload import POLLUX_DIR, WorkloadJob

TRACES = POLLUX_DIR / "traces"


@pytest.fixture()
def typed_traces(tmp_path: Path) -> Path:
    """cifar10's traces as two kinds of GPU, fast and slow, with the same step times."""
    app = tmp_path / "traces" / "cifar10"
    app.mkdir(parents=True)
    for path in (TRACES / "cifar10").glob("*.csv"):
        shutil.copy(path, app / path.name)
    for kind in ("placements", "scalability"):
        for gpu_type in ("fast", "slow"):
            shutil.copy(TRACES / "cifar10" / f"{kind}.csv", app / f"{kind}-{gpu_type}.csv")
    return tmp_path / "traces"


def _job(config: SimConfig, cluster: ClusterView | None = None, traces: Path = TRACES) -> SimJob:
    spec = [WorkloadJob("cifar10-0", 0.0, "cifar10", 1, 128)]
    return make_jobs(spec, traces, get_policy("goodput"), config, cluster)[0]


def test_resized_in_place_is_a_grow_or_shrink_on_the_gpus_held() -> None:
    """Unit: the rule. Grown onto more GPUs of its nodes (or more nodes), shrunk onto some of them: a resize;
    another node, another kind, a reshape that is neither, or a first start: not."""
    two = Allocation(("a", "a"))
    assert resized_in_place(two, Allocation(("a",) * 4), "", "")
    assert resized_in_place(two, Allocation(("a", "a", "b", "b")), "", "")
    assert resized_in_place(Allocation(("a", "a", "b", "b")), Allocation(("b", "b")), "", "")
    assert resized_in_place(two, Allocation(("a",)), "", "")
    assert not resized_in_place(two, Allocation(("b",) * 4), "", "")  # moved
    assert not resized_in_place(Allocation(("a", "a", "b")), Allocation(("a", "b", "b")), "", "")  # reshaped
    assert not resized_in_place(two, Allocation(("a",) * 4), "fast", "slow")  # another kind
    assert not resized_in_place(None, two, "", "")  # a start
    assert not resized_in_place(two, Allocation(("a", "a")), "", "")  # no change


def test_a_grow_in_place_pays_the_resize_penalty_and_a_move_a_restart() -> None:
    """Unit: the charge, by default. First start 30 s (a restart, as before); grow on its node 6 s (the measured
    grow in process); a move to another node 30 s; a shrink onto its node 0.4 s (the measured shrink in
    process); a start after waiting 30 s."""
    job = _job(SimConfig())
    job.reallocate(Allocation(("n0", "n0")), 60.0, 30.0)
    assert job.penalty_left == 30.0
    job.reallocate(Allocation(("n0",) * 4), 120.0, 30.0)
    assert job.penalty_left == 6.0 and job.resizes == 1
    job.reallocate(Allocation(("n1",) * 4), 180.0, 30.0)
    assert job.penalty_left == 30.0 and job.resizes == 1
    job.reallocate(Allocation(("n1",)), 240.0, 30.0)
    assert job.penalty_left == 0.4 and job.resizes == 2
    job.reallocate(None, 300.0, 30.0)
    job.reallocate(Allocation(("n1",) * 2), 360.0, 30.0)
    assert job.penalty_left == 30.0 and job.starts == 5 and job.resizes == 2


def test_resize_costs_a_restart_when_told_so_and_nothing_when_free() -> None:
    """Unit: the bounds. resize_penalty_s None is the behaviour before issue 52 (a resize is a restart); 0 is
    free; a resize never costs more than the job's restart."""
    for cost, expected in ((None, 30.0), (0.0, 0.0), (10.0, 10.0), (45.0, 30.0)):
        job = _job(SimConfig(resize_penalty_s=cost))
        job.reallocate(Allocation(("n0",)), 60.0, 30.0)
        job.reallocate(Allocation(("n0",) * 3), 120.0, 30.0)
        assert job.penalty_left == expected, cost
        assert job.view().resize_s == (None if cost is None else expected)


class _Grow:
    """A policy that puts the one job on ``before`` until ``switch_s``, then on ``after``."""

    name: ClassVar[str] = "grow"
    elastic: ClassVar[bool] = True

    def __init__(self, before: tuple[str, ...], after: tuple[str, ...], switch_s: float) -> None:
        self.before, self.after, self.switch_s = before, after, switch_s

    def decide(self, jobs: Jobs, cluster: ClusterView, now: float, previous: Allocations) -> Decision:
        return {job.name: Allocation(self.before if now < self.switch_s else self.after) for job in jobs}


def _jct(policy: Policy, cluster: ClusterView, **config: object) -> tuple[float, int, int]:
    result = simulate([WorkloadJob("cifar10-0", 0.0, "cifar10", 2, 256, epochs=10)], TRACES, policy, cluster,
                      SimConfig(**config))  # type: ignore[arg-type]
    job = result.jobs[0]
    assert job.jct_s is not None
    return job.jct_s, job.restarts, job.resizes


def test_in_the_simulation_a_grow_in_place_loses_the_resize_penalty_and_a_move_the_restart() -> None:
    """Unit: end to end. The same job grows from 2 to 4 GPUs at 180 s; in place it loses 6 s of the 4-GPU
    run (24 s less than when a resize costs a restart, 30 s less than that with the resize free); moved onto
    another node it loses a restart's 30 s at any resize cost."""
    cluster = ClusterView.uniform(2, 4)
    grow = _Grow(("n000",) * 2, ("n000",) * 4, 180)
    measured, restarts, resizes = _jct(grow, cluster)
    as_restart, _, none_in_place = _jct(grow, cluster, resize_penalty_s=None, shrink_penalty_s=None)
    free, _, _ = _jct(grow, cluster, resize_penalty_s=0)
    assert (restarts, resizes, none_in_place) == (1, 1, 0)
    assert as_restart - measured == pytest.approx(24, abs=1)
    assert measured - free == pytest.approx(6, abs=1)
    move = _Grow(("n000",) * 2, ("n001",) * 4, 180)
    moved, _, moved_in_place = _jct(move, cluster)
    moved_as_restart, _, _ = _jct(move, cluster, resize_penalty_s=None, shrink_penalty_s=None)
    assert moved_in_place == 0 and moved == moved_as_restart == pytest.approx(as_restart, abs=1)


def test_a_move_across_kinds_pays_the_restart(typed_traces: Path) -> None:
    """Unit: on a cluster of two kinds, growing onto the same node's kind is a resize; going to the other kind,
    even onto as many GPUs, is a restart."""
    cluster = ClusterView((Node("f0", 4, gpu_type="fast"), Node("s0", 4, gpu_type="slow")))
    job = _job(SimConfig(), cluster, typed_traces)
    job.reallocate(Allocation(("f0",)), 60.0, 30.0, "fast")
    job.reallocate(Allocation(("f0",) * 2), 120.0, 30.0, "fast")
    assert job.penalty_left == 6.0
    job.reallocate(Allocation(("s0",) * 2), 180.0, 30.0, "slow")
    assert job.penalty_left == 30.0 and job.gpu_type == "slow" and job.resizes == 1


def test_sia_calibration_restarts_per_application_and_resizes_at_the_measured_cost(typed_traces: Path) -> None:
    """Unit: in Sia's calibration a restart costs the application's (cifar10 50 s, what the job is told 30 s,
    Sia's tables; no one-GPU profile here); a resize the measured 10 s, told as such; with resizes as restarts,
    the restart."""
    cluster = ClusterView((Node("f0", 4, gpu_type="fast"), Node("s0", 4, gpu_type="slow")))
    for cost, charged, told in ((10.0, 10.0, 10.0), (None, 50.0, None)):
        config = SimConfig(calibration="sia", resize_penalty_s=cost, profile_s=0.0, profile_cost="flat")
        job = _job(config, cluster, typed_traces)
        job.reallocate(Allocation(("f0",)), 60.0, 30.0, "fast")
        assert job.penalty_left == 50.0
        job.reallocate(Allocation(("f0",) * 4), 120.0, 30.0, "fast")
        assert job.penalty_left == charged
        view = job.view()
        assert view.restart_s == 30.0 and view.resize_s == told


def test_cli_simulate_takes_a_resize_penalty_or_restart() -> None:
    """Unit: `dlsub simulate --resize-penalty` takes seconds, GROW/SHRINK seconds or "restart" (the behaviour
    before issue 52), and refuses anything else with a usage error."""
    from click.testing import CliRunner

    from dlsub.cli.main import main
    from dlsub.cli.simulate_command import _resize_penalty

    assert _resize_penalty("restart") == (None, None) and _resize_penalty("0") == (0.0, 0.0)
    assert _resize_penalty("9.5") == (9.5, 9.5) and _resize_penalty("6/0.4") == (6.0, 0.4)
    for bad in ("soon", "-1", "nan", "1/2/3"):
        result = CliRunner().invoke(main, ["simulate", "pollux/workloads/workload-1.csv", "--resize-penalty", bad])
        assert result.exit_code == 2 and "GROW/SHRINK seconds or 'restart'" in result.output, (bad, result.output)


# -- what goodput is told, across GPU types ---------------------------------------------------------------


def test_in_place_nodes_grows_onto_a_superset_and_shrinks_onto_a_subset() -> None:
    """Unit: in a type's configurations (below a node on one node, else whole nodes), a job's new GPUs on the
    ones it holds plus free ones, or on some of its own; None where no such placement fits."""
    from dlsub.policies.sia import in_place_nodes

    free = {"a": 4, "b": 8, "c": 8, "d": 3}  # its own GPUs (on a) counted free
    assert in_place_nodes(("a", "a"), 4, free, 8) == ("a",) * 4
    assert in_place_nodes(("a", "a"), 1, free, 8) == ("a",)
    assert in_place_nodes(("a", "a"), 8, free, 8) is None  # a has 4 free: not a whole node
    assert in_place_nodes(("b",) * 8, 16, free, 8) == ("b",) * 8 + ("c",) * 8
    assert in_place_nodes(("b",) * 8 + ("c",) * 8, 8, free, 8) == ("b",) * 8
    assert in_place_nodes(("d",) * 2, 4, free, 8) is None  # 3 free on d
    assert in_place_nodes(("a",) * 2, 2, free, 8) is None  # no change


def test_typed_goodput_prices_a_resize_at_the_resize_cost_and_a_move_at_the_restart() -> None:
    """Unit: goodput across types leaves a running job more of its speed-up for a change of count on its type
    (a resize, told JobView.resize_s) than for a move to another type (a restart), with price_resizes; not
    told, or with price_resizes off (the default), both cost the restart."""
    from dlsub.policies.api import JobView
    from dlsub.policies.goodput_types import TypedGoodputPolicy

    told = JobView("j", arrival_s=0.0, restart_s=50.0, resize_s=10.0)
    policy = TypedGoodputPolicy(price_resizes=True)
    assert policy.keep_share(told, 1000.0, resize=True) == pytest.approx((1 - 10 / 1000) * 0.95)
    assert policy.keep_share(told, 1000.0) == pytest.approx((1 - 50 / 1000) * 0.95)
    untold = JobView("j", arrival_s=0.0, restart_s=50.0)
    assert policy.keep_share(untold, 1000.0, resize=True) == policy.keep_share(untold, 1000.0)
    blind = TypedGoodputPolicy()  # the default: every change priced as a restart
    assert blind.keep_share(told, 1000.0, resize=True) == blind.keep_share(told, 1000.0)


# -- grows and shrinks priced apart (issue 52: a shrink re-forms in process, a grow still restarts) ---------


def test_a_shrink_in_place_pays_the_shrink_penalty_and_a_grow_the_resize_penalty() -> None:
    """Unit: with shrink_penalty_s set (9.3/0.6, the measured across-nodes costs), a grow in place pays 9.3 s, a
    shrink in place 0.6 s, a move and a start after waiting the restart's 30 s; both are counted as resizes."""
    job = _job(SimConfig(resize_penalty_s=9.3, shrink_penalty_s=0.6))
    job.reallocate(Allocation(("n0", "n0")), 60.0, 30.0)
    assert job.penalty_left == 30.0
    job.reallocate(Allocation(("n0",) * 4), 120.0, 30.0)
    assert job.penalty_left == 9.3 and job.resizes == 1
    job.reallocate(Allocation(("n0",)), 180.0, 30.0)
    assert job.penalty_left == 0.6 and job.resizes == 2
    job.reallocate(Allocation(("n1",)), 240.0, 30.0)  # moved: a restart, even onto as few GPUs
    assert job.penalty_left == 30.0 and job.resizes == 2
    job.reallocate(Allocation(("n1", "n1", "n2", "n2")), 300.0, 30.0)
    job.reallocate(Allocation(("n2", "n2")), 360.0, 30.0)  # shrunk off a node: in place
    assert job.penalty_left == 0.6 and job.resizes == 4
    job.reallocate(None, 420.0, 30.0)
    job.reallocate(Allocation(("n2",)), 480.0, 30.0)
    assert job.penalty_left == 30.0


def test_shrink_penalty_defaults_to_the_resize_penalty_and_never_exceeds_the_restart() -> None:
    """Unit: shrink_penalty_s None (the default) prices a shrink as a grow, so nothing changes by default; a
    shrink never costs more than the job's restart; with resizes as restarts but shrinks priced, a grow is a
    restart and a shrink its own price."""
    assert SimConfig(resize_penalty_s=10.0).shrink_penalty_s == 0.4, "the measured shrink by default"
    for resize, shrink, grown, shrunk in ((10.0, None, 10.0, 10.0), (None, None, 30.0, 30.0), (9.3, 45.0, 9.3, 30.0),
                                          (None, 0.6, 30.0, 0.6), (0.0, 0.6, 0.0, 0.6)):
        job = _job(SimConfig(resize_penalty_s=resize, shrink_penalty_s=shrink))
        job.reallocate(Allocation(("n0",)), 60.0, 30.0)
        job.reallocate(Allocation(("n0",) * 3), 120.0, 30.0)
        assert job.penalty_left == grown, (resize, shrink)
        job.reallocate(Allocation(("n0",) * 2), 180.0, 30.0)
        assert job.penalty_left == shrunk, (resize, shrink)


def test_in_the_simulation_a_shrink_in_place_loses_only_the_shrink_penalty() -> None:
    """Unit: end to end. The same job shrinks from 4 GPUs to 2 on its node at 180 s: at 9.3/0.6 it loses 0.6 s
    of the 2-GPU run, 8.7 s less than at 9.3 s for both (the grow's price), and a first start is a restart."""
    cluster = ClusterView.uniform(2, 4)
    shrink = _Grow(("n000",) * 4, ("n000",) * 2, 180)
    apart, restarts, resizes = _jct(shrink, cluster, resize_penalty_s=9.3, shrink_penalty_s=0.6)
    alike, _, _ = _jct(shrink, cluster, resize_penalty_s=9.3, shrink_penalty_s=None)
    free, _, _ = _jct(shrink, cluster, resize_penalty_s=0.0, shrink_penalty_s=0.0)
    assert (restarts, resizes) == (1, 1)
    assert alike - apart == pytest.approx(8.7, abs=1)
    assert apart - free == pytest.approx(0.6, abs=1)


def test_resize_cost_labels_take_grow_slash_shrink() -> None:
    """Unit: the benchmarks' --resize-costs entries: restart, seconds, or GROW/SHRINK; the systems comparison
    gives dlsub the GROW/SHRINK entry where there is one, else the first cost that is not a bound."""
    from dlsub.sim.engine import dlsub_resize_cost, resize_cost_label, resize_penalties

    assert [resize_cost_label(c) for c in ("restart", None, "10.0", "9.30/0.6", "5/5")] == [
        "restart", "restart", "10", "9.3/0.6", "5"]
    assert resize_penalties("restart") == (None, None) and resize_penalties("10") == (10.0, None)
    assert resize_penalties("9.3/0.6") == (9.3, 0.6)
    for bad in ("soon", "1/2/3", "-1", "9.3/-0.6", "nan"):
        with pytest.raises(ValueError):
            resize_cost_label(bad)
    assert dlsub_resize_cost(["restart", "10", "9.3/0.6", "0"]) == "9.3/0.6"
    assert dlsub_resize_cost(["restart", "10", "0"]) == "10" and dlsub_resize_cost(["restart", "0"]) is None
