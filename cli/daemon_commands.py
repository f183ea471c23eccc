"""The agent's own commands, run as its service account: ``dlsub agent run``, ``dlsub agent tick``,
``dlsub backfill --once``.

The agent's state is private to that account: every command here sets
umask 077 before it opens anything, and the state files (database, its
``-wal``/``-shm`` or ``-journal`` and the lock) are made 0600 whatever made them before.
Users reach the running agent through its query socket (:mod:`dlsub.agent.query`).

A pair of agents (policy ``[failover] shared_state``): each login host runs ``dlsub agent run`` on the one
shared database; the lease in it says which acts (:mod:`dlsub.agent.leadership`). The lock that keeps a
cron pass from ticking beside this host's agent is then this host's own, beside its socket (two hosts' agents
must run at once); a cron pass or ``agent tick`` ticks only when it can take the lease, and gives it back.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import logging
import os
import signal
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING

import click

from dlsub.agent.agent_store import AgentStore, default_db_path
from dlsub.agent.lease import Deposed, Holder, LeaseTerms
from dlsub.agent.query import QueryServer
from dlsub.cli.errors import fail
from dlsub.job.agent_client import AgentEndpoint, AgentUnavailable, ask
from dlsub.site_config.policy_file import AgentPolicy, PolicyFileError, cron_trigger, load_policy

if TYPE_CHECKING:
    from dlsub.agent.leadership import Leadership
    from dlsub.agent.reconcile import Agent
    from dlsub.policies.actions.move_views import Action

STATE_SUFFIXES = ("", "-wal", "-shm", "-journal", ".lock")


def private_umask() -> None:
    """Nothing the agent creates is readable by others (the socket is opened up on purpose)."""
    os.umask(0o077)


def make_private(db: Path) -> None:
    """The state files 0600: a user who can open them can hold SQLite's locks or ours and stall the agent."""
    for suffix in STATE_SUFFIXES:
        path = Path(str(db) + suffix)
        try:
            info = path.lstat()
        except FileNotFoundError:
            continue
        if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() and info.st_mode & 0o077:
            os.chmod(path, 0o600)
    parent = db.parent.stat()
    if parent.st_mode & 0o077:
        logging.getLogger("dlsub.agent").warning(
            "%s is open to other users (mode %o); make it 0700 and owned by the agent's account",
            db.parent, stat.S_IMODE(parent.st_mode))


def lock_path(db: Path, policy: AgentPolicy | None = None) -> Path:
    """Where the lock of one agent per host is: beside one host's database, or, when two hosts share it, beside
    this host's socket (a lock on the shared file system would let one host's agent keep the other's out)."""
    if policy is not None and policy.failover.shared_state:
        return Path(policy.socket).parent / "agent.lock"
    return Path(str(db) + ".lock")


@contextmanager
def agent_lock(db: Path, lock: Path | None = None) -> Iterator[IO[str] | None]:
    """One agent per state database (per host, with ``lock`` where two hosts share it): yields the held lock,
    or None when another agent holds it."""
    lock = lock or lock_path(db)
    db.parent.mkdir(parents=True, exist_ok=True)
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(str(lock), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    fh = os.fdopen(fd, "a+")
    try:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield None
            return
        yield fh
    finally:
        fh.close()


def _policy(policy_path: Path | None) -> AgentPolicy:
    try:
        return load_policy(policy_path)
    except PolicyFileError as exc:
        fail(str(exc))


def open_store(db: Path, policy: AgentPolicy) -> AgentStore:
    """The agent's database, with the lease terms of a pair where the policy shares it."""
    terms = LeaseTerms(policy.failover.lease_s) if policy.failover.shared_state else None
    return AgentStore(db, terms=terms)


def _make_agent(db: Path, policy: AgentPolicy) -> Agent:
    from dlsub.agent.reconcile import Agent
    from dlsub.slurm_plugins.client import SlurmClient

    client = SlurmClient()
    if policy.metrics.port:
        from dlsub.agent.metrics import RecordingSlurmClient

        client = RecordingSlurmClient()  # the metrics read the partitions the tick's sinfo returned
    agent_obj = Agent(client, open_store(db, policy), policy)
    make_private(db)
    return agent_obj


def _one_tick(agent_obj: Agent, now: float | None = None) -> list[Action] | None:
    """One tick of ``agent tick`` or a cron pass; on a shared database only while no agent holds the lease
    (None: one does), which the pass takes for its tick and gives back."""
    store = agent_obj.store
    if store.terms is None:
        return agent_obj.tick(now)
    taken = store.take_lease(Holder.this_process(), time.time() if now is None else now)
    if taken is None:
        return None
    try:
        return agent_obj.tick(now)
    finally:
        store.release_lease(time.time())


db_option = click.option("--db", type=click.Path(path_type=Path, dir_okay=False), default=None,
                         help="The agent's state database [default: $DLSUB_AGENT_DB or /var/lib/dlsub/agent.db].")
policy_option = click.option("--policy", "policy_path", type=click.Path(path_type=Path, dir_okay=False),
                             default=None, help="Policy file [default: $DLSUB_POLICY or /etc/dlsub/policy.toml].")


def _with_metrics(agent_obj: Agent | Leadership, policy: AgentPolicy) -> Callable[[], object]:
    """The tick to schedule: with Prometheus metrics on the policy's address and port when it names a port."""
    port, address = policy.metrics.port, policy.metrics.address
    if not port:
        return agent_obj.tick
    from dlsub.agent.metrics import AgentMetrics

    metrics = AgentMetrics(per_user_labels=policy.metrics.per_user_labels)
    where = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
    try:
        metrics.serve(port, address)
    except OSError as exc:
        fail(f"cannot serve metrics on {where}: {exc} (policy.toml [metrics] address and port)", 1)
    logging.info("metrics on http://%s/metrics", where)
    return metrics.instrumented(agent_obj)


@click.command()
@db_option
@policy_option
@click.option("--pidfile", type=click.Path(path_type=Path, dir_okay=False), default=None)
@click.option("--socket", "socket_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Where to answer users' queries [default: the policy's `socket`].")
def run(db: Path | None, policy_path: Path | None, pidfile: Path | None, socket_path: Path | None) -> None:
    """Run the agent until SIGTERM: a tick every tick_interval_s and at each window's edges."""
    from apscheduler.executors.pool import ThreadPoolExecutor
    from apscheduler.schedulers.blocking import BlockingScheduler
    from apscheduler.triggers.interval import IntervalTrigger

    private_umask()
    db = db or default_db_path()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s dlsub-agent: %(message)s")
    logging.getLogger("apscheduler").setLevel(logging.WARNING)  # it logs every tick
    policy = _policy(policy_path)
    with agent_lock(db, lock_path(db, policy)) as lock:
        if lock is None:
            fail(f"another agent is running on {db} on this host (its lock is held); stop it first", 1)
        agent_obj = _make_agent(db, policy)
        if pidfile:
            pidfile.write_text(f"{os.getpid()}\n")

        def record_start() -> None:  # what `dlsub agent status` says of the agent that acts
            agent_obj.store.set_meta(pid=os.getpid(), started=time.time(), host=os.uname().nodename,
                                     policy=policy.policy, tick_interval_s=policy.tick_interval_s,
                                     tick_deadline_s=policy.tick_deadline_s, stopped=None)

        pair: Leadership | None = None
        if policy.failover.shared_state:
            from dlsub.agent.leadership import Leadership
            from dlsub.agent.reconcile import Agent

            store, client = agent_obj.store, agent_obj.client
            pair = Leadership(store, client, lambda: Agent(client, store, policy), Holder.this_process(),
                              on_active=record_start)
        else:
            record_start()
        make_private(db)
        tick_fn = _with_metrics(pair or agent_obj, policy)
        # Users' questions, answered from threads of their own with their own read-only connection (a standby
        # answers them too, from the shared database).
        server = QueryServer(socket_path or Path(policy.socket), lambda: AgentStore(db, readonly=True), policy,
                             address=_listen_address(policy),
                             role=(lambda: pair.role.value) if pair is not None else (lambda: "active"))
        try:
            server.start()
        except OSError as exc:
            fail(f"cannot answer queries on {server.path}: {exc}", 1)
        # One worker: ticks never overlap, whichever trigger fired them.
        scheduler = BlockingScheduler(executors={"default": ThreadPoolExecutor(1)})
        job_defaults = {"max_instances": 1, "coalesce": True, "misfire_grace_time": None}
        scheduler.add_job(tick_fn, IntervalTrigger(seconds=policy.tick_interval_s),
                          next_run_time=dt.datetime.now().astimezone(), id="interval", **job_defaults)
        for window in policy.backfill.windows:
            zone = dt.datetime.now().astimezone().tzinfo
            for edge in ("start", "end"):
                scheduler.add_job(tick_fn, cron_trigger(getattr(window, edge), zone),
                                  id=f"{window.name}-{edge}", **job_defaults)

        def stop(signum: int, frame: object) -> None:
            logging.info("stopping on signal %d", signum)
            scheduler.shutdown(wait=False)

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        logging.info("started: policy %s, tick every %.0f s, state in %s, queries on %s%s%s",
                     policy.policy, policy.tick_interval_s, db, server.path,
                     f" and {server.tcp_address} (TCP, munge)" if server.tcp_address else "",
                     f"; one of a pair: lease {policy.failover.lease_s:g} s, standing by until it holds it"
                     if pair is not None else "")
        try:
            scheduler.start()
        finally:
            server.stop()
            if agent_obj.store.holds_lease() and (pair is None or pair.agent is not None):
                try:
                    agent_obj.store.set_meta(stopped=time.time(), doing="stopped")
                except Deposed:
                    pass  # the other agent acts now: what it records stands
            if pair is not None:
                pair.stop()  # the standby takes over at its next turn, not when the lease would run out
            if pidfile:
                pidfile.unlink(missing_ok=True)


def _listen_address(policy: AgentPolicy) -> str:
    """Where to listen on TCP: the policy's ``agent_address``; of a pair, only on the host it names (the other
    host's agent answers on its Unix socket)."""
    if policy.failover.shared_state and policy.agent_address and AgentEndpoint.of(policy).elsewhere():
        logging.info("agent_address %s names another host: queries on the Unix socket only here",
                     policy.agent_address)
        return ""
    return policy.agent_address


@click.command()
@db_option
@policy_option
@click.option("--now", "now", type=float, default=None, help="Pretend it is this time (epoch seconds); for tests.")
@click.option("--json", "as_json", is_flag=True)
def tick(db: Path | None, policy_path: Path | None, now: float | None, as_json: bool) -> None:
    """Run one tick and print what it did (for debugging and tests; the daemon must not be running)."""
    private_umask()
    db = db or default_db_path()
    policy = _policy(policy_path)
    with agent_lock(db, lock_path(db, policy)) as lock:
        if lock is None:
            fail(f"the agent is running on {db}; one tick at a time: stop it, or read `dlsub agent status`", 1)
        agent_obj = _make_agent(db, policy)
        ticked = _one_tick(agent_obj, now)
        make_private(db)
    if ticked is None:
        fail(f"an agent holds the lease on {db} ({_holder(agent_obj.store)}); one tick at a time", 1)
    actions = ticked
    if as_json:
        click.echo(json.dumps([{"kind": a.kind, "job": a.dlsub_id, "slurm_job_id": a.slurm_job_id,
                                "reason": a.reason, "partition": a.partition} for a in actions]))
    else:
        for a in actions:
            click.echo(f"{a.kind:>16} {a.dlsub_id} (Slurm {a.slurm_job_id}): {a.reason}")


@click.command()
@click.option("--once", is_flag=True, required=True, help="One pass, for system cron (etc/cron.d/dlsub-backfill).")
@db_option
@policy_option
def backfill(once: bool, db: Path | None, policy_path: Path | None) -> None:
    """One backfill pass (a full agent tick), unless the agent is running and does it itself."""
    private_umask()
    db = db or default_db_path()
    policy = _policy(policy_path)
    if not policy.failover.shared_state:  # a pair's database is on both hosts: the lease decides there
        _not_on_another_host(policy)
    with agent_lock(db, lock_path(db, policy)) as lock:
        if lock is None:
            click.echo("dlsub: the agent is running and backfills on its own; nothing to do")
            return
        agent_obj = _make_agent(db, policy)
        actions = _one_tick(agent_obj)
        make_private(db)
    if actions is None:
        click.echo(f"dlsub: the agent on {_holder(agent_obj.store)} holds the lease and backfills on its own; "
                   "nothing to do")
        return
    for a in actions:
        click.echo(f"{a.kind:>16} {a.dlsub_id} (Slurm {a.slurm_job_id}): {a.reason}")


def _holder(store: AgentStore) -> str:
    row = store.lease()
    return f"{row.host}, pid {row.pid}" if row else "another host"


def _not_on_another_host(policy: AgentPolicy) -> None:
    """Return only where the agent's state is: on the host its ``agent_address`` names, or anywhere without one.

    The agent's database and the lock that keeps a cron pass from running beside the daemon are on the
    agent's own disk (``/var/lib/dlsub``): a pass on another login host would see neither, tick from a
    state of its own and act on the same jobs as the agent. So there it asks the agent instead, and stops.
    """
    endpoint = AgentEndpoint.of(policy)
    if not endpoint.elsewhere():
        return
    try:
        reply = ask(endpoint, {"op": "status"})
    except AgentUnavailable as exc:
        fail(f"the agent's state and lock are on its own host ({policy.agent_address}, the policy's "
             f"agent_address), not here, so no backfill runs from this host; run it there (install "
             f"etc/cron.d/dlsub-backfill on that host only). The agent does not answer: {exc}", 1)
    status = reply.get("status")
    host = status.get("host") if isinstance(status, dict) else None
    click.echo(f"dlsub: the agent runs on {host or policy.agent_address} and backfills on its own; "
               "nothing to do here")
    raise SystemExit(0)
