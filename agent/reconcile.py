"""The agent's tick: observe → decide (pure rules) → write ahead → act → record.

``Agent.tick(now)`` is the whole loop body; ``dlsub agent run`` calls it on
an interval and at the edges of the off-hours windows, tests call it with a
fake clock. One ``squeue --json`` and one ``sinfo --json`` per tick. Each
step is a module of functions over values (the tick's
:class:`~dlsub.agent.observe.Observation`, the store's records); what the
agent keeps between ticks besides its store is one :class:`AgentMemory`:

* observe (:mod:`dlsub.agent.observe`, trusting only what
  :mod:`dlsub.agent.identify` allows): what Slurm and the job files show;
* decide: the moves (:func:`dlsub.policies.actions.move_rules.plan`) and
  the resizes (:mod:`dlsub.agent.decide`, on
  :mod:`dlsub.policies.actions.resize_rules`), and the resizes a crash left
  in flight;
* act (:mod:`dlsub.agent.act`): one table from each action kind to its
  write-ahead step, its Slurm call, its next phase and its failpoints.

Writes: what the tick observed and decided (moves' and resizes' intents
included) is committed in one transaction before the agent acts on Slurm,
which makes it the write-ahead record; the outcome (phases, errors, meta)
follows in a second one.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dlsub.agent import failpoints
from dlsub.agent.act import STEPS, Item, act, prepare
from dlsub.agent.agent_store import AgentStore, Writes
from dlsub.agent.budget_watch import BudgetWatch
from dlsub.agent.decide import TAKES_GPUS, place_waiting_jobs, plan_resizes, reserve_gpus, rules_from
from dlsub.agent.live_models import LiveModels, sizing_policy
from dlsub.agent.observe import Observation, ObserveWith, observe
from dlsub.policies.actions import move_rules
from dlsub.policies.actions.move_views import Action
from dlsub.site_config.policy_file import AgentPolicy
from dlsub.slurm_plugins.client import SlurmClient, SlurmError
from dlsub.slurm_plugins.queue_reader import QueueReader

log = logging.getLogger("dlsub.agent")


@dataclass
class AgentMemory:
    """What the agent keeps in memory from one tick to the next. A restart starts it afresh, harmlessly: what
    must survive a crash (moves and resizes in flight, the workers told to leave) is in the store."""

    # When each followed job's files were last read (deadline clock): the least recently read go first.
    last_read: dict[tuple[int, int], float] = field(default_factory=dict)
    # An elastic policy that learns from reports sizes elastic jobs on models fitted from them.
    models: LiveModels = field(default_factory=LiveModels)


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
        self._sizing_policy = sizing_policy(policy)
        # What each budget has left (sacct at most once a minute): the planner's budget gate.
        self._budgets = BudgetWatch(client, policy)
        # Which queued jobs are dlsub's, remembered between ticks: the rest are read brief.
        self._queue = QueueReader(client)
        self.observing = ObserveWith(store, policy, self.rules, self._budgets, deadline_clock, self.memory.last_read)

    def tick(self, now: float | None = None) -> list[Action]:
        now = self.clock() if now is None else now
        started = self.deadline_clock()
        self.store.set_meta(last_tick_started=now, doing="observing")
        try:
            # The queue brief, dlsub's jobs (and the ones it has rows or moves for) whole.
            follow = self.store.job_ids() | {key[1] for key in self.store.move_rows()}
            slurm_jobs = self._queue.read(follow)
            partitions = self.client.partitions()
        except SlurmError as exc:
            # Stale data: decide nothing this tick; the loop goes on.
            self.store.set_meta(doing=f"waiting for Slurm: {exc}", last_tick=now, last_error=str(exc))
            log.warning("observe failed: %s", exc)
            return []
        writes = Writes()
        seen = observe(self.observing, now, slurm_jobs, partitions, writes, started + self.policy.tick_deadline_s)
        actions = [a for a in move_rules.plan(seen.jobs, seen.partitions, self.rules, now, seen.window, seen.usage)
                   if a.slurm_job_id in seen.followed]
        todo: list[Action] = []  # written ahead, to be carried out in Slurm
        done: list[Action] = []  # bookkeeping only (a note, a move's end)
        for action in actions:
            (todo if prepare(action, seen, now, writes) else done).append(action)
        # GPUs this tick's moves and backfills are about to take are not idle for growth.
        seen.rooms = reserve_gpus(seen.rooms, [(a.partition, a.gpus, a.gpu_type) for a in actions
                                                     if a.kind in TAKES_GPUS])
        if self.policy.goodput.across_gpu_types and self._sizing_policy is not None:
            try:
                # What jobs that are not elastic measured on each kind (a `dlsub estimate` profile among
                # them): learnt before any elastic job of the same command is sized or placed this tick.
                self.memory.models.learn(seen.kind_runs)
            except Exception:  # what was learnt costs the jobs it would have informed, never the tick
                log.exception("learning the kinds fixed-size runs measured failed; not learnt this tick")
            # Before the resizes: the workers that leave for a job that waits are those of the kind it waits for.
            for action in place_waiting_jobs(seen, self.rules, self.memory.models, self._sizing_policy, now):
                if action.slurm_job_id in seen.followed and action.slurm_job_id not in {a.slurm_job_id for a in todo}:
                    (todo if prepare(action, seen, now, writes) else done).append(action)
        kind_moves: list[Action] = []  # elastic jobs moved to another GPU kind ([goodput] across_gpu_types)
        resumed, planned = plan_resizes(seen, self.store, self.policy, self.rules, self.memory.models,
                                        self._sizing_policy, now, writes, kind_moves)
        for resize in planned:
            prepare(resize, seen, now, writes)
        for action in kind_moves:
            if action.slurm_job_id in seen.followed and action.slurm_job_id not in {a.slurm_job_id for a in todo}:
                (todo if prepare(action, seen, now, writes) else done).append(action)
        self.store.write(writes)  # what was observed and decided, before anything is done about it
        outcome, finished = act(self.client, self.store, seen, [*resumed, *planned], todo, done, now)
        outcome.meta = self._status(seen, now, started)
        self.store.write(outcome)
        self.store.forget(seen.forgettable)
        self._after(finished)
        try:
            self.store.prune(now, self.policy.retention.progress_days, self.policy.retention.decisions_days)
        except Exception as exc:  # noqa: BLE001 - pruning can wait for the next hour
            log.warning("pruning old progress and decisions failed: %s", exc)
        return done

    def _status(self, seen: Observation, now: float, started: float) -> dict[str, object]:
        """What the agent is doing, for ``dlsub agent status`` and the metrics."""
        # Every user reads this through `dlsub agent status`: counts only, no job of anyone's by name
        # (each user sees their own moves in moves_in_flight).
        kinds = collections.Counter(m.kind for m in self.store.move_rows().values())
        doing = f"watching {len(seen.jobs)} dlsub job(s)"
        if kinds:
            doing += "; in flight: " + ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
        if seen.window.open:
            doing += f"; off-hours window '{seen.window.name}' open"
        if seen.late:
            doing += f"; late: {seen.skipped} job(s) left for the next tick"
        if self._queue.unseen:
            doing += f"; {self._queue.unseen} queued job(s) not read yet (a few hundred a tick)"
        return {"last_tick": now, "doing": doing, "jobs": len(seen.jobs), "last_error": None,
                "late": seen.late, "skipped": seen.skipped,
                "last_tick_duration_s": round(self.deadline_clock() - started, 3)}

    @staticmethod
    def _after(finished: list[Item]) -> None:
        """The failpoints once the outcome is recorded."""
        for item in finished:
            failpoints.reach(STEPS[item.kind].after)


__all__ = ["Agent", "AgentMemory"]
