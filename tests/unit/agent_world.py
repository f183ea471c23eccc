"""A small world for agent unit tests: the stateful fake Slurm, job directories in tmp_path, a fake clock.

Helpers only (no tests here): submit dlsub or plain jobs as a given uid,
write their progress and attempt records, and play the batch script's part
(requeue held after SIGUSR2, requeue after exit 85).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from dlsub.agent.agent_store import AgentStore
from dlsub.agent.reconcile import Agent
from dlsub.contract import ACTION_MOVE, ACTION_REQUEUE
from dlsub.site_config.policy_file import AgentPolicy, parse_policy
from dlsub.slurm_plugins.client import SlurmClient
from dlsub.slurm_plugins.fake import FakeSlurm, testbed_cluster

NOW = 1_800_000_000.0
ME = os.getuid()
OTHER = ME + 4242  # a second, unprivileged user


def policy(**overrides: Any) -> AgentPolicy:
    base: dict[str, Any] = {
        "policy": "fifo", "checkpoint_grace_s": 30,
        "partitions": {"gpu": {"role": "gpu", "speed": 1.0}, "gpu-dev": {"role": "dev"},
                       "cpu": {"role": "cpu", "speed": 0.1}},
        "moves": {"restart_cost_s": 15, "min_saving_s": 5},
    }
    base.update(overrides)
    return parse_policy(base)


class Crash(BaseException):
    """kill -9 of the agent: nothing after this point of the tick happens."""


class World:
    def __init__(self, tmp_path: Path, pol: AgentPolicy | None = None, fake: FakeSlurm | None = None) -> None:
        self.tmp = tmp_path
        self.fake = fake or testbed_cluster()
        self.client = SlurmClient(runner=self.fake)
        self.db = tmp_path / "agent.db"
        self.policy = pol or policy()
        self.store: AgentStore | None = None

    def crash_once_at(self, prefix: tuple[str, ...], when: str, point: str) -> None:
        """The agent dies (:class:`Crash`) the first time it runs a Slurm command starting with ``prefix``:
        ``before`` Slurm carries it out, or ``after``."""
        real = self.fake.__call__
        armed = [True]

        def runner(argv: Any) -> Any:
            hit = armed[0] and tuple(argv[:len(prefix)]) == prefix
            if hit and when == "before":
                armed[0] = False
                raise Crash(point)
            result = real(argv)
            if hit:
                armed[0] = False
                raise Crash(point)
            return result

        self.client._runner = runner

    def move_to_gpu_through_crashes(self, job_id: int, job_dir: Path, t: float) -> int:
        """Tick (5 s apart, at most 12 times) until the job runs on gpu with no move open, playing Slurm's and
        the batch script's parts, and starting the agent again on the same database whenever it dies
        (:class:`Crash`). Returns how many times it died."""
        crashes = 0
        agent = self.agent()
        for _ in range(12):
            try:
                agent.tick(t)
            except Crash:
                crashes += 1
                agent = self.agent()
            job = self.fake.jobs[job_id]
            if job.state == "RUNNING" and job.signals and job.restart_cnt == 0:
                self.batch_script_moves(job_dir, job_id)  # a move's checkpoint and requeuehold, once
            elif job.state == "PENDING" and job.reason == "None" and job.options["partition"] == "gpu":
                self.fake.start(job_id, "gpu1", int(t))
            t += 5
            assert self.store is not None
            if job.state == "RUNNING" and job.options["partition"] == "gpu" and not self.store.moves():
                break
        return crashes

    def agent(self, **kw: Any) -> Agent:
        """A new agent on the same database (as after a restart)."""
        self.store = AgentStore(self.db)
        return Agent(self.client, self.store, self.policy, **kw)

    def submit(self, dlsub_id: str, *, uid: int = ME, user: str = "alice", comment: str | None = None,
               partition: str = "cpu", gres: str = "", time: str = "", lua: bool = True,
               job_dir: Path | None = None, start_on: str | None = "cpu1",
               start: float = NOW - 600) -> tuple[int, Path]:
        job_dir = job_dir or self.tmp / f"home-{uid}" / dlsub_id
        job_dir.mkdir(parents=True, exist_ok=True)
        comment = comment if comment is not None else f"dlsub:{dlsub_id};mode=immediate;ideal=gpu;gpus=1"
        lines = ["#!/bin/bash", f"#SBATCH --partition={partition}", f"#SBATCH --output={job_dir}/slurm-%j.out"]
        if comment:
            lines.append(f"#SBATCH --comment={comment}")
        if gres:
            lines.append(f"#SBATCH --gres={gres}")
        if time:
            lines.append(f"#SBATCH --time={time}")
        script = job_dir / f"job-{len(self.fake.jobs)}.sbatch"
        script.write_text("\n".join(lines) + "\n")
        self.fake.submit_uid, self.fake.submit_user, self.fake.job_submit_lua = uid, user, lua
        job_id = self.client.submit(script)
        if start_on:
            self.fake.start(job_id, start_on, int(start))
        return job_id, job_dir

    def worker_array(self, dlsub_id: str, tags: str, *, uid: int = ME, user: str = "alice",
                     tasks: int = 1, gpus_per_node: int = 4) -> tuple[int, Path]:
        """An elastic job's held worker array of one-node tasks on gpu, as dlsub submits it first."""
        job_dir = self.tmp / f"home-{uid}" / dlsub_id
        job_dir.mkdir(parents=True, exist_ok=True)
        script = job_dir / "worker.sbatch"
        script.write_text("\n".join([
            "#!/bin/bash", "#SBATCH --partition=gpu", f"#SBATCH --output={job_dir}/slurm-%j.out",
            f"#SBATCH --comment={tags.replace(';nodes', ';role=worker;nodes')}", f"#SBATCH --gres=gpu:{gpus_per_node}",
            f"#SBATCH --array=0-{tasks - 1}", "#SBATCH --hold"]) + "\n")
        self.fake.submit_uid, self.fake.submit_user = uid, user
        return self.client.submit(script), job_dir

    def elastic(self, dlsub_id: str, tags: str, *, uid: int = ME, user: str = "alice",
                workers: int = 1) -> tuple[int, int, Path]:
        """An elastic job as dlsub submits it: its worker array (held), then the main job, running on gpu1.
        Returns (main job, worker array, job directory)."""
        array, job_dir = self.worker_array(dlsub_id, tags, uid=uid, user=user, tasks=workers)
        main, _ = self.submit(dlsub_id, uid=uid, user=user, comment=tags, partition="gpu", gres="gpu:4",
                              start_on="gpu1", job_dir=job_dir)
        return main, array, job_dir

    def progress(self, job_dir: Path, job_id: int, *, total: int | None = 1000, checkpoint_step: int | None = 18,
                 ran: float = 600.0, checkpoint: bool = True, saves: str | None = None) -> None:
        """Its training's start (declaring ``saves``, as the framework adapters do), two reports and,
        with ``checkpoint``, a checkpoint."""
        attempt = f"{job_id}-0"
        start: dict[str, Any] = {"event": "start", "time": NOW - ran, "attempt": attempt}
        if saves is not None:
            start["saves"] = saves
        events: list[dict[str, Any]] = [start]
        for t, step in ((NOW - 20, 10), (NOW - 10, 20)):
            e: dict[str, Any] = {"event": "progress", "time": t, "step": step, "attempt": attempt}
            if total:
                e["total_steps"] = total
            events.append(e)
        if checkpoint:
            events.append({"event": "checkpoint", "time": NOW - 12, "step": checkpoint_step, "seq": 1,
                           "attempt": attempt})
        with open(job_dir / "progress.jsonl", "a") as f:
            f.write("".join(json.dumps(e) + "\n" for e in events))

    def end_attempt(self, job_dir: Path, job_id: int, action: str) -> None:
        restart = self.fake.jobs[job_id].restart_cnt
        with open(job_dir / "attempts.jsonl", "a") as f:
            f.write(json.dumps({"event": "end", "time": NOW, "slurm_job_id": job_id, "restart": restart,
                                "rc": 85, "action": action}) + "\n")

    def batch_script_moves(self, job_dir: Path, job_id: int) -> None:
        """The batch script after SIGUSR2: checkpoint, log the end for a move, ``scontrol requeuehold``."""
        self.end_attempt(job_dir, job_id, ACTION_MOVE)
        self.fake.requeue_held(job_id)

    def batch_script_requeues(self, job_dir: Path, job_id: int) -> None:
        """The batch script after exit 85: log the end for a resume, ``scontrol requeue``."""
        self.end_attempt(job_dir, job_id, ACTION_REQUEUE)
        self.fake.requeue_self(job_id)

    def busy_gpus(self) -> None:
        for node in ("gpu1", "gpu2"):
            self.fake.nodes[node].gpus_used = 4

    def free_gpus(self) -> None:
        for node in ("gpu1", "gpu2"):
            self.fake.nodes[node].gpus_used = 0

    def snapshot(self, job_id: int) -> tuple[Any, ...]:
        """What a victim's job must keep: partition, gres, hold, restart count, time limit, state, signals."""
        j = self.fake.jobs[job_id]
        return (j.options.get("partition"), j.options.get("gres", ""), j.reason, j.restart_cnt,
                j.options.get("time", ""), j.state, tuple(j.signals))

    def mutating_calls(self, job_id: int) -> list[list[str]]:
        return [c for c in self.fake.calls if c[0] in ("scancel", "scontrol") and c[1:2] != ["show"]
                and c[1:2] != ["ping"] and any(str(job_id) == a or a == f"jobid={job_id}" for a in c)]
