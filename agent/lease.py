"""The lease that lets two agents, one on each login host, share one state database while only one acts.

Both agents open the same database on a file system both hosts mount (policy ``[failover] shared_state``).
One row of it, ``lease``, says who acts: the holder's host, pid and instance (a random id of the process, so
that a pid the host gives again is not taken for the old holder), a token and when the lease runs out. An
agent takes the lease when it is free, has run out, or is its own; a new holder raises the token by one.
The holder renews it only after a tick that read Slurm (:meth:`dlsub.agent.reconcile.Agent.tick`), so a
holder cut off from slurmctld loses it, even while the shared file system still answers.

The token fences the holder's writes (:meth:`dlsub.agent.agent_store.AgentStore.write`): each one checks,
in its own transaction, that the row still carries its token, and one that does not raises
:class:`Deposed` and writes nothing. Before each Slurm call the tick asks the same, and also whether its
lease has more than ``margin_s`` left by its own clock: a holder whose renewals failed stops acting before
its lease runs out, so the hosts' clocks may differ by less than ``margin_s`` (NTP: well under a second).

Times (:class:`LeaseTerms`): with ``lease_s`` 15 and ticks every 3 s, a standby takes over at most
``lease_s + tick_interval_s`` = 18 s after the holder's last renewal (plus the clocks' difference), and the
holder stops acting ``margin_s`` = 5 s before its lease runs out.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass


class Deposed(RuntimeError):
    """This agent does not hold the lease (any more): what it was about to write or ask Slurm is refused."""


@dataclass(frozen=True)
class Holder:
    """An agent process as the lease names it."""

    host: str
    pid: int
    instance: str  # random per process: a pid reused after a restart is another holder

    @classmethod
    def this_process(cls) -> Holder:
        return cls(os.uname().nodename, os.getpid(), uuid.uuid4().hex)


@dataclass(frozen=True)
class LeaseRow:
    """The lease as the database holds it (``expires``: the holder's clock, epoch seconds)."""

    host: str
    pid: int
    instance: str
    token: int
    renewed: float
    expires: float

    def held_by(self, me: Holder) -> bool:
        return self.instance == me.instance

    def live(self, now: float) -> bool:
        return now < self.expires


@dataclass(frozen=True)
class LeaseTerms:
    """How long a lease lasts, and how long before its end its holder stops acting."""

    lease_s: float = 15.0

    @property
    def margin_s(self) -> float:
        """A third of the lease: room for the hosts' clocks to differ and for one Slurm call to finish."""
        return self.lease_s / 3.0

    def takeover_within_s(self, poll_s: float) -> float:
        """The longest a standby that asks every ``poll_s`` waits after the holder's last renewal."""
        return self.lease_s + poll_s


def may_take(row: LeaseRow | None, me: Holder, now: float) -> bool:
    """Whether ``me`` may hold the lease now: nobody holds it, it ran out, or it is ``me``'s own."""
    return row is None or not row.live(now) or row.held_by(me)


def next_token(row: LeaseRow | None, me: Holder, now: float) -> int:
    """The token ``me`` holds the lease with: its own while it renews a live lease, else one more than the last
    (a lease that ran out is taken anew, even by its last holder: what that holder still had in flight is
    then refused)."""
    if row is None:
        return 1
    if row.held_by(me) and row.live(now):
        return row.token
    return row.token + 1


__all__ = ["Deposed", "Holder", "LeaseRow", "LeaseTerms", "may_take", "next_token"]
