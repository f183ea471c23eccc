"""When an elastic job grows or shrinks (pure: views in, actions out).

An elastic job (``dlsub --nodes MIN:MAX``) is a main Slurm job of MIN nodes
and a held worker array of MAX - MIN one-node tasks of the same uid and
dlsub id (``role=worker``). The main job keeps its allocation throughout;
the agent changes the job's size only through the workers:

* **Grow**: while the main job runs, is below MAX and nothing waiting can
  use them, idle GPU nodes of its partition are given to it: a held task is
  pointed at that partition and released, starts, and joins the running
  job's rendezvous (torchrun re-forms the group, the training resumes from
  the checkpoint it writes when torchrun stops it).
* **Shrink**: when jobs waiting on the nodes its workers hold need GPUs that
  are not idle, workers leave, newest first (of the newest job first), back towards MIN: each is sent
  MOVE_SIGNAL, the whole group checkpoints, the worker requeues itself held
  (back into the pool) and the rest re-form smaller. A waiting job's
  minimum comes before another job's growth, whatever the policy: growth is
  only ever made of GPUs nobody waits for.
* **End**: once the main job has ended, its workers still in Slurm are
  cancelled (every array of them).

Among elastic jobs that could grow onto the same idle nodes, the
scheduling policy named in policy.toml picks (``fifo``: the oldest first).
A worker that keeps failing (requeued more than ``MAX_WORKER_RESTARTS``
times) is not released again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dlsub.contract import HELD_BY_USER, is_held
from dlsub.policies.actions.kinds import ActionKind
from dlsub.policies.actions.move_views import Action
from dlsub.policies.actions.partition_view import PartitionView
from dlsub.policies.api import ClusterView, IdleNode, JobView, Node
from dlsub.policies.registry import get_policy

#: A worker task requeued this many times (each shrink is one) is left held.
MAX_WORKER_RESTARTS = 25


@dataclass(frozen=True)
class WorkerTask:
    """One task of an elastic job's worker array, as squeue shows it."""

    handle: str  # what scontrol and scancel take: "<array id>_<task id>"
    slurm_job_id: int  # squeue's job_id (the array's own id while tasks are still unsplit)
    state: str  # PENDING, RUNNING, ...
    reason: str  # JobHeldUser while in the pool
    partition: str
    nodes: tuple[str, ...] = ()
    restart_count: int = 0
    start_time: float = 0.0
    leaving: bool = False  # told to leave (MOVE_SIGNAL) and still checkpointing with its group
    gpus: int = 0  # the GPUs Slurm gives the task (its gres); 0: unknown
    # Released by a grow the agent resumes this tick after a crash: on its way, whatever reason Slurm's
    # answer (read before the release) shows.
    released: bool = False

    @property
    def in_pool(self) -> bool:
        return is_held(self.state, self.reason) and self.reason == HELD_BY_USER and not self.released

    @property
    def joining(self) -> bool:
        """Released and on its way (pending, not held), or running."""
        return self.state == "RUNNING" or (self.state == "PENDING" and (
            self.released or not is_held(self.state, self.reason)))

    @property
    def starting(self) -> bool:
        """Released and on its way, not running yet."""
        return self.joining and self.state != "RUNNING"


@dataclass(frozen=True)
class ElasticJob:
    """An elastic job's main Slurm job and its workers."""

    dlsub_id: str
    slurm_job_id: int
    uid: int
    user: str
    state: str  # the main job's Slurm state
    ended: bool  # the main job ended for good
    partition: str
    gpus_per_node: int
    min_members: int
    max_members: int
    submit_time: float
    worker_arrays: tuple[int, ...]  # the job's worker array(s) in Slurm
    workers: tuple[WorkerTask, ...] = ()
    moving: bool = False  # a move or continuation of the main job is in flight
    cpus_per_node: int = 0  # what each of its nodes (so each worker) asks for besides GPUs; 0: unknown
    memory_per_node_mb: int = 0
    worker_gpus: int = 0  # a job elastic in GPUs (--gpus MIN:MAX): each worker's; 0: a whole node's
    main_nodes: tuple[str, ...] = ()  # where the main job runs
    # The kind of GPU its main job's nodes have, where Slurm's GRES names one kind (None: untyped, unknown).
    gpu_type: str | None = None
    # When its main job last started (Slurm's start time, which a job cannot write; 0: unknown).
    start_time: float = 0.0
    # Its main job waits for nodes (pending, not held, for resources or priority): the agent may place it on a
    # kind of GPU (policies.actions.gpu_kind_rules.place_waiting).
    waiting: bool = False
    asked_gpu_type: str | None = None  # the one kind of GPU Slurm's request for its main job names now (None: any)
    user_gpu_type: str | None = None  # the kind its user asked for at submit (None: any): never changed
    pinned: bool = False  # its user named its partition at submit (-p): never placed on another while it waits
    application: str | None = None  # the command it trains, as submit named it (Tags.application)
    # Its training said it finished (its last step is done; the group is on its way out): a grow would only
    # restart the group to train nothing.
    finished: bool = False

    @property
    def members_now(self) -> int:
        """Its members now: the main job's nodes and the workers running or on their way."""
        return self.min_members + sum(1 for w in self.workers if w.joining)

    @property
    def gpus_per_worker(self) -> int:
        return max(1, self.worker_gpus or self.gpus_per_node)

    @property
    def main_gpus(self) -> int:
        return self.min_members * self.gpus_per_node

    def gpus_at(self, members: int) -> int:
        return self.main_gpus + self.gpus_per_worker * (members - self.min_members)

    @property
    def gpus_now(self) -> int:
        return self.gpus_at(self.members_now)

    @property
    def max_gpus(self) -> int:
        return self.gpus_at(self.max_members)

    def packing(self, gpus: int) -> int:
        """GPUs a node holds for it, to place ``gpus`` of them: a node's (whole nodes), else all on one (its
        workers go to its own node first)."""
        return max(1, gpus if self.worker_gpus else self.gpus_per_node)

    def size_text(self, members: int) -> str:
        """Its size at ``members`` members, in what it asked for: "3 GPUs" (``--gpus MIN:MAX``) or "2 node(s)"."""
        if self.worker_gpus:
            gpus = self.gpus_at(members)
            return f"{gpus} GPU{'s' if gpus != 1 else ''}"
        return f"{members} node(s)"

    def own_nodes(self) -> tuple[str, ...]:
        """The nodes it runs on now, the main job's first: a worker placed there keeps the job on few nodes."""
        return (*self.main_nodes, *(n for w in self.workers if w.joining for n in w.nodes))


class Capacity:
    """What a room's idle nodes can still start this tick, worker by worker: GPUs, and CPUs and memory where
    known (a worker released onto a node short of them would only wait). Each job is checked against its
    own per-node request, so one job's large shape never hides a node another job fits."""

    def __init__(self, room: PartitionView, reserve_gpus: int = 0, same_kind: bool = False) -> None:
        # same_kind: a job's workers go only to nodes of its own GPU kind (where it and they have one), so that
        # a group sized on one kind is never spread over two (the agent's sizing across GPU kinds).
        self.same_kind = same_kind
        self.nodes: dict[str, IdleNode] = {n.name: n for n in room.nodes}
        # Jobs waiting there keep first claim on idle GPUs: those that ask for a kind, on nodes of that kind;
        # the rest, those of the first nodes.
        typed = dict(room.waiting_by_kind)
        for node in room.nodes:
            claim = min(reserve_gpus, node.gpus, typed.get(node.gpu_type or "", 0))
            if claim > 0:
                self.nodes[node.name] = node.less(claim)
                typed[node.gpu_type or ""] -= claim
                reserve_gpus -= claim
        reserve_gpus -= min(reserve_gpus, sum(typed.values()))  # what no node of its kind has idle for them
        for name, node in self.nodes.items():
            claim = min(reserve_gpus, node.gpus)
            self.nodes[name] = node.less(claim)
            reserve_gpus -= claim

    def _fits(self, node: IdleNode, job: ElasticJob) -> bool:
        if self.same_kind and job.gpu_type is not None and node.gpu_type != job.gpu_type:
            return False
        return node.fits(job.gpus_per_worker, job.cpus_per_node, job.memory_per_node_mb)

    def _candidates(self, job: ElasticJob) -> list[str]:
        """Where a worker of ``job`` may go, best first: the nodes the job already runs on (fewer nodes per
        job, as Pollux places), then the node with the most idle GPUs (where its next workers fit too)."""
        own = [n for n in dict.fromkeys(job.own_nodes()) if n in self.nodes]
        rest = sorted((n for n in self.nodes if n not in own), key=lambda n: -self.nodes[n].gpus)
        return [n for n in (*own, *rest) if self._fits(self.nodes[n], job)]

    def count(self, job: ElasticJob) -> int:
        """How many of ``job``'s workers the idle GPUs could start (several on one node when they fit)."""
        saved = dict(self.nodes)
        try:
            taken = 0
            while taken < job.max_members and self.take(job) is not None:
                taken += 1
            return taken
        finally:
            self.nodes = saved

    def take(self, job: ElasticJob, prefer: str | None = None) -> str | None:
        """A node for one worker of ``job`` (its resources then counted as used), or None: ``prefer`` when
        the worker fits there, else the best candidate."""
        if prefer is not None and prefer in self.nodes and self._fits(self.nodes[prefer], job):
            name = prefer
        else:
            candidates = self._candidates(job)
            if not candidates:
                return None
            name = candidates[0]
        self.nodes[name] = self.nodes[name].less(job.gpus_per_worker, job.cpus_per_node, job.memory_per_node_mb)
        return name

    def why_there(self, job: ElasticJob, node: str) -> str:
        """Why a worker of ``job`` goes to ``node`` (for the resize's reason)."""
        if node in job.own_nodes():
            return f"{node}, a node the job already runs on, has {job.gpus_per_worker} idle GPU(s) for it"
        if job.own_nodes():
            return (f"{node} has the most idle GPUs ({self.nodes[node].gpus + job.gpus_per_worker}) and none "
                    f"of the job's nodes ({','.join(dict.fromkeys(job.own_nodes()))}) has {job.gpus_per_worker}")
        return f"{node} has {job.gpus_per_worker} idle GPU(s) for it"


@dataclass(frozen=True)
class Resize:
    kind: ActionKind  # GROW | SHRINK | END_WORKERS
    dlsub_id: str
    slurm_job_id: int  # the main job
    reason: str
    worker: str | None = None  # GROW, SHRINK: the worker task's handle ("<array id>_<task id>")
    partition: str | None = None
    # For a job that lets dlsub choose its batch: the global batch at the new size, and its micro-steps
    # per optimiser step there (told to the job before the resize; it reads them when it restarts).
    batch_size: int | None = None
    accumulation_steps: int | None = None
    # GROW: the node the worker is pointed at (Slurm's ReqNodeList) before its release; None: where Slurm likes.
    node: str | None = None
    array: int | None = None  # END_WORKERS: the worker array to cancel


def _staying(job: ElasticJob) -> list[WorkerTask]:
    """The job's running workers not yet told to leave, newest first (the order they leave in)."""
    return sorted((w for w in job.workers if w.state == "RUNNING" and not w.leaving), key=lambda w: -w.start_time)


def _freed_by_leaving(jobs: Sequence[ElasticJob]) -> dict[str, int]:
    """GPUs per node that workers already leaving will give back."""
    freed: dict[str, int] = {}
    for job in jobs:
        for worker in job.workers:
            if worker.leaving:
                for node in worker.nodes:
                    freed[node] = freed.get(node, 0) + job.gpus_per_worker
    return freed


def _held_by_workers(jobs: Sequence[ElasticJob]) -> dict[str, int]:
    """GPUs per node that the staying workers of all these jobs hold: what the node would have back if they
    all left. Counted over every job, not one: two jobs' 1-GPU workers on one node together free the 2 GPUs
    a waiting job needs there, which neither frees alone."""
    held: dict[str, int] = {}
    for job in jobs:
        for worker in _staying(job):
            for node in worker.nodes:
                held[node] = held.get(node, 0) + job.gpus_per_worker
    return held


def _shrinks(job: ElasticJob, rooms: dict[str, PartitionView], freed: dict[str, int],
             held: dict[str, int]) -> list[Resize]:
    """Workers to send away because jobs wait for the GPUs they hold.

    ``freed`` (GPUs per node, shared by every job this tick) holds what
    workers already leaving will give back, so one waiting job never sends
    away more workers than it needs, of this job or of any other; ``held``
    (also shared) what the workers still staying hold, of every job.
    """
    out: list[Resize] = []
    each = job.gpus_per_worker
    for worker in _staying(job):
        for room in rooms.values():
            idle = {n.name: n.gpus for n in room.nodes}
            kinds = {n.name: n.gpu_type for n in room.nodes}
            # Only a node that the waiting jobs could then use is worth freeing: one with room for the most
            # one of them wants on a node, whose kind of GPU one of them waits for and its idle GPUs lack.
            helps = any(n in idle and idle[n] + freed.get(n, 0) + held.get(n, 0) >= room.waiting_per_node
                        and room.short_for(kinds[n], freed) for n in worker.nodes)
            if helps:
                for node in worker.nodes:
                    freed[node] = freed.get(node, 0) + each
                    held[node] -= each
                out.append(Resize(ActionKind.SHRINK, job.dlsub_id, job.slurm_job_id, worker=worker.handle, reason=(
                    f"shrinking to {job.size_text(job.members_now - len(out) - 1)}: jobs waiting on {room.name} "
                    f"need {room.waiting_gpus} GPU(s) and {room.idle_gpus} are idle; the worker on "
                    f"{','.join(worker.nodes)} ({each} GPU(s)) checkpoints with the group and goes back to the "
                    f"held pool")))
                break
    return out


def usable_worker(worker: WorkerTask, job: ElasticJob) -> bool:
    """A held task of the pool that may be released, and not one that keeps failing. One on another partition
    than its main job's (the agent placed the main job on another model's partition while it waited) is
    pointed at the main job's as it is released: a worker runs where its main job runs."""
    return worker.in_pool and worker.restart_count <= MAX_WORKER_RESTARTS


@dataclass(frozen=True)
class Placed:
    """A held worker to release, the idle node it is pointed at, and why there."""

    worker: WorkerTask
    node: str
    why: str


def take_workers(job: ElasticJob, capacity: Capacity, want: int, spots: Sequence[str] = ()) -> list[Placed]:
    """Up to ``want`` of the job's held workers that may be released (by handle), each with the idle node
    it is to start on (then counted as used), until the idle GPUs can hold no more of them. ``spots``: the
    nodes a policy placed them on, in order (each taken when the worker fits there now). Every grow,
    whichever policy sizes the job, takes its workers here."""
    pool = sorted((w for w in job.workers if usable_worker(w, job)), key=lambda w: w.handle)
    taken: list[Placed] = []
    while pool and len(taken) < want:
        spot = spots[len(taken)] if len(taken) < len(spots) else None
        node = capacity.take(job, prefer=spot)
        if node is None:
            break
        why = capacity.why_there(job, node)
        if spot is not None:
            why = f"placed by the policy on {node}: {why}" if node == spot else (
                f"the policy placed it on {spot}, where it does not fit now; {why}")
        taken.append(Placed(pool.pop(0), node, why))
    return taken


@dataclass(frozen=True)
class Sized:
    """What an elastic policy decided for one partition's elastic jobs: their resizes, and (where it sizes them
    across GPU kinds) the jobs it moves to another kind."""

    resizes: tuple[Resize, ...] = ()
    moves: tuple[Action, ...] = ()


#: Sizes the elastic jobs of one partition by an elastic policy (see dlsub.policies.actions.goodput_resize_rules).
SizeByPolicy = Callable[[Sequence[ElasticJob], PartitionView], Sized]


def plan_resizes(jobs: Sequence[ElasticJob], rooms: Sequence[PartitionView], policy: str = "fifo") -> list[Resize]:
    """Every resize this tick where the policy named only orders growth (see :func:`plan_elastic`)."""
    return list(plan_elastic(jobs, rooms, policy).resizes)


def plan_elastic(jobs: Sequence[ElasticJob], rooms: Sequence[PartitionView], policy: str = "fifo",
                 size_by_policy: SizeByPolicy | None = None) -> Sized:
    """Every resize this tick: endings, then shrinks, then growth onto what is left idle.

    With ``size_by_policy`` (an elastic policy such as ``goodput``, on the jobs' measured throughput),
    that decides the sizes of the jobs no waiting job shrinks this tick, partition by partition (and the
    moves between GPU kinds it makes); otherwise the policy named only orders the jobs that could grow onto
    idle nodes.
    """
    by_name = {r.name: r for r in rooms}
    actions: list[Resize] = []
    for job in jobs:
        if not job.ended:
            continue
        for array in job.worker_arrays:
            if any(w.state in ("PENDING", "RUNNING") and w.handle.startswith(f"{array}_") for w in job.workers):
                actions.append(Resize(ActionKind.END_WORKERS, job.dlsub_id, job.slurm_job_id, array=array,
                                      reason=f"the job ended ({job.state}): cancelling its worker tasks"))
    live = [j for j in jobs if j.state == "RUNNING" and not j.ended and not j.moving]
    shrinking: set[str] = set()
    freed = _freed_by_leaving(live)
    held = _held_by_workers(live)
    # The newest job gives a node back first (as efifo does in the simulator): the older ones keep theirs.
    for job in sorted(live, key=lambda j: (-j.submit_time, -j.slurm_job_id)):
        for action in _shrinks(job, by_name, freed, held):
            actions.append(action)
            shrinking.add(job.dlsub_id)
    # Growth: idle nodes nobody waits for, per partition, to the jobs the policy picks.
    growers = [j for j in live if j.dlsub_id not in shrinking and j.members_now < j.max_members and not j.finished
               and any(usable_worker(w, j) for w in j.workers)]
    by_partition: dict[str, list[ElasticJob]] = {}
    for job in growers:
        by_partition.setdefault(job.partition, []).append(job)
    if size_by_policy is not None:
        sizable: dict[str, list[ElasticJob]] = {}
        for job in live:
            if job.dlsub_id not in shrinking:
                sizable.setdefault(job.partition, []).append(job)
        moves: list[Action] = []
        for name, group in sorted(sizable.items()):
            room = by_name.get(name)
            if room is not None and not room.short_of_gpus():
                sized = size_by_policy(group, room)
                actions.extend(sized.resizes)
                moves.extend(sized.moves)
        return Sized(tuple(actions), tuple(moves))
    for name, group in by_partition.items():
        room = by_name.get(name)
        if room is None or room.waiting_gpus >= room.idle_gpus or room.short_of_gpus():
            continue
        capacity = Capacity(room, reserve_gpus=room.waiting_gpus)
        free = [Node(n, idle.gpus, partition=name) for n, idle in capacity.nodes.items()
                if any(capacity._fits(idle, j) for j in group)]
        if not free:
            continue
        views = [JobView(name=j.dlsub_id, arrival_s=j.submit_time, gpus=j.max_gpus - j.gpus_now) for j in group]
        decision = get_policy(policy).decide(views, ClusterView(tuple(free)), 0.0, {})
        order = sorted(group, key=lambda j: (-(decision[j.dlsub_id].gpus if j.dlsub_id in decision else 0),
                                             j.submit_time, j.slurm_job_id))
        for job in order:
            for size, placed in enumerate(take_workers(job, capacity, job.max_members - job.members_now),
                                          start=job.members_now + 1):
                actions.append(Resize(ActionKind.GROW, job.dlsub_id, job.slurm_job_id, worker=placed.worker.handle,
                                      partition=name, node=placed.node, reason=(
                                          f"growing to {job.size_text(size)}: {placed.why} (partition {name}; "
                                          f"no waiting job can use them); released worker "
                                          f"{placed.worker.handle} there to join the group")))
    return Sized(tuple(actions))
