"""The training script's side of dlsub: ``run = checkpointing.init()``.

A :class:`Run` knows the job directory (``$DLSUB_JOB_DIR``, or a local
``./dlsub-run`` off-cluster), saves and restores checkpoints, appends
progress events, and turns SIGUSR1/SIGTERM into ``should_stop()``. Signal
handlers are installed by :func:`init`, never at import, and only set a flag.
"""

from __future__ import annotations

import gc
import json
import math
import os
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from dlsub import contract
from dlsub.checkpointing import fence, regroup_join
from dlsub.checkpointing.batch import BATCH_SIZE_ENV, BatchChoice, BatchSizes, asked_batch, env_batch_size, split
from dlsub.checkpointing.regroup import Change, ElasticGroup, RegroupFailed
from dlsub.checkpointing.run_support import (
    LOSS_WINDOW,
    TARGET_LOSS_ENV,
    Profile,
    application,
    as_step,
    barrier,
    collectives,
    cuda_peak_mb,
    end_process_group_at_exit,
    env_float,
    from_rank0,
    initialized_dist,
    non_negative,
    peak_rss_mb,
)
from dlsub.checkpointing.storage import (
    checkpoint_files,
    checkpoint_meta,
    checkpoint_path,
    checkpoint_seq,
    checkpoint_step,
    load_verified,
    restore_latest,
    save_checkpoint,
)
from dlsub.contract import CHECKPOINT_DIR, PROGRESS_FILE, RESUME_EXIT_CODE


def attempt_key() -> str:
    """Which Slurm attempt this is: ``<SLURM_JOB_ID>-<restart count>``, or ``local``.

    In a gang every node shares the main job's attempt (``DLSUB_ATTEMPT``,
    set by the batch script), worker array tasks included.
    """
    shared = os.environ.get(contract.ENV_ATTEMPT, "")
    if shared and len(shared) <= 64 and all(c.isdigit() or c == "-" for c in shared):
        return shared
    job = os.environ.get("SLURM_JOB_ID")
    return f"{job}-{os.environ.get('SLURM_RESTART_COUNT', '0')}" if job else "local"


def resume_marker(job_dir: Path, key: str | None = None) -> Path:
    """File whose presence tells the launcher that this attempt asked to be resumed."""
    return contract.resume_marker(job_dir, key or attempt_key())


#: How much of the progress file's end is read for an attempt's "finished" record (it is the last one written).
FINISHED_TAIL_BYTES = 1 << 20


def finished_in(job_dir: Path, attempt: str) -> bool:
    """Whether the progress file holds ``attempt``'s "finished" record: its group's rank 0 completed the training.

    Read as JSON, record by record, from the file's last MiB: the training writes it (any spacing, any junk line),
    so it is never grepped.
    """
    try:
        with open(job_dir / PROGRESS_FILE, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - FINISHED_TAIL_BYTES))
            lines = f.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return False
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == contract.EVENT_FINISHED \
                and record.get("attempt") == attempt:
            return True
    return False


#: How often a loop that never calls ``report()`` has its steps recorded for it (seconds): a step is one call of
#: ``should_stop()``, which the loop makes once a step. What the agent knows of such a job's progress (how long
#: it has run, at what rate) comes from these.
COUNTED_REPORT_S = 5.0

#: A stop reason: another member's torchrun stopped its processes (SIGTERM), which it does to restart the
#: group when a member joins. This process's own torchrun restarts it as well once it sees the member.
STOP_PEER_RESTART = "peer-restart"
#: A stop reason: this process left its group in process (a shrink; :meth:`Run.regroup_in_process`), and the
#: others went on without it. Its save writes nothing (rank 0 stays), and its exit ends it.
STOP_LEFT = "left"
#: A stop reason: the group could not re-form in process; every process checkpoints and the group restarts.
STOP_REGROUP_FAILED = "regroup-failed"
#: How long a process stopped by a peer's restart waits for its own torchrun's SIGTERM before it leaves.
OWN_RESTART_WAIT_S = 15.0
#: The stop signals this process took (any run's handler): a training process torchrun forked and then stopped
#: with SIGTERM leaves as soon as it has ended, since torchrun no longer reads what it returns
#: (:mod:`dlsub.checkpointing.forked_rank`).
STOP_SIGNALS_TAKEN: set[int] = set()


class Run:
    """One training run's handle. Use :func:`init` to make one."""

    def __init__(
        self,
        job_dir: Path,
        *,
        keep: int = 3,
        total_steps: int | None = None,
        total_epochs: int | None = None,
        target_loss: float | None = None,
        steps_per_epoch: int | None = None,
        batch_sizes: BatchSizes | None = None,
    ) -> None:
        self.job_dir = job_dir
        self.checkpoint_dir = job_dir / CHECKPOINT_DIR
        self.keep = keep
        self.total_steps = total_steps
        self.total_epochs = total_epochs
        #: This process's rank and the group's size at this (re)start: torchrun
        #: sets them, and an elastic job's change whenever it is resized.
        self.rank = int(os.environ.get("RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        #: Processes of this member of the group (torchrun's LOCAL_WORLD_SIZE): one per GPU it holds, so
        #: the members of a job elastic in GPUs (``--gpus 1:4``) may differ.
        self.local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        #: Members in the group now (torchrun's GROUP_WORLD_SIZE; 1 off-cluster): its nodes, or the main job
        #: and the workers of an elastic job, which may share a node.
        self.nodes = int(os.environ.get("GROUP_WORLD_SIZE", "1"))
        #: "trainer", or "cpu" in a heterogeneous job's CPU component (``dlsub --cpu-nodes N``):
        #: the same script runs there, once per node, beside the GPU trainers.
        self.role = os.environ.get(contract.ENV_ROLE) or contract.ROLE_TRAINER
        #: A heterogeneous job's parts: the trainers' and the CPU component's nodes.
        self.trainer_nodes = _hostlist(contract.ENV_TRAINER_NODES)
        self.cpu_nodes = _hostlist(contract.ENV_CPU_NODES)
        self._resized: bool | None = None
        self.stop_reason: str | None = None
        self._seq = 0
        # The training step a save() without one is recorded at: the last
        # report()'s, a save(step=)'s or the restored checkpoint's.
        self._last_step: int | None = None
        self._previous_handlers: dict[int, Any] = {}
        self.restored_from: Path | None = None
        self.target_loss = target_loss if target_loss is not None else env_float(TARGET_LOSS_ENV)
        self._steps_per_epoch = steps_per_epoch
        self._profile = Profile.from_env()
        self._recent_losses: list[float] = []
        #: What the script declared about its batch size (``init(batch_size=)``); None: it keeps its own.
        self.batch_sizes = batch_sizes
        self._batch: BatchChoice | None = None
        self._sharded: Any = None  # sharded.Sharded, made at the first sharded save or restore
        # Calls of should_stop() in this process. A loop that never calls report() has its steps counted by
        # them (each call ends a step), recorded every COUNTED_REPORT_S; a framework adapter counts its own.
        self._polls = 0
        self._counts_steps = True
        self._saves_declared = False  # init(saves_on_request=True): its start event said so already
        self._counted_at = 0.0
        # In-process re-formation (regroup_in_process): the group, what a joining process gets, the script's hook.
        self._elastic: ElasticGroup | None = None
        self._regroup_state: Callable[[], dict[str, Any]] | None = None
        self._on_regroup: Callable[[Change], None] | None = None
        self._leave_asked = False
        self._left = False  # it left its group in process: its old rank 0 is another process's now
        #: When this process made its run (a re-formation's event says it: the process went on, never restarted).
        self.process_started = time.time()

    # ------------------------------------------------------------------ identity
    @property
    def is_main(self) -> bool:
        """Rank 0 of the trainers: the one process that writes checkpoints and progress. Never one that left
        its group in process: torchrun may have made the leaving node's first process rank 0."""
        return self.rank == 0 and self.role == contract.ROLE_TRAINER and not self._left

    @property
    def resized(self) -> bool:
        """True on the first start after a resize: the checkpoint this run resumes
        from was written by a group of another size.

        Keep the *global* batch fixed across sizes by accumulating gradients
        (``accumulation = global_batch // (per_process_batch * world_size)``
        steps per optimizer step), or scale it (and the learning rate) with
        ``world_size``, or let dlsub choose it (``init(batch_size=BatchSizes(...))``:
        :attr:`batch_size`, :attr:`accumulation_steps`); either way index the
        data by samples seen, not by batches, so a resumed run continues at
        the right sample. Every rank
        gets the same answer (they read the same checkpoint).
        """
        if self._resized is None:
            path = self.restored_from
            if path is None:
                files = checkpoint_files(self.checkpoint_dir)
                path = files[0][1] if files else None
            before = checkpoint_meta(path).get("world_size") if path is not None else None
            if path is None and self.checkpoint_dir.is_dir() and "torch" in sys.modules:
                from dlsub.checkpointing.sharded import newest_world_size

                before = newest_world_size(self.checkpoint_dir)
            self._resized = isinstance(before, int) and before != self.world_size
        return self._resized

    # ------------------------------------------------------------------ signals
    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        # Only set a flag: the training loop checks should_stop() between steps.
        STOP_SIGNALS_TAKEN.add(signum)
        self.stop_reason = signal.Signals(signum).name

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGUSR1, signal.SIGTERM):
            self._previous_handlers[sig] = signal.signal(sig, self._on_signal)

    def uninstall_signal_handlers(self) -> None:
        for sig, handler in self._previous_handlers.items():
            signal.signal(sig, handler)
        self._previous_handlers.clear()

    def _on_leave(self, _signum: int, _frame: FrameType | None) -> None:
        self._leave_asked = True  # only a flag, as _on_signal: should_stop() acts on it between steps

    def regroup_in_process(self, state: Callable[[], dict[str, Any]],
                           on_change: Callable[[Change], None] | None = None) -> bool:
        """Let the group grow and shrink without a restart (issue 52): when dlsub takes a member away (a worker of
        an elastic job), its processes leave at the next :meth:`should_stop` and the others carry on at once,
        from memory, in a group re-formed without them; no checkpoint, no new processes.

        Every rank calls it once, after ``init_process_group`` (it is a collective). ``state`` returns what a
        process that joins would need (the same dict as for :meth:`save`); ``on_change(change)`` runs on the
        ranks that stay after each re-formation, where the script wraps its model again (DDP holds the old
        group) and takes its share of the batch for the new size (:attr:`rank`, :attr:`world_size`,
        ``change.membership``). On a rank that leaves, :meth:`should_stop` is true with :data:`STOP_LEFT`: its
        save writes nothing and :meth:`exit_for_resume` ends it. Should the re-formation fail, every rank's
        :meth:`should_stop` is true with :data:`STOP_REGROUP_FAILED` and the documented save and exit restart the
        group from that checkpoint, as without this call. Returns False (nothing changes) where
        torch.distributed is not set up.

        A worker that starts once rank 0 has made this call joins without a restart too
        (:mod:`dlsub.checkpointing.regroup_join`): its processes get ``state()`` from rank 0's memory (their
        :meth:`restore` returns it), and the ranks that stay call ``on_change`` as for a shrink.
        """
        if initialized_dist() is None:
            return False
        joined = regroup_join.joined()  # a worker's process that joined before its script ran: its group
        self._elastic = joined if joined is not None else ElasticGroup.of_default_group()
        self._elastic.interrupted = lambda: signal.SIGTERM in STOP_SIGNALS_TAKEN
        attempt = os.environ.get(contract.ENV_ATTEMPT)
        if self.is_main and attempt:  # where workers that start from now on join, without a restart
            regroup_join.publish(self.job_dir, attempt, self._elastic)
        self._regroup_state, self._on_regroup = state, on_change
        if self._previous_handlers:  # init(handle_signals=True): the leave request is a signal too
            self._previous_handlers[signal.SIGUSR2] = signal.signal(signal.SIGUSR2, self._on_leave)
        return True

    def request_stop(self, reason: str = "requested") -> None:
        self.stop_reason = reason

    def should_stop(self) -> bool:
        """True once a stop was requested (SIGUSR1 before the time limit, SIGTERM, ...).

        Under torch.distributed (or Horovod) every rank gets the same answer (a one-element
        all-reduce), so all ranks leave the loop at the same step. A rank
        stopped by another's request gets the reason ``"peer"``, or
        :data:`STOP_PEER_RESTART` when that request was torchrun's SIGTERM.

        The first call records that the loop listens (:data:`contract.EVENT_POLLS`: the agent takes it as saving
        whenever asked). In a loop that never calls :meth:`report`, each call counts a step: the step a
        checkpoint is recorded at, and a progress event every :data:`COUNTED_REPORT_S` seconds.
        """
        self._poll()
        local = self.stop_reason is not None
        group = collectives()
        if group is None:
            return local
        # 2: torchrun's own SIGTERM (the launcher turns every other stop into SIGUSR1); 1: any other request.
        # On the backend's device: a CPU tensor fails under NCCL (Lightning's and the Trainer's DDP on GPUs).
        asked = (2 if self.stop_reason == "SIGTERM" else 1) if local else 0
        if self._elastic is not None:
            flag, leave, waiting = group.max_each([asked, int(self._leave_asked), self._elastic.waiting()])
            if (leave or waiting) and not flag:  # a member leaves or one joins, and nobody stops: in process
                return self._regroup()
        else:
            flag = group.max(asked)
        # A signal that came during the all-reduce (its handler runs once the call returns) is this process's
        # own reason: taken for a peer's, torchrun's SIGTERM, already here, was then awaited for
        # OWN_RESTART_WAIT_S (a grow across nodes stood still 15 s in 3 of 22 samples).
        if flag and self.stop_reason is None:
            self.stop_reason = STOP_PEER_RESTART if flag == 2 else "peer"
        return bool(flag)

    def _regroup(self) -> bool:
        """Re-form the group without the members that asked to leave (every rank, at the same step); what
        should_stop() answers: true only on those that left, or on every rank where it failed."""
        assert self._elastic is not None
        if self._leave_asked:
            self._elastic.leave()
        try:
            change = self._elastic.reform(self._state_to_send)
            nodes = self._elastic.members_count(regroup_join.member_tag()) if not change.left else 0
        except RegroupFailed as exc:
            print(f"dlsub: the group could not re-form in process ({exc}); checkpointing for a restart",
                  file=sys.stderr, flush=True)
            self._elastic, self.stop_reason = None, STOP_REGROUP_FAILED
            return True
        if change.left:
            self._elastic, self.stop_reason, self._left = None, STOP_LEFT, True
            if os.environ.get("TORCHELASTIC_RUN_ID"):  # its torchrun takes this node out of the group's rendezvous
                contract.left_in_process_marker(Path(tempfile.gettempdir()), os.getppid()).touch()
            return True
        self.rank, self.world_size = change.membership.rank, change.membership.world_size
        os.environ.update(RANK=str(self.rank), WORLD_SIZE=str(self.world_size))
        self.nodes = nodes
        os.environ["GROUP_WORLD_SIZE"] = str(self.nodes)
        wrapped = time.monotonic()
        if self._on_regroup is not None:
            self._on_regroup(change)
        # Stood still: the re-formation and the script's own part (its model's wrap, which for a grow waits for the
        # joining processes to reach theirs).
        paused_s = change.paused_s + time.monotonic() - wrapped
        self._event(contract.EVENT_REGROUPED, world_size=self.world_size, nodes=self.nodes, pid=os.getpid(),
                    process_started=round(self.process_started, 3), paused_s=round(paused_s, 3),
                    left=change.departed, joined=change.joined)
        return False

    def _state_to_send(self) -> dict[str, Any]:
        """What a process that joins gets: the script's state, and where this run's count of steps and saves is
        (its :meth:`restore` takes both)."""
        assert self._regroup_state is not None
        return {"state": self._regroup_state(), "dlsub": {"step": self._last_step, "seq": self._seq}}

    def _poll(self) -> None:
        self._polls += 1
        now = time.monotonic()
        if self._polls == 1:
            self._counted_at = now
            if not self._saves_declared:
                self._event(contract.EVENT_POLLS)
        if not self._counts_steps:
            return
        # Steps done: counted on from the restored checkpoint's (or a save(step=)'s).
        self._last_step = (self._last_step or 0) + 1
        if now - self._counted_at >= COUNTED_REPORT_S:
            self._counted_at = now
            self._event(contract.EVENT_PROGRESS, step=self._last_step, counted=contract.COUNTED,
                        **self._count_fields())

    def _count_fields(self) -> dict[str, Any]:
        return {k: v for k, v in (("total_steps", self.total_steps), ("total_epochs", self.total_epochs))
                if v is not None}

    # ------------------------------------------------------------------ checkpoints
    def save(self, state: dict[str, Any], step: int | None = None) -> Path | None:
        """Checkpoint ``state`` (rank 0 writes; other ranks wait for it). Returns the path on rank 0.

        The checkpoint event records an integer ``step``: ``step`` when given,
        else the last :meth:`report`'s step (or the restored checkpoint's),
        else the checkpoint's sequence number; and always ``seq``.
        """
        if not isinstance(state, dict):
            raise TypeError(f"run.save() takes a dict of state, not {type(state).__name__}")
        given = as_step(step)
        if step is not None and given is None:
            raise TypeError(f"run.save(step=...) takes an integer step, not {step!r}")
        # File names follow the sequence: a given step names the file when it
        # moves forward, so checkpoints stay in order whatever the steps do.
        seq = given if given is not None and given > self._seq else self._seq + 1
        self._seq = seq
        if given is not None:
            self._last_step = given
        known = self._last_step  # None: no step was ever given; the sequence stands in
        recorded = known if known is not None else seq
        path = None
        if self.is_main:
            path = save_checkpoint(self.checkpoint_dir, seq, state, self.keep, step=known,
                                   meta={"world_size": self.world_size})
            # Past every checkpoint on disk (an older attempt's too): the number the file was given.
            seq = self._seq = checkpoint_seq(path)
            if known is None:
                recorded = seq
            self._event(contract.EVENT_CHECKPOINT, step=recorded, path=str(path), seq=seq)
        barrier()
        return path

    def restore(self, map_location: Any = "cpu") -> dict[str, Any] | None:
        """The newest checkpoint that verifies (falling back past corrupt ones), or None; the same one on
        every rank. Every rank calls it. In a worker's process that joined a running group in process
        (:meth:`regroup_in_process`), the state rank 0 sent it instead: no file is read, no collective made.

        With torch.distributed (or Horovod) set up, rank 0 picks it and tells the others which (one broadcast), and no
        rank returns before every rank has read it. Picked by each rank alone, a rank that starts late
        could read a checkpoint rank 0 saved after it restored (at an epoch's end that is at once), and
        the group would train from two states and hang in mismatched collectives: seen live when a
        worker node's ranks joined a grown group later than the main node's.
        """
        received = regroup_join.take_state()
        if received is not None:  # it joined a running group: rank 0's state from memory, no checkpoint read
            counts = received.get("dlsub") or {}
            self._last_step, self._seq = counts.get("step"), max(self._seq, int(counts.get("seq") or 0))
            self._resized = True
            state: dict[str, Any] | None = received.get("state")
            return state
        group = collectives()
        picks = group is None or group.rank == 0
        state, path, skipped = restore_latest(self.checkpoint_dir, map_location) if picks else (None, None, [])
        if group is not None:
            (chosen,) = group.from_rank0([checkpoint_seq(path) if path is not None else -1])
            if not picks and chosen >= 0:
                path = checkpoint_path(self.checkpoint_dir, chosen)
                state = load_verified(path, map_location)  # rank 0 verified it: failing here is not silent
            group.barrier()  # nobody saves (and prunes) before all have read it
        for reason in skipped:
            print(f"dlsub: skipped checkpoint: {reason}", file=sys.stderr, flush=True)
        if path is not None:
            self.restored_from = path
            self._resized = None  # from the checkpoint actually restored
            seq = checkpoint_seq(path)
            self._seq = max(self._seq, seq)
            # None when the checkpoint was saved with no step known (or by an older dlsub).
            self._last_step = checkpoint_step(path)
            step = self._last_step if self._last_step is not None else seq
            self._event(contract.EVENT_RESTORE, path=str(path), skipped=len(skipped), step=step, seq=seq)
        return state

    # ------------------------------------------------------------------ sharded checkpoints (DCP)
    def _shards(self) -> Any:
        if self._sharded is None:
            from dlsub.checkpointing.sharded import Sharded

            self._sharded = Sharded(self)
        return self._sharded

    def save_sharded(self, state: dict[str, Any], step: int | None = None, *, asynchronous: bool = False) -> Path:
        """Checkpoint ``state`` with ``torch.distributed.checkpoint``: every rank calls it and writes its own
        shards (FSDP2 / DTensor state dicts; ``sharded.ModelState(model, optimizer)`` for a model and its
        optimizer). Returns the checkpoint's folder (the same on every rank).

        ``asynchronous=True`` returns once the state is copied to CPU memory and writes it in a thread: the
        checkpoint counts once written (the next save, :meth:`restore_sharded` and :meth:`finish` wait for
        it; :meth:`wait_for_checkpoint` does so explicitly). Save synchronously before
        :meth:`exit_for_resume` (a synchronous save waits for the one in flight first). ``step`` as in
        :meth:`save`.
        """
        if not isinstance(state, dict):
            raise TypeError(f"run.save_sharded() takes a dict of state, not {type(state).__name__}")
        given = as_step(step)
        if step is not None and given is None:
            raise TypeError(f"run.save_sharded(step=...) takes an integer step, not {step!r}")
        path: Path = self._shards().save(state, given, asynchronous)
        return path

    def restore_sharded(self, state: dict[str, Any]) -> bool:
        """Load the newest sharded checkpoint that verifies into ``state`` in place (DCP reshards to the
        tensors' layout now: another world size after a resize is fine); False when there is none. The same
        checkpoint on every rank: every rank calls it, rank 0 picks."""
        return self._shards().restore(state) is not None

    def wait_for_checkpoint(self) -> None:
        """Until an asynchronous :meth:`save_sharded` in flight has completed (raises what it raised)."""
        if self._sharded is not None:
            self._sharded.wait()

    # ------------------------------------------------------------------ progress
    def report(
        self,
        step: int | None = None,
        epoch: float | None = None,
        loss: float | None = None,
        samples: int | None = None,
        *,
        batch_size: int | None = None,
        accumulation_steps: int | None = None,
        grad_sqr: float | None = None,
        grad_var: float | None = None,
        **metrics: float,
    ) -> None:
        """Append one progress event (rank 0). ``samples`` is the running total seen.

        ``batch_size`` and ``accumulation_steps`` are the step's (default:
        :attr:`batch_size`, and :attr:`accumulation_steps` for a script that
        declared :class:`BatchSizes`). ``grad_sqr`` and ``grad_var``, where the
        script can measure them, are Pollux's gradient-noise statistics at the
        declared initial batch's scale: the squared norm of the true gradient
        and the variance of the gradient of an ``init``-sized batch (trace of
        its covariance); with them the agent can tell whether a bigger batch
        gains anything. Values that are not finite and >= 0 are left out.
        """
        self._counts_steps = False  # the loop reports its own steps
        as_int = as_step(step)
        if as_int is not None:
            self._last_step = as_int
        fields: dict[str, Any] = {"step": step, "epoch": epoch, "loss": loss, "samples": samples}
        if self.total_steps is not None:
            fields["total_steps"] = self.total_steps
        if self.total_epochs is not None:
            fields["total_epochs"] = self.total_epochs
        fields.update(self._estimate_fields(loss))
        fields.update(metrics)
        fields.update(self._batch_fields(batch_size, accumulation_steps))
        fields.update(grad_sqr=non_negative(grad_sqr), grad_var=non_negative(grad_var))
        self._event(contract.EVENT_PROGRESS, **{k: v for k, v in fields.items() if v is not None})
        if as_int is not None and self._profile is not None and self._profile.done(as_int):
            self._end_profile(as_int)

    # ------------------------------------------------------------------ batch size (dlsub estimate, the agent)
    @property
    def batch_size(self) -> int | None:
        """The global batch size to use: samples per optimiser step over all replicas.

        A script that declared :class:`BatchSizes` gets the batch chosen at
        this (re)start (``$DLSUB_BATCH_SIZE``, else the agent's pick within
        the limits, else ``init``), equal to ``world_size * micro_batch_size
        * accumulation_steps``. Any other script gets ``$DLSUB_BATCH_SIZE``
        (``dlsub estimate`` sets it), or None.
        """
        return self._batch.batch_size if self._batch is not None else env_batch_size()

    @property
    def accumulation_steps(self) -> int:
        """Micro-steps per optimiser step on each replica (gradient accumulation): 1 means none.

        ``for micro in range(run.accumulation_steps): ...`` then one optimiser step.
        Always 1 for a script that did not declare :class:`BatchSizes`.
        """
        return self._batch.accumulation_steps if self._batch is not None else 1

    @property
    def micro_batch_size(self) -> int | None:
        """Samples each replica processes per micro-step (declared scripts only; None otherwise)."""
        return self._batch.micro_batch_size if self._batch is not None else None

    @property
    def batch_from(self) -> str | None:
        """Where the batch came from: "environment", "agent" or "declared" (None when not declared)."""
        return self._batch.source if self._batch is not None else None

    def _choose_batch(self) -> None:
        """Settle this (re)start's batch; under torch.distributed every rank takes rank 0's choice."""
        sizes = self.batch_sizes
        if sizes is None:
            return
        batch, source, reason = asked_batch(sizes, self.job_dir)
        # A process that joined a running group makes no collective of its own (the members are training).
        agreed = (from_rank0([batch, contract.BATCH_SOURCES.index(source)]) if regroup_join.joined() is None
                  else None)
        if agreed is not None:
            batch, source = agreed[0], contract.BATCH_SOURCES[agreed[1]]
        self._batch = split(sizes, self.world_size, batch, source, reason)
        if self.is_main:
            chosen = self._batch
            why = {"environment": f"${BATCH_SIZE_ENV}", "agent": f"the agent's choice: {chosen.reason or '-'}",
                   "declared": "the declared initial batch"}[chosen.source]
            print(f"dlsub: batch size {chosen.batch_size} = {self.world_size} replica(s) x "
                  f"{chosen.accumulation_steps} micro-step(s) x {chosen.micro_batch_size} ({why})",
                  file=sys.stderr, flush=True)

    @property
    def steps_per_epoch(self) -> int | None:
        """Steps in one epoch: ``init(steps_per_epoch=)``, else declared total steps over total epochs."""
        if self._steps_per_epoch:
            return self._steps_per_epoch
        if self.total_steps and self.total_epochs:
            return max(1, round(self.total_steps / self.total_epochs))
        return None

    def should_finish(self) -> bool:
        """True once the loss has reached the target (``init(target_loss=)`` or ``dlsub submit --target-loss``).

        Judged on the mean of the last few reported losses, so one lucky
        batch does not end training early. Always False without a target.
        Under torch.distributed every rank gets the same answer (a MAX
        all-reduce), as with :meth:`should_stop`.
        """
        if self.target_loss is None:
            return False
        local = (len(self._recent_losses) >= LOSS_WINDOW
                 and sum(self._recent_losses) / len(self._recent_losses) <= self.target_loss)
        group = collectives()
        return local if group is None else bool(group.max(1 if local else 0))

    def _estimate_fields(self, loss: Any) -> dict[str, Any]:
        """Peak memory, steps per epoch and the loss target, for dlsub estimate and the loss-curve ETA."""
        try:
            value = float(loss) if loss is not None else None
        except (TypeError, ValueError):
            value = None
        if value is not None and math.isfinite(value):
            self._recent_losses = [*self._recent_losses, value][-LOSS_WINDOW:]
        fields: dict[str, Any] = {"peak_rss_mb": peak_rss_mb(), "steps_per_epoch": self.steps_per_epoch,
                                  "target_loss": self.target_loss}
        cuda = cuda_peak_mb()
        if cuda is not None:
            fields["cuda_peak_mb"] = cuda
        return fields

    def _batch_fields(self, batch_size: Any = None, accumulation_steps: Any = None) -> dict[str, Any]:
        """The batch a step ran with, for the agent's throughput fit: given, else this run's."""
        given_batch, given_steps = as_step(batch_size), as_step(accumulation_steps)
        batch = given_batch if given_batch is not None and given_batch >= 1 else self.batch_size
        steps = given_steps if given_steps is not None and given_steps >= 1 else None
        if steps is None and self._batch is not None:
            steps = self._batch.accumulation_steps
        return {"batch_size": batch, "accumulation_steps": steps}

    def _end_profile(self, step: int) -> NoReturn:
        """A profiling run (``dlsub estimate``) has measured enough: record it and leave cleanly (exit 0)."""
        self._event(contract.EVENT_FINISHED, step=step, profile=True, peak_rss_mb=peak_rss_mb(),
                    cuda_peak_mb=cuda_peak_mb())
        barrier()
        sys.stdout.flush()
        sys.stderr.flush()
        sys.exit(0)

    def _event(self, kind: str, **fields: Any) -> None:
        if not self.is_main:
            return
        fence.check(f"its {kind} record")  # a superseded attempt's progress is not the job's (issue 53)
        record = {"event": kind, "time": round(time.time(), 3), "attempt": attempt_key(), **fields}
        self.job_dir.mkdir(parents=True, exist_ok=True)
        with open(self.job_dir / PROGRESS_FILE, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, default=float) + "\n")

    # ------------------------------------------------------------------ ending
    def exit_for_resume(self) -> NoReturn:
        """Leave with :data:`RESUME_EXIT_CODE`: "checkpointed, resume me". Call after save().

        Writes this attempt's resume marker first; under torchrun the process
        exits 0 and dlsub's launcher turns the marker into RESUME_EXIT_CODE.
        """
        barrier()
        if self.is_main:
            marker = resume_marker(self.job_dir)
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(json.dumps({"reason": self.stop_reason, "time": time.time(),
                                          "host": socket.gethostname()}))
            self._event(contract.EVENT_EXIT_FOR_RESUME, reason=self.stop_reason)
        sys.stdout.flush()
        sys.stderr.flush()
        # The group re-forms only once every process of it has exited, and
        # Python's collector passes over torch's object graph at exit cost
        # about a second of CPU a process (several processes share a node's
        # cores). Frozen objects are skipped by them; everything reachable is
        # still released as at any exit, and atexit handlers still run.
        gc.freeze()
        if self.stop_reason == STOP_PEER_RESTART and ":" in os.environ.get(contract.ENV_NNODES, ""):
            self._await_own_restart()
        # Under torchrun a non-zero exit is a worker failure: torchrun would
        # print it as one, or restart the workers with --max-restarts. Exit 0
        # there; dlsub's launcher sees the marker and exits RESUME_EXIT_CODE.
        sys.exit(0 if os.environ.get("TORCHELASTIC_RUN_ID") else RESUME_EXIT_CODE)

    def _await_own_restart(self) -> None:
        """Another member's torchrun is restarting an elastic group (a member joined) and this process
        stopped with it. Its own torchrun restarts it too once it sees the member waiting, and stops it
        with SIGTERM; a process that left before that would look to it like training that finished, and it
        would wait at its exit barrier while the others re-form without it. So wait for that SIGTERM (a
        while: a torchrun that is only shutting down sends none)."""
        deadline = time.monotonic() + OWN_RESTART_WAIT_S
        while self.stop_reason != "SIGTERM" and time.monotonic() < deadline:
            time.sleep(0.05)

    def finish(self) -> None:
        """Record that training completed (after an asynchronous save in flight has)."""
        self.wait_for_checkpoint()
        self._event(contract.EVENT_FINISHED)


def _hostlist(variable: str) -> list[str]:
    from dlsub.hostlist import expand_nodes

    try:
        return expand_nodes(os.environ.get(variable, ""))
    except ValueError:
        return []


def init(
    job_dir: str | os.PathLike[str] | None = None,
    *,
    keep: int = 3,
    total_steps: int | None = None,
    total_epochs: int | None = None,
    handle_signals: bool = True,
    target_loss: float | None = None,
    steps_per_epoch: int | None = None,
    batch_size: BatchSizes | None = None,
    saves_on_request: bool = False,
) -> Run:
    """Make the run's handle and install the stop-signal handlers.

    The job directory is, in order: ``job_dir``, ``$DLSUB_JOB_DIR`` (set by
    dlsub's batch script), or ``./dlsub-run`` so the same script works
    unchanged off-cluster. ``target_loss`` makes :meth:`Run.should_finish`
    true once the loss reaches it, and gives ``dlsub status`` a loss-curve ETA.
    ``batch_size`` lets dlsub choose the global batch within the declared
    :class:`BatchSizes` (:attr:`Run.batch_size`, :attr:`Run.accumulation_steps`);
    under torch.distributed, call ``init_process_group`` first so every rank
    takes rank 0's choice. ``saves_on_request``: the caller saves whenever
    dlsub asks, inside its own loop (the framework adapters do), so dlsub may
    move or continue the job before its first checkpoint; a plain loop need
    not say so: its first :meth:`Run.should_stop` call does.
    """
    if batch_size is not None and not isinstance(batch_size, BatchSizes):
        raise TypeError(f"init(batch_size=...) takes dlsub.checkpointing.BatchSizes(init=, max=, local_max=), "
                        f"not {type(batch_size).__name__}")
    directory = Path(job_dir or os.environ.get(contract.ENV_JOB_DIR) or "dlsub-run").resolve()
    run = Run(directory, keep=keep, total_steps=total_steps, total_epochs=total_epochs, target_loss=target_loss,
              steps_per_epoch=steps_per_epoch, batch_sizes=batch_size)
    # A framework adapter declares that it saves when asked, and reports the framework's steps itself.
    run._saves_declared = saves_on_request
    run._counts_steps = not saves_on_request
    run._choose_batch()
    # A process that exits with its group alive can die of SIGABRT at exit (end_process_group says why).
    end_process_group_at_exit()
    if handle_signals:
        run.install_signal_handlers()
    if run.is_main:
        directory.mkdir(parents=True, exist_ok=True)
        # A stop request of this attempt that led here (an elastic group
        # re-forming within it) has been answered: the launcher must not read
        # it again when this run ends.
        resume_marker(directory).unlink(missing_ok=True)
        declared: dict[str, Any] = {}
        if batch_size is not None:
            declared = {"batch_limits": batch_size.limits.to_event(), **run._batch_fields(),
                        "batch_from": run.batch_from}
        if saves_on_request:
            declared["saves"] = contract.SAVES_ON_REQUEST
        gpu_type = contract.valid_gpu_type(os.environ.get(contract.ENV_GPU_TYPE))
        if gpu_type is not None:
            declared["gpu_type"] = gpu_type  # what it measures from here on, it measures on this kind of GPU
        run._event(contract.EVENT_START, rank=run.rank, world_size=run.world_size, nodes=run.nodes,
                   resized=run.resized, host=socket.gethostname(), pid=os.getpid(), **declared, **application())
    return run
