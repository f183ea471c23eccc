"""A group across nodes when one of its nodes stops answering (issue 53 item 2): the others go on without it,
and it does not come back into the group it was dropped from.

torchrun restarts its group when a node joins (its monitor asks the rendezvous how many nodes wait) and when
one of its own processes fails, but not when another node vanishes without a word: a node cut off the network
resets no connection, so the group's processes wait in a collective for a peer that never answers, for the
process group's timeout (30 minutes for gloo by default). torch's c10d rendezvous already drops such a node
from the round (no heartbeat for ``keep_alive_interval`` x ``keep_alive_max_attempt``, 15 s by default); this
module makes the two sides act on it, in the torchrun process that installs it only
(:mod:`dlsub.checkpointing.torchrun_main`):

* **The nodes left**: a member of the round this node formed in that the rendezvous dropped for its silence
  counts, for torchrun's monitor, as a change of membership, as a node waiting to join does: the group
  restarts at once (its processes stopped, a new round with the nodes that answer) and resumes from its
  newest checkpoint. A member that left on its own (a shrink: its processes checkpointed and stopped with
  the group's) removes itself, is not dropped, and restarts nothing.
  Its own processes, which wait in a collective on the silent node and cannot act on torchrun's SIGTERM,
  are killed after :data:`SILENT_PEER_STOP_S` instead of torchrun's 30 s (a checkpoint being written has
  that long to land; an unfinished one is never taken, its rename not done).
* **The node dropped**: once it can reach the rendezvous again (its link back), it finds itself no longer
  a member of the round its group formed in, though it never left: it ends its processes and its torchrun
  (:class:`LeftTheGroup`) instead of joining the others again as a new node while Slurm, which requeued its
  job when its node went down, is about to end it. It leaves the rendezvous open (torchrun's shutdown would
  close it for every node).

* **A node whose processes left in process** (a shrink, issue 52: :meth:`dlsub.checkpointing.Run.regroup_in_process`):
  the others train on in a group re-formed without it, their torchruns unaware. Its torchrun neither waits for
  them at its exit barrier nor closes their rendezvous: it takes this node out of the participants (torch's own
  exit operation, as before a new round), so that the others' torchruns see no member dropped and restart
  nothing, and a node that joins later joins them.

Only torch's own records are read (its dropped nodes, the round's participants); where this torch does not
have them, nothing changes and torchrun behaves as it always has.
"""

from __future__ import annotations

import inspect
import logging
import os
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from dlsub import contract

log = logging.getLogger("dlsub.checkpointing.group_membership")


#: How long the processes of a group whose member went silent get between SIGTERM and SIGKILL when it restarts.
SILENT_PEER_STOP_S = 5
#: How often a node at the exit barrier looks whether the nodes that have not reached it still answer.
EXIT_BARRIER_LOOK_S = 2.0


class LeftTheGroup(RuntimeError):
    """This node was dropped from its group's rendezvous while cut off; the group went on without it."""


def _members_dropped(handler: Any) -> bool:
    """Whether a member of the round this node formed in was dropped for its silence (state just synced)."""
    formed: frozenset[object] = getattr(handler, "_dlsub_formed", frozenset())
    dropped: set[object] = getattr(getattr(handler, "_state_holder", None), "_dlsub_dropped", set())
    return bool(formed & dropped)


def _this_node_dropped(handler: Any) -> bool:
    """Whether this node, a member of a round it has not left, is no longer a participant (state just synced)."""
    formed: frozenset[object] = getattr(handler, "_dlsub_formed", frozenset())
    try:
        return bool(formed) and handler._this_node not in handler._state_holder.state.participants
    except AttributeError:  # not this torch's shape after all: torchrun as it is
        return False


def _synced(handler: Any) -> None:
    with handler._heartbeat_lock:
        handler._state_holder.sync()


def _leave(handler: Any) -> LeftTheGroup:
    handler._dlsub_left = True
    return LeftTheGroup(
        f"this node ({handler._this_node}) was dropped from its group's rendezvous while it could not reach it "
        "(no heartbeat for longer than torch allows); the group went on without it, so its processes end here")


def left_in_process() -> bool:
    """Whether this torchrun's processes left their group in process (a shrink, issue 52): the group goes on
    without this node, its other nodes' torchruns unaware (:data:`contract.left_in_process_marker`)."""
    return contract.left_in_process_marker(Path(tempfile.gettempdir()), os.getpid()).exists()


def _exit_rendezvous(handler: Any) -> None:
    """Take this node out of the rendezvous' participants (torch's exit operation, as before a new round)
    instead of closing it: the others train on in it, and a node that joins later joins it."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    handler._stop_heartbeats()
    try:
        handler._op_executor.run(dr._RendezvousExitOp(), handler._get_deadline(handler._settings.timeout.close))
    except Exception as exc:  # noqa: BLE001 - not this torch's shape, or the store gone: its heartbeat stops
        log.warning("dlsub: could not take this node out of the group's rendezvous (%s); the others drop it "
                    "once its heartbeat is missed", exc)


def install() -> bool:
    """Make torchrun's c10d rendezvous act on nodes it drops (see the module's text); False where this torch's
    rendezvous lacks what it reads, and nothing is changed."""
    try:
        from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
    except ImportError:
        return False
    handler_class, holder_class = dr.DynamicRendezvousHandler, getattr(dr, "_BackendRendezvousStateHolder", None)
    if holder_class is None or not all(
            callable(getattr(c, name, None)) for c, name in (
                (holder_class, "_sanitize"), (handler_class, "next_rendezvous"),
                (handler_class, "num_nodes_waiting"), (handler_class, "shutdown"))):
        return False
    if getattr(handler_class, "_dlsub_membership", False):
        return True

    sanitize: Callable[[Any], None] = holder_class._sanitize

    def _sanitize(self: Any) -> None:
        sanitize(self)
        dead = getattr(self, "_dead_nodes", None) or ()
        if dead:
            self._dlsub_dropped = getattr(self, "_dlsub_dropped", set()) | set(dead)

    next_rendezvous: Callable[[Any], Any] = handler_class.next_rendezvous

    def _next_rendezvous(self: Any) -> Any:
        if getattr(self, "_dlsub_formed", None):
            _synced(self)
            if _this_node_dropped(self):
                raise _leave(self)
        info = next_rendezvous(self)
        with self._heartbeat_lock:
            self._dlsub_formed = frozenset(self._state_holder.state.participants)
            self._state_holder._dlsub_dropped = set()
        return info

    num_nodes_waiting: Callable[[Any], int] = handler_class.num_nodes_waiting

    def _num_nodes_waiting(self: Any) -> int:
        waiting = num_nodes_waiting(self)  # syncs the state (and drops the silent nodes)
        if _this_node_dropped(self):
            raise _leave(self)
        if _members_dropped(self):
            log.warning("dlsub: a node of this group stopped answering and was dropped from its rendezvous: "
                        "restarting the group with the nodes that answer")
            self._dlsub_silent_peer = True  # the restart's stop: _stop_workers below
            return max(waiting, 1)
        return waiting

    shutdown: Callable[[Any], bool] = handler_class.shutdown

    def _shutdown(self: Any) -> bool:
        if getattr(self, "_dlsub_left", False):
            self._stop_heartbeats()  # the rendezvous is the others' now: not closed for them
            return True
        if left_in_process():
            _exit_rendezvous(self)
            return True
        return shutdown(self)

    patches: list[tuple[type, str, object]] = []
    agent_class = _agent_class()
    stop_workers = getattr(agent_class, "_stop_workers", None)
    shutdown_kwargs = _short_shutdown(agent_class)
    if agent_class is not None and callable(stop_workers) and shutdown_kwargs is not None:
        def _stop_workers(self: Any, worker_group: Any, *args: Any, **kwargs: Any) -> Any:
            handler: Any = getattr(getattr(worker_group, "spec", None), "rdzv_handler", None)
            if handler is not None and getattr(handler, "_dlsub_silent_peer", False):
                handler._dlsub_silent_peer = False
                return self._shutdown(**shutdown_kwargs)
            return stop_workers(self, worker_group, *args, **kwargs)

        patches.append((agent_class, "_stop_workers", _stop_workers))
    exit_barrier = _exit_barrier_of_those_answering()
    if agent_class is not None and exit_barrier is not None:
        patches.append((agent_class, "_exit_barrier", exit_barrier))
    # Set on torch's classes, in this process only (setattr: mypy holds methods unassignable).
    for cls, name, value in (*patches, (holder_class, "_sanitize", _sanitize),
                             (handler_class, "next_rendezvous", _next_rendezvous),
                             (handler_class, "num_nodes_waiting", _num_nodes_waiting),
                             (handler_class, "shutdown", _shutdown), (handler_class, "_dlsub_membership", True)):
        setattr(cls, name, value)
    return True


def _answering(handler: Any) -> int | None:
    """How many nodes of this round the rendezvous still counts (it drops those silent too long); None where it
    cannot say (not this torch's shape, or the store is gone)."""
    try:
        _synced(handler)
        return len(handler._state_holder.state.participants)
    except Exception:  # noqa: BLE001 - torch's store errors are many; the barrier then ends, as torch's does
        return None


def _exit_barrier_of_those_answering() -> Callable[[Any], None] | None:
    """The agent's ``_exit_barrier`` (torch's, see the module's text) that ends once every node the rendezvous
    still counts has reached it; None where this torch's barrier is not the one it reads."""
    try:
        from torch.distributed.elastic.agent.server import api
        from torch.distributed.elastic.multiprocessing import SignalException
        from torch.distributed.elastic.utils import store as store_util
        members_key = api._TERMINAL_STATE_SYNC_ID + store_util._NUM_MEMBERS
        check_in: Callable[..., str] = store_util._barrier_nonblocking
    except (ImportError, AttributeError):
        return None

    def _exit_barrier(self: Any) -> None:
        if left_in_process():
            log.info("dlsub: this node's processes left the group in process; the others train on: no exit barrier")
            return
        group, store = self._worker_group, self._store
        handler: Any = getattr(group.spec, "rdzv_handler", None)
        timeout_s = float(self._exit_barrier_timeout)
        self._in_exit_barrier = True
        try:
            # torch's own check-in (its keys: a node running torch's barrier agrees), then the waiting is ours.
            last_key = check_in(store=store, world_size=group.group_world_size, key_prefix=api._TERMINAL_STATE_SYNC_ID)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                try:
                    store.wait([last_key], timedelta(seconds=min(EXIT_BARRIER_LOOK_S, timeout_s)))
                    return
                except SignalException:
                    raise  # torchrun's SIGTERM: as torch's barrier, it ends the agent
                except Exception:  # noqa: BLE001 - a wait's timeout; a lost store is seen just below
                    pass
                reached = store.add(members_key, 0)
                answering = _answering(handler) if handler is not None else None
                if answering is None or answering <= reached:
                    log.warning("dlsub: %d of the %d nodes of this group reached the exit barrier and no other "
                                "answers any more: not waiting for those that never will",
                                reached, group.group_world_size)
                    return
            log.warning("dlsub: the exit barrier timed out after %.0f s", timeout_s)
        except SignalException:
            raise
        except Exception as exc:  # noqa: BLE001 - as torch's: a barrier that fails ends it, the group is done
            log.warning("dlsub: error at the exit barrier (%s); not waiting", exc)
        finally:
            self._in_exit_barrier = False

    return _exit_barrier


def _agent_class() -> type | None:
    try:
        from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    except ImportError:
        return None
    return LocalElasticAgent


def _short_shutdown(agent_class: type | None) -> dict[str, object] | None:
    """The arguments of the agent's ``_shutdown`` that stop its processes with SILENT_PEER_STOP_S of grace and
    nothing else (a restart's stop); None where this torch's ``_shutdown`` does not take them, and then a
    restart stops its processes as torchrun always has."""
    shutdown = getattr(agent_class, "_shutdown", None)
    if shutdown is None:
        return None
    try:
        params = inspect.signature(shutdown).parameters
    except (TypeError, ValueError):
        return None
    if "timeout" not in params:
        return None
    kwargs: dict[str, object] = {"timeout": SILENT_PEER_STOP_S}
    if "is_restart" in params:
        kwargs["is_restart"] = True  # torch versions whose _shutdown also ends the rendezvous unless told
    return kwargs


__all__ = ["EXIT_BARRIER_LOOK_S", "SILENT_PEER_STOP_S", "LeftTheGroup", "install"]
