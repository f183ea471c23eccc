"""What users ask the agent: ``dlsub why JOB`` and ``dlsub agent status``.

Both ask the running agent (:mod:`dlsub.job.agent_client`): over its Unix
socket on its own host, over TCP with a munge credential from any other
login host (the policy's ``agent_address``). It answers about the caller's
own jobs only. When it does not answer,
root and the agent's service account read its database directly; anyone
else is told that the agent is down and its state is private.

Exit codes: 0 answered, 2 bad input, 3 the agent is not running or does
not answer.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import pwd
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import click

from dlsub.agent.agent_store import AgentStore, default_db_path
from dlsub.agent.query import agent_status
from dlsub.cli.errors import fail
from dlsub.contract import DLSUB_ID
from dlsub.job.agent_client import AgentEndpoint, AgentUnavailable, ask
from dlsub.site_config.policy_file import AgentPolicy, PolicyFileError, load_policy

#: The agent does not answer (not running, stuck, or its socket is gone).
EXIT_NOT_RUNNING = 3
#: The fields `dlsub agent status --json` always has, answered or not.
KEPT_FIELDS = ("running", "last_tick", "last_tick_age_s", "doing", "moves_in_flight", "last_error")

socket_option = click.option("--socket", "socket_path", type=click.Path(path_type=Path, dir_okay=False),
                             default=None, envvar="DLSUB_AGENT_SOCKET",
                             help="The agent's query socket [default: $DLSUB_AGENT_SOCKET or the policy's `socket`].")
address_option = click.option(
    "--address", "address", default=None, envvar="DLSUB_AGENT_ADDRESS", metavar="HOST:PORT",
    help="Ask the agent over TCP at HOST:PORT, with a munge credential [default: $DLSUB_AGENT_ADDRESS, or the "
         "policy's `agent_address` from a host other than the agent's].")
direct_db_option = click.option(
    "--db", type=click.Path(path_type=Path, dir_okay=False), default=None,
    help="Read this agent database directly instead of asking the agent (root and the agent's account only).")



def _policy() -> AgentPolicy:
    try:
        return load_policy(None)
    except PolicyFileError as exc:
        fail(f"{exc} (the agent's policy names its socket; ask your admin, or pass --socket)")


def _endpoint(socket_path: Path | None, address: str | None) -> AgentEndpoint:
    """Where to ask: an explicit socket or address alone (no policy needed), else the policy's."""
    if socket_path is not None and not address:
        return AgentEndpoint(socket=socket_path)
    return AgentEndpoint.of(_policy(), socket_path, address)


def _may_read_state(db: Path) -> bool:
    """Root and the service account may read the agent's database; nobody else can."""
    return os.access(db, os.R_OK) and os.access(db.parent, os.X_OK)


def _read_directly(db: Path) -> AgentStore:
    try:
        if db.exists() and not os.access(db, os.R_OK):  # exists() itself raises when the directory is closed
            raise PermissionError(db)
        return AgentStore(db, readonly=True)
    except FileNotFoundError:
        fail(f"no agent state at {db}: the agent has not run here", EXIT_NOT_RUNNING)
    except (PermissionError, sqlite3.OperationalError):
        fail(f"the agent's state at {db} is private to its service account; ask the running agent "
              "(leave out --db)", EXIT_NOT_RUNNING)


def _alive(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except PermissionError:
        return True  # someone else's process (the service account's)
    except (OSError, TypeError, ValueError):
        return False
    return True


# ---------------------------------------------------------------- dlsub agent status


def _print_status(info: dict[str, Any]) -> None:
    if info["running"]:
        click.echo(f"dlsub agent: running (pid {info.get('pid')} on {info.get('host')}); policy {info.get('policy')}")
    else:
        click.echo("dlsub agent: not running" + (f" ({info['error']})" if info.get("error") else ""))
    lease = info.get("lease")
    if info.get("role"):
        click.echo(f"answered by: {info.get('answered_by')}, {info['role']}")
    if isinstance(lease, dict):
        state = f"expires in {lease.get('expires_in_s'):.0f} s" if lease.get("live") else "expired"
        click.echo(f"lease: held by {lease.get('holder')} (pid {lease.get('pid')}), token {lease.get('token')}, "
                   f"{state}")
    last = info.get("last_tick")
    if last:
        click.echo(f"last tick: {dt.datetime.fromtimestamp(last):%Y-%m-%d %H:%M:%S} "
                   f"({info['last_tick_age_s']:.0f} s ago)")
    if info.get("late"):
        why = ("the last tick hit its deadline" if info.get("last_tick_hit_deadline")
               else f"no tick for longer than {info.get('tick_interval_s'):g} s + {info.get('tick_deadline_s'):g} s")
        click.echo(f"late: {why}")
    if info.get("doing") is not None:
        click.echo(f"doing: {info['doing']}")
    moves = info.get("moves_in_flight") or []
    if moves:
        click.echo(f"moves in flight: {len(moves)}")
    if info.get("last_error"):
        click.echo(f"last error: {info['last_error']}")


def _status_unanswered(reason: str, db: Path | None, elsewhere: str = "") -> dict[str, Any]:
    """The status when the agent does not answer: from its database for those who may read it.

    ``elsewhere``: the agent's address when it names another host, whose state this host's database is not.
    """
    policy = AgentPolicy()
    path = db or default_db_path()
    if elsewhere:
        return {**dict.fromkeys(KEPT_FIELDS), "running": False, "moves_in_flight": [],
                "error": f"{reason} (the agent's state is on its own host, {elsewhere}: ask your admin if it "
                         "stays down)"}
    if db is not None or _may_read_state(path):
        try:
            store = _read_directly(path)
            meta = store.meta()
            info = agent_status(meta, store.moves(), policy, time.time(), running=False, lease=store.lease())
        except SystemExit:
            raise
        except Exception as exc:  # noqa: BLE001 - an unreadable state says only that no agent runs
            info = {**dict.fromkeys(KEPT_FIELDS), "running": False, "error": f"{reason}; its state: {exc}"}
            return info
        here = meta.get("host") in (None, os.uname().nodename)
        # A pid means something on the agent's own host only: elsewhere, whether it lives is unknown here.
        alive = bool(meta.get("pid")) and not meta.get("stopped") and here and _alive(meta.get("pid"))
        info["process_alive"] = alive if here else None
        if db is not None:  # asked to read the database: its process says whether it runs
            info["running"] = alive
        else:
            info["error"] = reason
        return info
    return {**dict.fromkeys(KEPT_FIELDS), "running": False, "moves_in_flight": [],
            "error": f"{reason} (its state is private to the agent's account: ask your admin if it stays down)"}


@click.command("status")
@click.option("--json", "as_json", is_flag=True)
@socket_option
@address_option
@direct_db_option
def status(as_json: bool, socket_path: Path | None, address: str | None, db: Path | None) -> None:
    """Whether the agent runs, its last tick (and whether it is late), and what it is doing."""
    if db is not None:
        info = _status_unanswered("read from its database (--db)", db)
    else:
        where = _endpoint(socket_path, address)
        elsewhere = where.address if where.elsewhere() else ""
        try:
            reply = ask(where, {"op": "status"})
        except AgentUnavailable as exc:
            info = _status_unanswered(str(exc), None, elsewhere)
        else:
            if not reply.get("ok") or not isinstance(reply.get("status"), dict):
                info = _status_unanswered(f"the agent answered with an error: {reply.get('error')}", None,
                                          elsewhere)
            else:
                info = {**reply["status"], "you": reply.get("you")}
    if as_json:
        click.echo(json.dumps(info))
    else:
        _print_status(info)
    if not info.get("running"):
        sys.exit(EXIT_NOT_RUNNING)


# ---------------------------------------------------------------- dlsub why


class JobHandle(NamedTuple):
    """What JOB names: a dlsub id, a Slurm job id, or both; ``either`` when it is not one of the user's own
    jobs and could be either kind (eight decimal digits)."""

    dlsub_id: str | None
    slurm_id: int | None
    either: bool = False


def resolve_job(job: str) -> JobHandle:
    """JOB (a dlsub id, its prefix, or a Slurm job id) as a handle, through the user's own store."""
    from dlsub.job.settings import load_settings
    from dlsub.job.user_store import JobStore, UnknownJob

    try:
        record = JobStore(load_settings().db_path).get(job)
        return JobHandle(record.id, record.slurm_job_id)
    except (UnknownJob, OSError):
        pass
    if DLSUB_ID.match(job) and job.isdigit():
        # Eight decimal digits are both a dlsub id (older ids could be all digits) and a Slurm job id.
        return JobHandle(job, int(job), either=True)
    if job.isdigit() and 0 < int(job) < 2**32:
        return JobHandle(None, int(job))
    if DLSUB_ID.match(job):
        return JobHandle(job, None)
    fail(f"unknown job {job!r}: give a dlsub id (8 hex digits, or a prefix of one of yours) "
         "or a Slurm job id; `dlsub status` lists your jobs")


def _decisions_directly(db: Path, dlsub_id: str | None, slurm_id: int | None) -> list[dict[str, Any]]:
    store = _read_directly(db)
    found = store.decisions(dlsub_id=dlsub_id, slurm_job_id=None if dlsub_id else slurm_id)
    return [dataclasses.asdict(d) for d in found]


@click.command()
@click.argument("job")
@click.option("--json", "as_json", is_flag=True)
@socket_option
@address_option
@direct_db_option
def why(job: str, as_json: bool, socket_path: Path | None, address: str | None, db: Path | None) -> None:
    """What the agent decided about JOB (a dlsub id, its prefix, or a Slurm job id), and why."""
    handle = resolve_job(job)
    where = None if db is not None else _endpoint(socket_path, address)
    decisions = _why_decisions(handle.dlsub_id, handle.slurm_id, where, db)
    if handle.either and not decisions:
        # Nothing is recorded under JOB as a dlsub id: try it as a Slurm id.
        decisions = _why_decisions(None, handle.slurm_id, where, db)
    if as_json:
        click.echo(json.dumps(decisions))
        return
    if not decisions:
        click.echo(f"dlsub: the agent has decided nothing about job {job} yet")
        return
    for d in decisions:
        when = dt.datetime.fromtimestamp(float(d["time"]))
        click.echo(f"{when:%Y-%m-%d %H:%M:%S}  {d['kind']:<14} {d['reason']}")


def _why_decisions(dlsub_id: str | None, slurm_id: int | None, where: AgentEndpoint | None,
                   db: Path | None) -> list[dict[str, Any]]:
    """The agent's decisions about a job, from the running agent, or its store read directly."""
    if db is not None or where is None:
        decisions = _decisions_directly(db or default_db_path(), dlsub_id, slurm_id)
    else:
        try:
            reply = ask(where, {"op": "why", "dlsub_id": dlsub_id, "slurm_job_id": slurm_id})
        except AgentUnavailable as exc:
            state = default_db_path()
            if where.elsewhere() or not _may_read_state(state):
                fail(f"{exc}; the agent's decisions are private to it and it is not answering: "
                      "try again later, or ask your admin", EXIT_NOT_RUNNING)
            me = pwd.getpwuid(os.geteuid()).pw_name
            click.echo(f"dlsub: {exc}; reading {state} directly as {me}", err=True)
            decisions = _decisions_directly(state, dlsub_id, slurm_id)
        else:
            if not reply.get("ok"):
                fail(f"the agent answered: {reply.get('error')}", 1)
            decisions = reply.get("decisions") or []
    return list(decisions)
