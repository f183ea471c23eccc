"""The files benchmarks/goodput_live_vs_sim.py writes for the simulator (no Slurm, real or fake: files only).

The simulated side of that benchmark is only as faithful as its traces:
the simulator must read back the throttle model's step time at one and two
job-nodes, an epoch of train_digits' 22 steps, and a job of 1..2 job-nodes
at the batch of 64 it runs live; and goodput must carry the live agent's
restart margin, not the CLI's.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

from dlsub.policies.goodput import GoodputPolicy
from dlsub.policies.sim.apps import Application
from dlsub.policies.sim.engine import SimConfig, make_jobs

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
    for emulated, one, two in ((poor, 0.42, 0.42), (good, 0.404, 0.212)):
        app = Application(traces / emulated.name)
        assert app.step_time((1,), app.batch_config(1, 64)) == pytest.approx(one)
        assert app.step_time((1, 1), app.batch_config(2, 64)) == pytest.approx(two)
        assert bench.steps_per_epoch() == 22
        assert list(app.epoch_end[:3]) == [22, 44, 66]
        assert (app.init_batch_size, app.max_batch_size, app.min_local_bsz) == (64, 64, 32)


def test_jobs_are_one_to_two_job_nodes_at_batch_64(bench: ModuleType, tmp_path: Path) -> None:
    jobs = [bench.JobSpec("j1", 0.0, bench.Emulated("poor", throttle=0.4), 15)]
    traces = bench.write_traces(tmp_path / "traces", [jobs[0].app], 15,
                                lambda app, world, batch: app.step_s(world, batch, 0.0))
    workload = bench.read_workload(bench.write_workload(tmp_path / "w.csv", jobs))
    (sim,) = make_jobs(workload, traces, GoodputPolicy(), SimConfig())
    assert (sim.lo, sim.hi, sim.batch_size, sim.epochs) == (1, 2, 64, 15)
    cluster = bench.load_cluster(bench.write_cluster(tmp_path / "cluster.toml"))
    assert [n.gpus for n in cluster.nodes] == [1, 1, 1, 1]


def test_goodput_in_the_sim_has_the_agents_restart_margin(bench: ModuleType) -> None:
    policy = bench.sim_policy("goodput", REPO / "etc" / "testbed" / "policy.toml")
    # The testbed's moves: restart_cost_s 15 + min_saving_s 5, weighed once (the CLI's goodput: 30 s x 10).
    assert isinstance(policy, GoodputPolicy)
    assert policy.restart_penalty_s * policy.restart_weight == 20
    assert bench.sim_policy("fifo", REPO / "etc" / "testbed" / "policy.toml").name == "efifo"
