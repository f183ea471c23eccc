"""The agent's Prometheus metrics (prometheus-client), served on 127.0.0.1 for the site's Prometheus.

The agent's tick is wrapped, not changed: :meth:`AgentMetrics.instrumented`
times each tick and then reads what it left in the agent's own store (the
decisions logged since the last tick, the moves in flight, the jobs'
states) and the partitions the tick's one ``sinfo`` returned
(:class:`RecordingSlurmClient`). Counters count from the agent's start, as
Prometheus expects. No metric names a user unless the policy's
``[metrics] per_user_labels`` allows it. Metric names: docs/admin-guide.md, "Metrics".
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from dlsub.slurm_plugins.client import SlurmClient
from dlsub.slurm_plugins.models import Partition

if TYPE_CHECKING:
    from dlsub.agent.agent_store import AgentStore

log = logging.getLogger("dlsub.agent.metrics")

#: The decision kind of an action that failed in Slurm.
_ERROR_KIND = "error"


class RecordingSlurmClient(SlurmClient):
    """The Slurm client, remembering the partitions (nodes, GPUs) the last ``sinfo`` returned."""

    last_partitions: list[Partition] | None = None

    def partitions(self) -> list[Partition]:
        found = super().partitions()
        self.last_partitions = found
        return found


class Ticking(Protocol):
    """What the metrics wrap: a lone agent (:class:`~dlsub.agent.reconcile.Agent`) or one of a pair
    (:class:`~dlsub.agent.leadership.Leadership`)."""

    @property
    def store(self) -> AgentStore: ...

    @property
    def client(self) -> SlurmClient: ...

    def tick(self) -> Any: ...


class AgentMetrics:
    """The agent's metrics in a registry of their own (no process-wide globals)."""

    def __init__(self, *, per_user_labels: bool = False, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.per_user_labels = per_user_labels
        r = self.registry
        self.ticks = Counter("dlsub_agent_ticks", "Agent ticks run.", registry=r)
        self.tick_duration = Histogram(
            "dlsub_agent_tick_duration_seconds", "Wall time of one agent tick.", registry=r,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80))
        self.last_tick = Gauge("dlsub_agent_last_tick_timestamp_seconds", "When the last tick ended (epoch).",
                               registry=r)
        self.decisions = Counter("dlsub_agent_decisions", "Decisions the agent logged, by kind.", ["kind"],
                                 registry=r)
        self.moves = Counter("dlsub_agent_moves", "Moves started (move, continue, backfill, return), by kind.",
                             ["kind"], registry=r)
        self.errors = Counter("dlsub_agent_errors", "Errors: slurm (a tick could not observe), action (an action "
                              "failed), tick (a tick raised).", ["where"], registry=r)
        self.jobs = Gauge("dlsub_jobs", "Slurm jobs of dlsub jobs the agent follows, by state.", ["state"],
                          registry=r)
        self.gpus = Gauge("dlsub_partition_gpus", "GPUs per partition, idle or busy (down nodes are neither).",
                          ["partition", "state"], registry=r)
        self.nodes = Gauge("dlsub_partition_nodes", "Nodes per partition by state (idle, busy, down).",
                           ["partition", "state"], registry=r)
        self.in_flight = Gauge("dlsub_moves_in_flight", "Moves under way, by kind.", ["kind"], registry=r)
        self.active = Gauge("dlsub_agent_active", "1 while this agent acts (a lone agent, or the one of a pair that "
                            "holds the lease), 0 while it stands by.", registry=r)
        self.lease_token = Gauge("dlsub_agent_lease_token", "The token of the lease this agent holds (0: none, or "
                                 "no pair); it rises by one at each takeover.", registry=r)
        self.user_jobs = (Gauge("dlsub_user_jobs", "dlsub jobs by user and state (policy: per_user_labels).",
                                ["user", "state"], registry=r) if per_user_labels else None)
        for where in ("slurm", "action", "tick"):
            self.errors.labels(where)  # present at 0 from the start: rate() needs a first sample
        self._last_decision_id: int | None = None
        self._moves_seen: set[tuple[Any, ...]] = set()
        self._labelled: dict[str, set[tuple[str, ...]]] = collections.defaultdict(set)

    # ---------------------------------------------------------------- serving
    def serve(self, port: int, address: str = "127.0.0.1") -> Any:
        """Serve /metrics on ``address:port`` from a daemon thread; returns the HTTP server."""
        server, _thread = start_http_server(port, addr=address, registry=self.registry)
        return server

    # ---------------------------------------------------------------- ticks
    def instrumented(self, agent: Ticking) -> Callable[[], Any]:
        """``agent.tick`` timed and followed by a metrics update; what the daemon schedules."""
        self.baseline(agent.store)

        def tick() -> Any:
            started = time.monotonic()
            try:
                return agent.tick()
            except Exception:
                self.errors.labels("tick").inc()
                raise
            finally:
                self.after_tick(agent, time.monotonic() - started)

        return tick

    def baseline(self, store: AgentStore) -> None:
        """Count from now: decisions and moves already in the store are history, not this process's."""
        row = store.conn.execute("select max(id) from decisions").fetchone()
        self._last_decision_id = int(row[0] or 0)
        self._moves_seen = {_move_key(m) for m in store.moves()}

    def after_tick(self, agent: Ticking, duration_s: float) -> None:
        """Update every metric from what the tick left; never raises (metrics must not stop the agent)."""
        self.ticks.inc()
        self.tick_duration.observe(duration_s)
        self.last_tick.set(time.time())
        try:
            self._update(agent)
        except Exception as exc:  # noqa: BLE001 - a metrics failure is logged, the agent goes on
            log.warning("updating metrics failed: %s", exc)

    def _update(self, agent: Ticking) -> None:
        store = agent.store
        self.active.set(1 if store.holds_lease() else 0)
        self.lease_token.set(store.token or 0)
        if self._last_decision_id is None:
            self.baseline(store)
        meta = store.meta()
        if meta.get("last_error") and str(meta.get("doing", "")).startswith("waiting for Slurm"):
            self.errors.labels("slurm").inc()
        rows = store.conn.execute("select id, kind from decisions where id > ? order by id",
                                  (self._last_decision_id,)).fetchall()
        for decision_id, kind in rows:
            self.decisions.labels(str(kind)).inc()
            if kind == _ERROR_KIND:
                self.errors.labels("action").inc()
            self._last_decision_id = max(self._last_decision_id or 0, int(decision_id))
        moves = store.moves()
        for move in moves:
            key = _move_key(move)
            if key not in self._moves_seen:
                self._moves_seen.add(key)
                self.moves.labels(str(move.get("kind") or "move")).inc()
        self._moves_seen = {_move_key(m) for m in moves}  # a later move has its own creation time
        self._set("in_flight", self.in_flight, collections.Counter((str(m.get("kind") or "move"),) for m in moves))
        jobs = store.jobs().values()
        self._set("jobs", self.jobs, collections.Counter((str(j.state or "UNKNOWN"),) for j in jobs))
        if self.user_jobs is not None:
            self._set("user_jobs", self.user_jobs,
                      collections.Counter((j.user or str(j.uid), str(j.state or "UNKNOWN")) for j in jobs))
        client = agent.client
        partitions = client.last_partitions if isinstance(client, RecordingSlurmClient) else None
        if partitions is not None:
            gpus: collections.Counter[tuple[str, ...]] = collections.Counter()
            nodes: collections.Counter[tuple[str, ...]] = collections.Counter()
            for part in partitions:
                gpus[(part.name, "idle")] += 0
                gpus[(part.name, "busy")] += 0
                for node in part.nodes:
                    if node.usable:
                        gpus[(part.name, "idle")] += node.idle_gpus
                        gpus[(part.name, "busy")] += min(node.gpus, node.gpus_used)
                        nodes[(part.name, "busy" if node.alloc_cpus or node.gpus_used else "idle")] += 1
                    else:
                        nodes[(part.name, "down")] += 1
            self._set("gpus", self.gpus, gpus)
            self._set("nodes", self.nodes, nodes)

    def _set(self, name: str, gauge: Gauge, values: collections.Counter[tuple[str, ...]]) -> None:
        """Set a labelled gauge to exactly ``values``: label sets no longer seen drop to 0."""
        for labels in self._labelled[name] - set(values):
            gauge.labels(*labels).set(0)
        for labels, value in values.items():
            gauge.labels(*labels).set(value)
        self._labelled[name] |= set(values)


def _move_key(move: dict[str, Any]) -> tuple[Any, ...]:
    return (move.get("uid"), move.get("slurm_job_id"), move.get("created"), move.get("kind"))
