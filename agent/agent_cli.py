"""``dlsub agent run|status|tick``, ``dlsub why``, ``dlsub backfill --once``, ``dlsub config check``."""

from __future__ import annotations

import datetime as dt
import fcntl
import getpass
import json
import logging
import os
import signal
import sys
import time
from contextlib import contextmanager
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import click

from dlsub.agent.agent_store import AgentStore, default_db_path
from dlsub.agent.policy_file import PolicyFileError, cron_trigger, load_policy


def _fail(message: str, code: int = 2) -> None:
    click.echo(f"dlsub: error: {message}", err=True)
    sys.exit(code)


@contextmanager
def agent_lock(db: Path) -> Iterator[IO[str] | None]:
    """One agent per state database: yields the held lock, or None when another agent holds it."""
    db.parent.mkdir(parents=True, exist_ok=True)
    fh = open(str(db) + ".lock", "a+")
    try:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield None
            return
        yield fh
    finally:
        fh.close()


def _make_agent(db: Path, policy_path: Path | None):  # type: ignore[no-untyped-def]
    from dlsub.agent.reconcile import Agent
    from dlsub.slurm_plugins.client import SlurmClient

    try:
        policy = load_policy(policy_path)
    except PolicyFileError as exc:
        _fail(str(exc))
    return Agent(SlurmClient(), AgentStore(db), policy)


db_option = click.option("--db", type=click.Path(path_type=Path, dir_okay=False), default=None,
                         help="The agent's state database [default: $DLSUB_AGENT_DB or /var/lib/dlsub/agent.db].")
policy_option = click.option("--policy", "policy_path", type=click.Path(path_type=Path, dir_okay=False),
                             default=None, help="Policy file [default: $DLSUB_POLICY or /etc/dlsub/policy.toml].")


@click.group()
def agent() -> None:
    """The agent: a reconcile loop that moves, continues and backfills dlsub jobs."""


@agent.command()
@db_option
@policy_option
@click.option("--pidfile", type=click.Path(path_type=Path, dir_okay=False), default=None)
def run(db: Path | None, policy_path: Path | None, pidfile: Path | None) -> None:
    """Run the agent until SIGTERM: a tick every tick_interval_s and at each window's edges."""
    from apscheduler.executors.pool import ThreadPoolExecutor
    from apscheduler.schedulers.blocking import BlockingScheduler
    from apscheduler.triggers.interval import IntervalTrigger

    db = db or default_db_path()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s dlsub-agent: %(message)s")
    logging.getLogger("apscheduler").setLevel(logging.WARNING)  # it logs every tick
    with agent_lock(db) as lock:
        if lock is None:
            _fail(f"another agent is running on {db} (its lock is held); stop it first", 1)
        agent_obj = _make_agent(db, policy_path)
        policy = agent_obj.policy
        if pidfile:
            pidfile.write_text(f"{os.getpid()}\n")
        agent_obj.store.set_meta(pid=os.getpid(), started=time.time(), host=os.uname().nodename,
                                 policy=policy.policy, tick_interval_s=policy.tick_interval_s, stopped=None)
        # One worker: ticks never overlap, whichever trigger fired them.
        scheduler = BlockingScheduler(executors={"default": ThreadPoolExecutor(1)})
        job_defaults = {"max_instances": 1, "coalesce": True, "misfire_grace_time": None}
        scheduler.add_job(agent_obj.tick, IntervalTrigger(seconds=policy.tick_interval_s),
                          next_run_time=dt.datetime.now().astimezone(), id="interval", **job_defaults)
        for window in policy.backfill.windows:
            zone = dt.datetime.now().astimezone().tzinfo
            for edge in ("start", "end"):
                scheduler.add_job(agent_obj.tick, cron_trigger(getattr(window, edge), zone),
                                  id=f"{window.name}-{edge}", **job_defaults)

        def stop(signum: int, frame: object) -> None:
            logging.info("stopping on signal %d", signum)
            scheduler.shutdown(wait=False)

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        logging.info("started: policy %s, tick every %.0f s, state in %s", policy.policy, policy.tick_interval_s, db)
        try:
            scheduler.start()
        finally:
            agent_obj.store.set_meta(stopped=time.time(), doing="stopped")
            if pidfile:
                pidfile.unlink(missing_ok=True)


@agent.command()
@db_option
@policy_option
@click.option("--now", "now", type=float, default=None, help="Pretend it is this time (epoch seconds); for tests.")
@click.option("--json", "as_json", is_flag=True)
def tick(db: Path | None, policy_path: Path | None, now: float | None, as_json: bool) -> None:
    """Run one tick and print what it did (for debugging and tests; the daemon must not be running)."""
    db = db or default_db_path()
    with agent_lock(db) as lock:
        if lock is None:
            _fail(f"the agent is running on {db}; one tick at a time: stop it, or read `dlsub agent status`", 1)
        actions = _make_agent(db, policy_path).tick(now)
    if as_json:
        click.echo(json.dumps([{"kind": a.kind, "job": a.dlsub_id, "slurm_job_id": a.slurm_job_id,
                                "reason": a.reason, "partition": a.partition} for a in actions]))
    else:
        for a in actions:
            click.echo(f"{a.kind:>16} {a.dlsub_id} (Slurm {a.slurm_job_id}): {a.reason}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True  # someone else's process (the service account's)
    except OSError:
        return False
    return True


@agent.command()
@db_option
@click.option("--json", "as_json", is_flag=True)
def status(db: Path | None, as_json: bool) -> None:
    """Whether the agent runs, its last tick, and what it is doing."""
    db = db or default_db_path()
    try:
        store = AgentStore(db, readonly=True)
        meta = store.meta()
        moves = store.moves()
    except Exception as exc:  # noqa: BLE001 - missing or unreadable state: nothing says an agent runs
        if as_json:
            click.echo(json.dumps({"running": False, "error": str(exc)}))
        else:
            click.echo(f"dlsub agent: not running (no readable state at {db}: {exc})")
        sys.exit(3)
    pid = meta.get("pid")
    running = bool(pid) and not meta.get("stopped") and _alive(int(pid))
    last = meta.get("last_tick")
    info = {
        "running": running, "pid": pid, "host": meta.get("host"), "policy": meta.get("policy"),
        "last_tick": last, "last_tick_age_s": round(time.time() - last, 1) if last else None,
        "doing": meta.get("doing"), "moves_in_flight": moves, "last_error": meta.get("last_error"),
    }
    if as_json:
        click.echo(json.dumps(info))
    else:
        state = f"running (pid {pid} on {info['host']})" if running else "not running"
        click.echo(f"dlsub agent: {state}; policy {info['policy']}")
        if last:
            click.echo(f"last tick: {dt.datetime.fromtimestamp(last):%Y-%m-%d %H:%M:%S} "
                       f"({info['last_tick_age_s']:.0f} s ago)")
        click.echo(f"doing: {info['doing']}")
        if info["last_error"]:
            click.echo(f"last error: {info['last_error']}")
    if not running:
        sys.exit(3)


@click.command()
@click.argument("job")
@db_option
@click.option("--json", "as_json", is_flag=True)
def why(job: str, db: Path | None, as_json: bool) -> None:
    """What the agent decided about JOB (a dlsub id, its prefix, or a Slurm job id), and why."""
    from dlsub.agent.config import load_settings
    from dlsub.agent.user_store import JobStore, UnknownJob

    db = db or default_db_path()
    me = getpass.getuser()
    dlsub_id, slurm_id = None, None
    try:
        dlsub_id = JobStore(load_settings().db_path).get(job).id
    except (UnknownJob, OSError):
        if job.isdigit():
            slurm_id = int(job)
        else:
            dlsub_id = job
    try:
        store = AgentStore(db, readonly=True)
    except FileNotFoundError:
        _fail(f"no agent state at {db}: the agent has not run here (see `dlsub agent status`)")
    decisions = store.decisions(dlsub_id=dlsub_id, slurm_job_id=slurm_id)
    # A user sees the agent's decisions about their own jobs (root: everyone's).
    decisions = [d for d in decisions if os.geteuid() == 0 or d.user == me]
    if as_json:
        click.echo(json.dumps([d.__dict__ for d in decisions]))
        return
    if not decisions:
        click.echo(f"dlsub: the agent has decided nothing about job {job} yet")
        return
    for d in decisions:
        when = dt.datetime.fromtimestamp(d.time)
        click.echo(f"{when:%Y-%m-%d %H:%M:%S}  {d.kind:<14} {d.reason}")


@click.command()
@click.option("--once", is_flag=True, required=True, help="One pass, for system cron (etc/cron.d/dlsub-backfill).")
@db_option
@policy_option
def backfill(once: bool, db: Path | None, policy_path: Path | None) -> None:
    """One backfill pass (a full agent tick), unless the agent is running and does it itself."""
    db = db or default_db_path()
    with agent_lock(db) as lock:
        if lock is None:
            click.echo("dlsub: the agent is running and backfills on its own; nothing to do")
            return
        actions = _make_agent(db, policy_path).tick()
    for a in actions:
        click.echo(f"{a.kind:>16} {a.dlsub_id} (Slurm {a.slurm_job_id}): {a.reason}")


@click.group()
def config() -> None:
    """The admin's policy file."""


@config.command()
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False))
def check(file: Path) -> None:
    """Validate a policy.toml: unknown keys, types, cron expressions, policy name."""
    try:
        policy = load_policy(file)
    except PolicyFileError as exc:
        _fail(str(exc))
    click.echo(f"{file}: ok: policy {policy.policy}, default mode {policy.default_mode}, "
               f"tick every {policy.tick_interval_s:g} s, {len(policy.partitions)} partition(s) "
               f"({', '.join(f'{n}={p.role}' for n, p in policy.partitions.items()) or 'none'}), "
               f"{len(policy.backfill.windows)} backfill window(s)")
