"""In-process re-formation of a data-parallel group (issue 52): the ranks that stay keep running.

Today a resize stops every rank and starts the new group from a checkpoint: interpreter, ``import torch``,
rendezvous and restore, 6–9 s on the testbed, all of it time the staying ranks stand still. Here the group
changes at a step boundary instead, as NVIDIA's in-process restart and torchft do:

* the ranks that stay leave the old process group and form the new one with the processes that join, through
  a store they already share (under torchrun, the agent's store at ``MASTER_ADDR:MASTER_PORT``, which outlives
  every rank), and carry on from the state they hold in memory;
* a joining process gets the model and optimizer state from the new group's rank 0 (a broadcast), not from
  disk; it starts its interpreter and imports torch while the others still train, so they stand still only for
  the re-formation itself;
* the ranks that leave return once the new group has formed without them, and the script exits.

The script's side: after a change it wraps its model again (DDP holds the old group) and takes its share of
the batch for the new size, as after a restart (:attr:`Change.membership`). Any failure (a timeout, a process
that died mid-way) raises :class:`RegroupFailed` on the ranks that stay; their state is still in memory, so the
script saves it and exits for resume, today's restart.

The store's keys, under ``prefix``:

* ``gen``: the current generation (a counter: ``add``);
* ``<g>/joiners``: tickets handed to processes that asked to join generation ``g``;
* ``<g>/plan``: the re-formation of generation ``g``, written by the lowest staying rank (JSON: the old ranks
  that stay, how many tickets joined, the new world size);
* ``<g+1>/pg/``: the new process group's own keys; ``<g+1>/formed``: set once it has formed.

torch is imported where it is used, as in the rest of the library.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from dlsub.checkpointing.run_support import collective_device

#: How long a step of the re-formation (the plan, the new group's connections, the state) may take before it
#: is given up for the restart (seconds). A joining process that registered and then died is the usual cause.
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_PREFIX = "dlsub/regroup"


#: A process whose environment names its part and a phase here (``leaving:agreed``, ``staying:left-the-old-group``,
#: ``joining:planned``: a joining process once the members have planned its place) kills itself (SIGKILL) when
#: it gets there: the kill -9 tests of each phase of the re-formation (as the agent's
#: failpoints do for a move's and a resize's steps). Under torchrun only in its first set of processes (those it
#: starts again after the kill go on), so that a live job dies there once.
FAILPOINT_ENV = "REGROUP_FAILPOINT"  # not DLSUB_: a job passes it into its containers with --export


def _failpoint(phase: str, part: str) -> None:
    if (os.environ.get(FAILPOINT_ENV) == f"{part}:{phase}"
            and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"):
        os.kill(os.getpid(), signal.SIGKILL)


def _end_default_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - a broken group's teardown: nothing more to do with it
            pass


def torchrun_store_address() -> tuple[str, int] | None:
    """Where the store torchrun gave its ranks is (``MASTER_ADDR:MASTER_PORT``: its agent's, or where the agent
    shares none, as under dlsub, the one rank 0 holds); None where torchrun did not start this process."""
    addr, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    if not os.environ.get("TORCHELASTIC_RUN_ID") or not addr or not port.isdigit():
        return None
    return addr, int(port)


def store_client(addr: str, port: int, timeout_s: float) -> Any:
    """A connection of this process's own to the TCP store at ``addr:port``, with no key prefix."""
    import torch.distributed as dist

    return dist.TCPStore(addr, port, is_master=False, timeout=timedelta(seconds=timeout_s))


def torchrun_store(timeout_s: float) -> Any | None:
    """A connection of this process's own to torchrun's store (:func:`torchrun_store_address`), with no key prefix:
    a process that joins from another container reaches the same keys with the same two values
    (:mod:`dlsub.checkpointing.regroup_join`). None where torchrun did not start this process."""
    address = torchrun_store_address()
    return store_client(*address, timeout_s) if address is not None else None


class RegroupFailed(RuntimeError):
    """The group could not re-form in process; the ranks that stay fall back to a checkpoint and a restart."""


@dataclass(frozen=True)
class Membership:
    """This process's place in the group of one generation."""

    rank: int
    world_size: int
    generation: int


@dataclass(frozen=True)
class Change:
    """What one re-formation did, as one process saw it."""

    #: This process left the group (it asked to): the script exits now.
    left: bool
    #: Its place in the new group (for a process that left: in the old one).
    membership: Membership
    #: Processes that joined, and old ranks that left.
    joined: int
    departed: int
    #: For a process that joined: the state rank 0 sent; None for the others.
    state: dict[str, Any] | None
    #: How long this process stood still: from the step boundary to its place in the new group (seconds).
    paused_s: float


@dataclass(frozen=True)
class _Plan:
    stay: tuple[int, ...]
    joiners: int
    generation: int

    @property
    def world_size(self) -> int:
        return len(self.stay) + self.joiners

    def to_json(self) -> bytes:
        return json.dumps({"stay": list(self.stay), "joiners": self.joiners, "generation": self.generation}).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> _Plan:
        data = json.loads(raw)
        return cls(tuple(int(r) for r in data["stay"]), int(data["joiners"]), int(data["generation"]))


class ElasticGroup:
    """A data-parallel group whose members may leave and join between steps, torch.distributed's default group.

    Make one in every rank of a group already formed (:meth:`member`, generation 0: torchrun's group), or in a
    process that joins a running group (:meth:`join`). Once a step, every member calls :meth:`due` (one small
    all-reduce); when it is true, every member calls :meth:`reform`.
    """

    def __init__(self, store: Any, membership: Membership, *, backend: str = "gloo",
                 prefix: str = DEFAULT_PREFIX, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self._store = store
        self.membership = membership
        self._backend = backend
        self._prefix = prefix
        self._timeout = timedelta(seconds=timeout_s)
        self._leaving = False
        self._first_store: Any = None
        # Whether this process was told to stop (its torchrun's SIGTERM): a wait for the new group's members gives
        # up then instead of at the timeout, as the torchrun kills what has not exited 30 s after its SIGTERM.
        self.interrupted: Callable[[], bool] = lambda: False

    # ------------------------------------------------------------------ making one
    @classmethod
    def member(cls, store: Any, *, backend: str | None = None, prefix: str = DEFAULT_PREFIX,
               timeout_s: float = DEFAULT_TIMEOUT_S) -> ElasticGroup:
        """For a rank of the group torch.distributed has formed already (generation 0)."""
        import torch.distributed as dist

        membership = Membership(dist.get_rank(), dist.get_world_size(), 0)
        return cls(store, membership, backend=backend or str(dist.get_backend()), prefix=prefix, timeout_s=timeout_s)

    @classmethod
    def of_default_group(cls, *, prefix: str = DEFAULT_PREFIX, timeout_s: float = DEFAULT_TIMEOUT_S) -> ElasticGroup:
        """For every rank of torch.distributed's default group, formed already (under torchrun: on the agent's
        store, which outlives every rank). A collective: rank 0 picks the generations' namespace, so that a group
        torchrun restarted later never reads this one's keys."""
        import secrets

        import torch
        import torch.distributed as dist
        from torch.distributed import distributed_c10d

        # From the system's randomness, not ``random``'s generator: a script that seeds that one (random.seed(0))
        # would pick the same namespace in every group it forms, and a restarted group would read the old keys.
        namespace = torch.tensor([secrets.randbits(48) if dist.get_rank() == 0 else 0], dtype=torch.int64,
                                 device=collective_device(dist))
        dist.broadcast(namespace, src=0)
        default_store = distributed_c10d._get_default_store()
        group = cls.member(torchrun_store(timeout_s) or default_store, prefix=f"{prefix}/{int(namespace.item())}",
                           timeout_s=timeout_s)
        # Where rank 0 serves the store (torchrun's agent shares none under dlsub), this keeps the server alive
        # once the first group is destroyed: every later generation meets on it.
        group._first_store = default_store
        if group.membership.rank == 0:
            group._add("gen", 0)  # the key a process about to join looks for: this group is there to join
        return group

    @classmethod
    def join(cls, store: Any, *, backend: str = "gloo", prefix: str = DEFAULT_PREFIX,
             timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[ElasticGroup, Change]:
        """Join a running group: ask for a place, wait for the members to make one at their next step, form the new
        group with them and receive the state. Returns the group and the change (``state`` set)."""
        started = time.monotonic()
        group = cls(store, Membership(-1, 0, -1), backend=backend, prefix=prefix, timeout_s=timeout_s)
        deadline = started + timeout_s
        generation = group._add("gen", 0)
        while True:
            ticket = group._add(f"{generation}/joiners", 1)
            plan = group._wait_plan(generation, deadline)
            if ticket <= plan.joiners:
                break
            generation = plan.generation + 1  # this generation was decided before the ticket: the next one
        _failpoint("planned", "joining")
        membership = Membership(len(plan.stay) + ticket - 1, plan.world_size, plan.generation + 1)
        joined_at = time.monotonic()
        group._form(membership)
        state = group._broadcast_state(None)
        group.membership = membership
        return group, Change(False, membership, plan.joiners, 0, state, time.monotonic() - joined_at)

    @property
    def prefix(self) -> str:
        """The group's keys in its store: what a process that joins it needs besides the store."""
        return self._prefix

    @property
    def backend(self) -> str:
        return self._backend

    # ------------------------------------------------------------------ each step
    def waiting(self) -> int:
        """Processes that asked to join this generation, as rank 0 reads the store (0 on every other rank): a
        member's part of :meth:`due` for a caller that makes the step's all-reduce itself."""
        return self._add(f"{self.membership.generation}/joiners", 0) if self.membership.rank == 0 else 0

    def _part(self) -> str:
        return "leaving" if self._leaving else "staying"

    def leave(self) -> None:
        """This process will leave at the next re-formation (the group goes on without it)."""
        self._leaving = True

    def due(self) -> bool:
        """Whether the group changes at this step: a member leaves, or a process waits to join. Every member
        calls it at the same step (one all-reduce of two numbers); rank 0 alone reads the store."""
        import torch
        import torch.distributed as dist

        flags = torch.tensor([int(self._leaving), self.waiting()], dtype=torch.int64, device=collective_device(dist))
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        return bool(flags[0]) or int(flags[1]) > 0

    def reform(self, state: Callable[[], dict[str, Any]] | None = None) -> Change:
        """Re-form the group at this step boundary (every member calls it, after :meth:`due` was true).

        ``state`` makes the state a joining process receives; the new rank 0 calls it, only when one joins.
        Raises :class:`RegroupFailed` on the ranks that stay when the group cannot re-form (they restart from
        a checkpoint of what they hold); a rank that leaves returns, ``left`` true, once the others have formed.
        """

        started = time.monotonic()
        try:
            return self._reform(state, started)
        except Exception as exc:
            _end_default_group()  # what is left of either group: a save's barrier must not wait on it
            if isinstance(exc, RegroupFailed):
                raise
            raise RegroupFailed(f"a member was lost during the re-formation: {exc}") from exc

    def _reform(self, state: Callable[[], dict[str, Any]] | None, started: float) -> Change:
        import torch
        import torch.distributed as dist

        old = self.membership
        leaving = torch.zeros(old.world_size, dtype=torch.int64, device=collective_device(dist))
        leaving[old.rank] = int(self._leaving)
        dist.all_reduce(leaving, op=dist.ReduceOp.SUM)  # every member's wish, on every member
        _failpoint("agreed", self._part())
        stay = tuple(rank for rank, leaves in enumerate(leaving.tolist()) if not leaves)
        if not stay:
            raise RegroupFailed("every member of the group asked to leave: there is no group to re-form")
        deadline = started + self._timeout.total_seconds()
        if old.rank == stay[0]:
            self._add("gen", 1)  # a process that asks to join from here on asks for the next generation
            joiners = self._add(f"{old.generation}/joiners", 0)
            self._store.set(self._key(f"{old.generation}/plan"), _Plan(stay, joiners, old.generation).to_json())
        dist.barrier()  # the plan is written; every member is past the old group's last collective
        dist.destroy_process_group()
        _failpoint("left-the-old-group", self._part())
        plan = self._wait_plan(old.generation, deadline)
        departed = old.world_size - len(stay)
        if old.rank not in stay:
            self._wait_formed(plan.generation + 1, deadline)
            return Change(True, old, plan.joiners, departed, None, time.monotonic() - started)
        membership = Membership(stay.index(old.rank), plan.world_size, plan.generation + 1)
        self._form(membership)
        if plan.joiners:
            self._broadcast_state(state)
        self.membership = membership
        if membership.rank == 0:
            self._store.set(self._key(f"{membership.generation}/formed"), b"1")
        return Change(False, membership, plan.joiners, departed, None, time.monotonic() - started)

    def members_count(self, tag: str) -> int:
        """How many distinct ``tag`` the group's processes hold (each its node's, say: the group's members), a
        collective."""
        import torch.distributed as dist

        tags: list[Any] = [None] * self.membership.world_size
        try:
            dist.all_gather_object(tags, tag)
        except Exception as exc:
            _end_default_group()
            raise RegroupFailed(f"a member was lost just after the re-formation: {exc}") from exc
        return len(set(tags))

    # ------------------------------------------------------------------ the steps
    def _form(self, membership: Membership) -> None:
        import torch.distributed as dist

        self._all_arrive(membership)
        store = dist.PrefixStore(self._key(f"{membership.generation}/pg"), self._store)
        store.set_timeout(self._timeout)  # gloo's connections wait on the store: a member that never comes
        try:
            dist.init_process_group(self._backend, store=store, rank=membership.rank,
                                    world_size=membership.world_size, timeout=self._timeout)
        except Exception as exc:  # the store's and the backend's errors are many
            raise RegroupFailed(f"the new group of {membership.world_size} (generation {membership.generation}) "
                                f"did not form: {exc}") from exc

    def _all_arrive(self, membership: Membership) -> None:
        """Wait until every member of the new group is here to form it, in short sleeps (a signal's handler runs
        between them, where gloo's own wait in init_process_group would hold it off): a member that died after
        the plan (a joining process killed) is given up on at the timeout, or as soon as this one must stop."""
        key = self._key(f"{membership.generation}/arrived")
        deadline = time.monotonic() + self._timeout.total_seconds()
        here, pause = self._store.add(key, 1), 0.001
        while here < membership.world_size:
            if self.interrupted():
                raise RegroupFailed(f"stopped while {here} of {membership.world_size} members of the new group "
                                    "were there")
            if time.monotonic() > deadline:
                raise RegroupFailed(f"{here} of {membership.world_size} members of the new group came within "
                                    "the timeout")
            time.sleep(pause)
            pause = min(pause * 2, 0.01)  # a member that waits for a joiner stands still: poll often
            here = int(self._store.add(key, 0))

    def _broadcast_state(self, state: Callable[[], dict[str, Any]] | None) -> dict[str, Any] | None:
        """Rank 0's state on every member of the new group (the ones that stay ignore it)."""
        import torch
        import torch.distributed as dist

        payload: list[Any] = [state() if state is not None and dist.get_rank() == 0 else None]
        try:
            device = torch.device(collective_device(dist)) if self._backend == "nccl" else None
            dist.broadcast_object_list(payload, src=0, device=device)
        except Exception as exc:
            raise RegroupFailed(f"the state did not reach the processes that joined: {exc}") from exc
        received = payload[0]
        return received if isinstance(received, dict) else None

    def _wait_plan(self, generation: int, deadline: float) -> _Plan:
        key = self._key(f"{generation}/plan")
        self._wait(key, deadline, f"the plan of generation {generation}")
        return _Plan.from_json(self._store.get(key))

    def _wait_formed(self, generation: int, deadline: float) -> None:
        self._wait(self._key(f"{generation}/formed"), deadline, f"the group of generation {generation}")

    def _wait(self, key: str, deadline: float, what: str) -> None:
        left = max(deadline - time.monotonic(), 0.001)
        try:
            self._store.wait([key], timedelta(seconds=left))
        except Exception as exc:  # a timeout, or the store gone
            raise RegroupFailed(f"{what} did not come within the timeout: {exc}") from exc

    def _add(self, name: str, amount: int) -> int:
        return int(self._store.add(self._key(name), amount))

    def _key(self, name: str) -> str:
        return f"{self._prefix}/{name}"


__all__ = ["DEFAULT_TIMEOUT_S", "Change", "ElasticGroup", "Membership", "RegroupFailed"]
