"""One of a pair of agents: active while it holds the lease, standing by while the other does.

``dlsub agent run`` with ``[failover] shared_state`` schedules :meth:`Leadership.tick` where a lone agent
schedules :meth:`Agent.tick <dlsub.agent.reconcile.Agent.tick>`. A standby ticks no policy and calls no
Slurm command that changes anything: each turn it asks whether Slurm answers (``scontrol ping``: an agent
that cannot reach slurmctld never takes the lease) and then tries to take the lease
(:meth:`~dlsub.agent.agent_store.AgentStore.take_lease`). Once it holds it, it starts a new
:class:`~dlsub.agent.reconcile.Agent` on the shared store, as a restarted agent would start: its first tick
finishes the moves and resizes the records hold half done. An active agent's tick that finds itself deposed
(:class:`~dlsub.agent.lease.Deposed`) has written and asked nothing more; it stands by again.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable

from dlsub.agent.agent_store import AgentStore
from dlsub.agent.lease import Deposed, Holder
from dlsub.agent.reconcile import Agent
from dlsub.policies.actions.move_views import Action
from dlsub.slurm_plugins.client import SlurmClient, SlurmError

log = logging.getLogger("dlsub.agent")


class Role(enum.StrEnum):
    """What an agent of a pair is doing: ACTIVE (holds the lease, ticks) or STANDBY (waits to take it).

    STANDBY → ACTIVE when it takes the lease; ACTIVE → STANDBY when a write or a Slurm call finds the lease
    gone or about to run out, or when it stops (it gives the lease up)."""

    ACTIVE = "active"
    STANDBY = "standby"


class Leadership:
    """The loop body of an agent of a pair (see the module's docstring). ``make_agent`` builds the agent that
    ticks while this one is active, on ``store``."""

    def __init__(self, store: AgentStore, client: SlurmClient, make_agent: Callable[[], Agent], me: Holder,
                 clock: Callable[[], float] = time.time,
                 on_active: Callable[[], None] = lambda: None) -> None:
        self.store = store
        self.client = client
        self.me = me
        self._make_agent = make_agent
        self._clock = clock
        self._on_active = on_active  # what the daemon records once this agent acts (its pid, host, start)
        self.agent: Agent | None = None
        self._cannot_reach_slurm = False  # logged once, not every turn

    @property
    def role(self) -> Role:
        return Role.ACTIVE if self.agent is not None and self.store.holds_lease() else Role.STANDBY

    def tick(self) -> list[Action]:
        """One turn: the active agent's tick, or a standby's try to take the lease (and then that tick)."""
        if self.agent is None and not self._take():
            return []
        assert self.agent is not None
        try:
            return self.agent.tick()
        except Deposed as exc:
            log.warning("standing by: %s", exc)
            self.agent = None  # the store dropped its token as it refused
            return []

    def stop(self) -> None:
        """A clean stop: give the lease up, so that the standby takes over at its next turn."""
        if self.agent is not None:
            self.store.release_lease(self._clock())
            self.agent = None

    def _take(self) -> bool:
        try:
            self.client.ping()
        except SlurmError as exc:
            if not self._cannot_reach_slurm:
                log.warning("standby: Slurm does not answer, so this agent does not take the lease: %s", exc)
            self._cannot_reach_slurm = True
            return False
        self._cannot_reach_slurm = False
        before = self.store.lease()
        taken = self.store.take_lease(self.me, self._clock())
        if taken is None:
            return False
        was = f"from {before.host} (pid {before.pid}, token {before.token})" if before else "(first holder)"
        log.info("active: took the lease %s with token %d; finishing what the records hold", was, taken.token)
        self.agent = self._make_agent()
        self._on_active()
        return True


__all__ = ["Leadership", "Role"]
