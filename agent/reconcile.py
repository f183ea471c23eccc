"""The agent's tick: observe → decide (pure rules) → write ahead → act → record.

``Agent.tick(now)`` is the whole loop body; ``dlsub agent run`` calls it on
an interval and at the edges of the off-hours windows, tests call it with a
fake clock. One ``squeue --json`` and one ``sinfo --json`` per tick. Each
step is a module of functions over values (the tick's
:class:`~dlsub.agent.observe.Observation`, the store's records); what the
agent keeps between ticks besides its store is one :class:`AgentMemory`:

* observe (:mod:`dlsub.agent.observe`, trusting only what
  :mod:`dlsub.agent.identify` allows): what Slurm and the job files show;
* decide (:mod:`dlsub.agent.decide`): the moves
  (:func:`dlsub.policies.actions.move_rules.plan`), the resizes (on
  :mod:`dlsub.policies.actions.resize_rules`), and the resizes a crash left
  in flight, as one :class:`~dlsub.agent.decide.Plan`;
* prepare and act (:mod:`dlsub.agent.act`): one table from each action kind
  to its write-ahead step, its Slurm call, its next phase and its failpoints.

One pipeline of values, each step a function that changes none of its
inputs: ``observe(store snapshot, Slurm) -> Observation`` (the store is read
once, at the tick's start, into :class:`~dlsub.agent.store_rows.StoreSnapshot`),
``decide(Observation, memory) -> Plan``, ``prepare(Plan) -> Writes`` (the
write-ahead, in one place) and ``act(Plan) -> Outcome``. Only the tick
itself reads and writes the store: an import contract keeps the steps from it.

Writes: what the tick observed and decided (moves' and resizes' intents
included) is committed in one transaction before the agent acts on Slurm,
which makes it the write-ahead record; the outcome (phases, errors, meta)
follows in a second one.

A pair of agents on one shared database (:mod:`dlsub.agent.lease`): the tick renews its lease once Slurm has
answered its reads, and only then; each write is fenced by the lease's token, and so is each Slurm call
(``act``'s ``fence``). A deposed agent's tick raises :class:`~dlsub.agent.lease.Deposed` having written and
asked nothing more (:mod:`dlsub.agent.leadership` then stands it by).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence

from dlsub.agent import failpoints
from dlsub.agent.act import STEPS, Item, act, prepare
from dlsub.agent.agent_store import AgentStore
from dlsub.agent.budget_watch import BudgetWatch
from dlsub.agent.decide import AgentMemory, DecideWith, decide, rules_from
from dlsub.agent.lease import Deposed
from dlsub.agent.live_models import sizing_policy
from dlsub.agent.observe import Observation, ObserveWith, observe
from dlsub.agent.records import MoveRow
from dlsub.agent.store_rows import moves_after
from dlsub.policies.actions.move_views import Action
from dlsub.site_config.policy_file import AgentPolicy
from dlsub.slurm_plugins.client import SlurmClient, SlurmError
from dlsub.slurm_plugins.queue_reader import QueueReader

log = logging.getLogger("dlsub.agent")


class Agent:
    def __init__(self, client: SlurmClient, store: AgentStore, policy: AgentPolicy,
                 clock: Callable[[], float] = time.time,
                 deadline_clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.store = store
        self.policy = policy
        self.rules = rules_from(policy)
        self.clock = clock
        # Real elapsed time for the tick's deadline (the tick clock may be a test's fake one).
        self.deadline_clock = deadline_clock
        self.memory = AgentMemory()
        # What each budget has left (sacct at most once a minute): the planner's budget gate.
        self._budgets = BudgetWatch(client, policy)
        # Which queued jobs are dlsub's, remembered between ticks: the rest are read brief.
        self._queue = QueueReader(client)
        self.observing = ObserveWith(policy, self.rules, self._budgets, deadline_clock, self.memory.last_read)
        self.deciding = DecideWith(policy, self.rules, sizing_policy(policy))

    def tick(self, now: float | None = None) -> list[Action]:
        now = self.clock() if now is None else now
        started = self.deadline_clock()
        self.store.set_meta(last_tick_started=now, doing="observing")
        snapshot = self.store.snapshot()  # everything the tick reads of the store, read once
        try:
            # The queue brief, dlsub's jobs (and the ones it has rows or moves for) whole.
            slurm_jobs = self._queue.read(snapshot.followed_ids())
            partitions = self.client.partitions()
        except SlurmError as exc:
            # Stale data: decide nothing this tick; the loop goes on.
            self.store.set_meta(doing=f"waiting for Slurm: {exc}", last_tick=now, last_error=str(exc))
            log.warning("observe failed: %s", exc)
            return []
        self.store.renew_lease(now)  # Slurm answered: this agent can still act (no lease on one host's database)
        obs = observe(self.observing, snapshot, slurm_jobs, partitions, now,
                       started + self.policy.tick_deadline_s)
        plan = decide(obs, self.memory, self.deciding, now)
        ahead = prepare(plan, obs, now)
        self.store.write(ahead)  # what was observed and decided, before anything is done about it
        outcome = act(self.client, obs, plan, ahead, now,
                      fence=lambda: self.store.check_lease(now + self.deadline_clock() - started))
        status = self._status(obs, moves_after(snapshot.moves, ahead, outcome.writes), now, started)
        self.store.write(dataclasses.replace(outcome.writes, meta=status))  # the outcome, and what the agent does
        self.store.forget(obs.forgettable)
        self._after(outcome.finished)
        try:
            self.store.prune(now, self.policy.retention.progress_days, self.policy.retention.decisions_days)
        except Deposed:
            raise
        except Exception as exc:  # noqa: BLE001 - pruning can wait for the next hour
            log.warning("pruning old progress and decisions failed: %s", exc)
        return list(outcome.done)

    def _status(self, obs: Observation, moves: Mapping[tuple[int, int], MoveRow], now: float,
                started: float) -> dict[str, object]:
        """What the agent is doing, for ``dlsub agent status`` and the metrics (``moves``: those in flight once
        the tick is written)."""
        # Every user reads this through `dlsub agent status`: counts only, no job of anyone's by name
        # (each user sees their own moves in moves_in_flight).
        kinds = collections.Counter(m.kind for m in moves.values())
        doing = f"watching {len(obs.jobs)} dlsub job(s)"
        if kinds:
            doing += "; in flight: " + ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
        if obs.window.open:
            doing += f"; off-hours window '{obs.window.name}' open"
        if obs.late:
            doing += f"; late: {obs.skipped} job(s) left for the next tick"
        if self._queue.unseen:
            doing += f"; {self._queue.unseen} queued job(s) not read yet (a few hundred a tick)"
        return {"last_tick": now, "doing": doing, "jobs": len(obs.jobs), "last_error": None,
                "late": obs.late, "skipped": obs.skipped,
                "last_tick_duration_s": round(self.deadline_clock() - started, 3)}

    @staticmethod
    def _after(finished: Sequence[Item]) -> None:
        """The failpoints once the outcome is recorded."""
        for item in finished:
            failpoints.reach(STEPS[item.kind].after)


__all__ = ["Agent", "AgentMemory"]
