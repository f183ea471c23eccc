"""Unit tests (stateful fake Slurm, fake clock): the agent's tick end to end, and a crash mid-move."""

from __future__ import annotations

import json
import os
from pathlib import Path

from dlsub.agent.agent_store import AgentStore
from dlsub.agent.policy_file import parse_policy
from dlsub.agent.reconcile import Agent
from dlsub.slurm_plugins.client import SlurmClient
from dlsub.slurm_plugins.fake import FakeSlurm

NOW = 1_800_000_000.0
POLICY = parse_policy({
    "policy": "fifo", "checkpoint_grace_s": 30,
    "partitions": {"gpu": {"role": "gpu", "speed": 1.0}, "gpu-dev": {"role": "dev"},
                   "cpu": {"role": "cpu", "speed": 0.1}},
    "moves": {"restart_cost_s": 15, "min_saving_s": 5},
})


def submit_immediate(fake: FakeSlurm, tmp_path: Path) -> tuple[int, Path]:
    job_dir = tmp_path / "home" / "0123abcd"
    job_dir.mkdir(parents=True)
    script = job_dir / "job.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --partition=cpu\n"
                      f"#SBATCH --output={job_dir}/slurm-%j.out\n"
                      "#SBATCH --comment=dlsub:0123abcd;mode=immediate;ideal=gpu;gpus=1\n")
    job_id = SlurmClient(runner=fake).submit(script)
    fake.jobs[job_id].user_id = os.getuid()
    fake.start(job_id, "cpu1", int(NOW - 100))
    events = [
        {"event": "progress", "time": NOW - 20, "step": 10, "total_steps": 1000, "attempt": f"{job_id}-0"},
        {"event": "progress", "time": NOW - 10, "step": 20, "total_steps": 1000, "attempt": f"{job_id}-0"},
        {"event": "checkpoint", "time": NOW - 12, "step": 18, "attempt": f"{job_id}-0"},
    ]
    (job_dir / "progress.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return job_id, job_dir


def test_a_move_runs_through_and_survives_an_agent_restart(fake_slurm: FakeSlurm, tmp_path: Path) -> None:
    job_id, _ = submit_immediate(fake_slurm, tmp_path)
    db = tmp_path / "agent.db"
    client = SlurmClient(runner=fake_slurm)
    actions = Agent(client, AgentStore(db), POLICY).tick(NOW)
    assert [a.kind for a in actions] == ["signal-move"]
    assert fake_slurm.jobs[job_id].signals == ["USR2"]
    assert AgentStore(db).move("0123abcd")["phase"] == "signalled"
    # The agent "crashes"; a new one starts from the same state while the job checkpoints and requeues held.
    fake_slurm.requeue_held(job_id)
    again = Agent(client, AgentStore(db), POLICY)
    assert [a.kind for a in again.tick(NOW + 5)] == ["retarget", "release"]
    job = fake_slurm.jobs[job_id]
    assert job.options["partition"] == "gpu" and job.options["gres"] == "gpu:1" and job.reason == "None"
    fake_slurm.start(job_id, "gpu1", int(NOW + 8))
    assert [a.kind for a in again.tick(NOW + 10)] == ["finish-move"]
    store = AgentStore(db)
    assert store.moves() == [] and len(fake_slurm.jobs) == 1 and job.restart_cnt == 1
    assert [d.kind for d in store.decisions("0123abcd")] == ["move", "move-done"]
    assert "est. " in store.decisions("0123abcd")[0].reason
    assert again.tick(NOW + 20) == [], "nothing more to do"


def test_a_crash_between_intent_and_signal_resends_it(fake_slurm: FakeSlurm, tmp_path: Path) -> None:
    job_id, _ = submit_immediate(fake_slurm, tmp_path)
    db = tmp_path / "agent.db"
    store = AgentStore(db)
    store.start_move({"dlsub_id": "0123abcd", "slurm_job_id": job_id, "kind": "move", "phase": "planned",
                      "target_partition": "gpu", "target_gpus": 1, "since": NOW - 1, "signals": 0, "created": NOW})
    actions = Agent(SlurmClient(runner=fake_slurm), store, POLICY).tick(NOW)
    assert [a.kind for a in actions] == ["signal-move"] and fake_slurm.jobs[job_id].signals == ["USR2"]
    assert [d.kind for d in store.decisions("0123abcd")] == [], "the decision was recorded with the intent"


def test_slurm_down_marks_the_tick_stale_and_changes_nothing(fake_slurm: FakeSlurm, tmp_path: Path) -> None:
    submit_immediate(fake_slurm, tmp_path)
    fake_slurm.reachable = False
    store = AgentStore(tmp_path / "agent.db")
    assert Agent(SlurmClient(runner=fake_slurm), store, POLICY).tick(NOW) == []
    assert "waiting for Slurm" in store.meta()["doing"] and store.moves() == []
