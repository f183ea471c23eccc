"""Unit tests (pure; no Slurm): the simulator's information modes. Online (the
default) tells a learning policy only what a job reported; the oracle
tells it everything; the baselines see the oracle in both."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlsub.cli.main import main
from dlsub.policies.api import Allocations, ClusterView, Decision, Jobs
from dlsub.policies.goodput import GoodputPolicy
from dlsub.policies.perf_models.fitted_model import FittedPerformance
from dlsub.policies.registry import get_policy
from dlsub.sim import performance
from dlsub.sim.engine import SimConfig, SimResult, simulate
from dlsub.sim.workload import POLLUX_DIR, read_workload

TRACES = POLLUX_DIR / "traces"
CLUSTER = ClusterView.uniform(4, 4)


@pytest.fixture
def small_workload(tmp_path: Path) -> Path:
    """The first 12 jobs of a shipped 0.5x workload: every application, minutes to simulate."""
    lines = (POLLUX_DIR / "workloads-0.5" / "workload-3.csv").read_text().splitlines()
    path = tmp_path / "small.csv"
    path.write_text("\n".join(lines[:13]) + "\n")
    return path


def run(workload: Path, policy: object, information: str = "online", **config: object) -> SimResult:
    return simulate(read_workload(workload), TRACES, policy, CLUSTER,  # type: ignore[arg-type]
                    SimConfig(information=information, **config))  # type: ignore[arg-type]


class Recording(GoodputPolicy):
    """The goodput policy, keeping every view it was shown."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Jobs] = []

    def decide(self, jobs: Jobs, cluster: ClusterView, now: float, previous: Allocations) -> Decision:
        self.seen.append(list(jobs))
        return super().decide(jobs, cluster, now, previous)


@pytest.fixture
def oracle_tripwire(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every use of the oracle's model raises."""
    def touched(*args: object, **kwargs: object) -> None:
        raise AssertionError("the oracle's performance model was read")

    performance.performance_at.cache_clear()
    for method in ("__init__", "step_time", "goodput", "best_batch", "batch_candidates"):
        monkeypatch.setattr(performance.AppPerformance, method, touched)
    yield
    performance.performance_at.cache_clear()


def test_online_mode_never_reads_the_oracle(small_workload: Path, oracle_tripwire: None) -> None:
    policy = Recording()
    result = run(small_workload, policy)
    assert result.summary()["completed"] == 12 and not result.stalled
    views = [view for jobs in policy.seen for view in jobs]
    assert views and all(view.remaining is None for view in views), "no remaining work unless declared"
    assert all(isinstance(view.model, FittedPerformance) for view in views)
    # Jobs report as they run: the models grow from the prior to fits on several sizes.
    assert max(view.model.fitted.max_replicas for view in views) >= 4  # type: ignore[union-attr]
    with pytest.raises(AssertionError, match="oracle"):
        run(small_workload, GoodputPolicy(), information="oracle")  # the tripwire works


def test_online_mode_is_deterministic(small_workload: Path) -> None:
    a = run(small_workload, GoodputPolicy(), seed=3, arrival_jitter_s=90)
    b = run(small_workload, GoodputPolicy(), seed=3, arrival_jitter_s=90)
    assert a.jobs == b.jobs and [s.__dict__ for s in a.timeline] == [s.__dict__ for s in b.timeline]


def test_oracle_mode_keeps_the_old_behaviour_and_differs_from_online(small_workload: Path) -> None:
    oracle = run(small_workload, GoodputPolicy(), information="oracle")
    assert oracle.jobs == run(small_workload, GoodputPolicy(), information="oracle").jobs
    assert oracle.jobs != run(small_workload, GoodputPolicy()).jobs


def test_baselines_see_what_their_papers_gave_them_in_both_modes(small_workload: Path) -> None:
    for name in ("optimus", "tiresias"):
        online = run(small_workload, get_policy(name))
        assert online.jobs == run(small_workload, get_policy(name), information="oracle").jobs, name


def test_a_declared_length_is_told_online(tmp_path: Path, oracle_tripwire: None) -> None:
    path = tmp_path / "declared.csv"
    path.write_text("name,time,application,num_replicas,batch_size,epochs\n"
                    "a,0,cifar10,1,128,3\nb,0,cifar10,1,128,\n")
    policy = Recording()
    result = run(path, policy)
    assert result.summary()["completed"] == 2
    first = {view.name: view for view in policy.seen[0]}
    assert first["a"].remaining is not None and first["a"].remaining > 0 and first["b"].remaining is None


def _first_fits(path: Path, **config: object) -> dict[str, object]:
    policy = Recording()
    assert run(path, policy, **config).summary()["completed"] == 4
    first = {}
    for jobs in policy.seen:
        for view in jobs:
            first.setdefault(view.name, view)
    return {name: view.model.fitted for name, view in first.items()}  # type: ignore[union-attr]


def test_online_gives_no_job_the_history_of_earlier_clones(tmp_path: Path, oracle_tripwire: None) -> None:
    path = tmp_path / "clones.csv"
    path.write_text("name,time,application,num_replicas,batch_size\n"
                    "a,0,cifar10,1,128\nb,600,cifar10,1,128\nc,600,ncf,1,32768\nd,600,cifar10,1,256\n")
    fitted = _first_fits(path)
    assert fitted["b"].max_replicas == 0, "a ran first, but nothing says a and b are one user's one command"
    assert run(path, Recording()).summary()["history"] == "none"


def test_with_history_from_columns_a_later_job_starts_from_its_commands_earlier_runs(
        tmp_path: Path, oracle_tripwire: None) -> None:
    path = tmp_path / "history.csv"
    path.write_text("name,time,application,num_replicas,batch_size,user,command\n"
                    "a,0,cifar10,1,128,ann,train.py\nb,600,cifar10,1,128,ann,train.py\n"
                    "c,600,cifar10,1,128,bob,train.py\nd,600,cifar10,1,128,,\n")
    fitted = _first_fits(path, history="columns")
    assert fitted["b"].max_replicas >= 1, "b has run nowhere yet, but ann's earlier run of train.py has"
    assert fitted["c"].max_replicas == 0, "another user's runs are not c's"
    assert fitted["d"].max_replicas == 0, "a row that names no user and command gets no history"


def test_the_one_user_assumption_keys_on_application_and_batch(tmp_path: Path, oracle_tripwire: None) -> None:
    path = tmp_path / "history.csv"
    path.write_text("name,time,application,num_replicas,batch_size\n"
                    "a,0,cifar10,1,128\nb,600,cifar10,1,128\nc,600,ncf,1,32768\nd,600,cifar10,1,256\n")
    fitted = _first_fits(path, history="one-user")
    assert fitted["b"].max_replicas >= 1, "b has run nowhere yet, but a has"
    assert fitted["c"].max_replicas == 0, "another application's reports are not c's"
    assert fitted["d"].max_replicas == 0, "nor another batch size's: the agent sees another command"


def test_history_from_columns_needs_the_columns(small_workload: Path) -> None:
    from dlsub.sim.workload import WorkloadError

    with pytest.raises(WorkloadError, match="user and command columns"):
        run(small_workload, GoodputPolicy(), history="columns")
    with pytest.raises(ValueError, match="valid: none, columns, one-user"):
        run(small_workload, GoodputPolicy(), history="gossip")


def test_unknown_information_mode_is_an_error(small_workload: Path) -> None:
    with pytest.raises(ValueError, match="valid: online, oracle"):
        run(small_workload, GoodputPolicy(), information="psychic")


def test_cli_information_option(small_workload: Path) -> None:
    runner = CliRunner()
    outputs = {}
    for mode in ("online", "oracle"):
        result = runner.invoke(main, ["simulate", str(small_workload), "--traces", str(TRACES), "--json",
                                      "--information", mode, "--cluster", str(_cluster_file(small_workload))])
        assert result.exit_code == 0, result.output
        outputs[mode] = json.loads(result.stdout[result.stdout.index("{"):])
        assert outputs[mode]["completed"] == 12 and outputs[mode]["information"] == mode
    default = runner.invoke(main, ["simulate", str(small_workload), "--traces", str(TRACES), "--json",
                                   "--cluster", str(_cluster_file(small_workload))])
    summary = json.loads(default.stdout[default.stdout.index("{"):])
    assert {**summary, "wall_s": 0} == {**outputs["online"], "wall_s": 0}
    bad = runner.invoke(main, ["simulate", str(small_workload), "--information", "psychic"])
    assert bad.exit_code == 2 and "online" in bad.output


def _cluster_file(beside: Path) -> Path:
    path = beside.parent / "cluster.toml"
    path.write_text("nodes = 4\ngpus_per_node = 4\n")
    return path
