"""The files benchmarks/goodput_live_vs_sim.py writes for the simulator (no Slurm, real or fake: files only).

The simulated side of that benchmark is only as faithful as its traces:
the simulator must read back the throttle model's step time on 1 to 4 GPUs,
on one node or two, an epoch of train_digits' 22 steps, and a job of 1..4
GPUs at the batch of 64 it runs live, on the testbed's 2 nodes of 4 GPUs;
and goodput must carry the live agent's restart margin, not the CLI's.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

from dlsub.policies.goodput import GoodputPolicy
from dlsub.policies.goodput_types import TypedGoodputPolicy
from dlsub.sim.apps import Application
from dlsub.sim.engine import SimConfig, make_jobs
from dlsub.site_config.policy_file import load_policy

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    for folder in (REPO / "benchmarks", REPO / "tests" / "integration"):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    return importlib.import_module("goodput_live_vs_sim")


def test_traces_give_back_the_throttle_model(bench: ModuleType, tmp_path: Path) -> None:
    poor, good = bench.Emulated("poor", throttle=0.4), bench.Emulated("good", per_sample=0.012)

    def model(app: object, world: int, batch: int) -> float:
        assert isinstance(app, bench.Emulated)
        return float(app.step_s(world, batch, 0.02))

    traces = bench.write_traces(tmp_path / "traces", [poor, good], 15, model)
    # On 3 GPUs the simulator runs 21 samples a replica (63 in all), live 22 on the first rank: 0.272 s, not 0.284.
    for emulated, times in ((poor, {1: 0.42, 2: 0.42, 4: 0.42}), (good, {1: 0.788, 2: 0.404, 3: 0.272, 4: 0.212})):
        app = Application(traces / emulated.name)
        for gpus, step in times.items():
            assert app.step_time((gpus,), app.batch_config(gpus, 64)) == pytest.approx(step)
        assert app.step_time((1, 1), app.batch_config(2, 64)) == pytest.approx(times[2]), "split over two nodes"
        assert app.step_time((3, 1), app.batch_config(4, 64)) == pytest.approx(times[4])
        assert bench.steps_per_epoch() == 22
        assert list(app.epoch_end[:3]) == [22, 44, 66]
        assert (app.init_batch_size, app.max_batch_size, app.min_local_bsz) == (64, 64, 16)


def test_jobs_are_one_to_four_gpus_at_batch_64_on_two_four_gpu_nodes(bench: ModuleType, tmp_path: Path) -> None:
    jobs = [bench.JobSpec("j1", 0.0, bench.Emulated("poor", throttle=0.4), 15)]
    traces = bench.write_traces(tmp_path / "traces", [jobs[0].app], 15,
                                lambda app, world, batch: app.step_s(world, batch, 0.0))
    workload = bench.read_workload(bench.write_workload(tmp_path / "w.csv", jobs))
    (sim,) = make_jobs(workload, traces, GoodputPolicy(), SimConfig())
    assert (sim.lo, sim.hi, sim.batch_size, sim.epochs) == (1, 4, 64, 15)
    cluster = bench.load_cluster(bench.write_cluster(tmp_path / "cluster.toml"))
    assert [n.gpus for n in cluster.nodes] == [4, 4]


#: What a resize must save on the testbed: its policy's moves.restart_cost_s + moves.min_saving_s.
_TESTBED_MOVES = load_policy(REPO / "etc" / "testbed" / "policy.toml").moves
TESTBED_MARGIN_S = _TESTBED_MOVES.restart_cost_s + _TESTBED_MOVES.min_saving_s


def test_goodput_in_the_sim_has_the_agents_restart_margin(bench: ModuleType) -> None:
    policy = bench.sim_policy("goodput", REPO / "etc" / "testbed" / "policy.toml")
    # The testbed's moves: restart_cost_s 11 + min_saving_s 1, weighed once (the CLI's goodput: 30 s x 10).
    assert isinstance(policy, GoodputPolicy)
    assert policy.restart_penalty_s * policy.restart_weight == TESTBED_MARGIN_S == 12
    assert bench.sim_policy("fifo", REPO / "etc" / "testbed" / "policy.toml").name == "efifo"


def test_two_kinds_traces_give_back_each_kinds_slowdown(bench: ModuleType, tmp_path: Path) -> None:
    """--two-kinds: an application --kind-slowdown times slower on one kind has that kind's traces that much
    slower (train_digits multiplies both throttles on it), and the other kind's as without a slowdown."""
    app = bench.Emulated("a100-fast", per_sample=0.012, slowdown=(("v100", 3.0),))
    assert app.args()[-1] == "--gpu-slowdown=v100=3"

    def model(emulated: object, world: int, batch: int) -> float:
        assert isinstance(emulated, bench.Emulated)
        return float(emulated.step_s(world, batch, 0.02))

    traces = bench.write_traces(tmp_path / "traces", [app], 12, model, ("a100", "v100"))
    assert not (traces / app.name / "placements.csv").exists(), "Sia's layout: per-kind files only"
    for kind, one, four in (("a100", 0.788, 0.212), ("v100", 0.012 * 3 * 64 + 0.02, 0.012 * 3 * 16 + 0.02)):
        on = Application(traces / app.name, gpu_type=kind)
        assert on.step_time((1,), on.batch_config(1, 64)) == pytest.approx(one)
        assert on.step_time((4,), on.batch_config(4, 64)) == pytest.approx(four)
        assert list(on.epoch_end[:2]) == [22, 44]
    cluster = bench.load_cluster(bench.write_cluster(tmp_path / "cluster.toml", ("a100", "v100")))
    assert [(n.gpus, n.gpu_type) for n in cluster.nodes] == [(4, "a100"), (4, "v100")]


def test_two_kinds_goodput_is_the_agents_typed_policy(bench: ModuleType, tmp_path: Path) -> None:
    """The simulator runs the object the agent builds with across_gpu_types (the testbed's file says fifo and
    has no [goodput] table), with the same margin; the log of kinds decides nothing."""
    policy = bench.sim_policy("goodput", REPO / "etc" / "testbed" / "policy.toml", across_kinds=True)
    assert isinstance(policy, TypedGoodputPolicy)
    assert policy.restart_penalty_s * policy.restart_weight == TESTBED_MARGIN_S
    cluster = bench.load_cluster(bench.write_cluster(tmp_path / "cluster.toml", ("a100", "v100")))
    logged = bench.KindLog(policy, cluster)
    assert logged.type_aware and logged.profiles_types and logged.name == "goodput"
