"""dlsub for a PyTorch Lightning script: add one callback, change nothing else.

    from dlsub.checkpointing.lightning import DlsubCallback

    trainer = Trainer(max_steps=1000, callbacks=[DlsubCallback()])
    trainer.fit(model, data)

Works with ``lightning`` and with ``pytorch_lightning`` 2.x (the callback is
made on whichever is installed, ``lightning`` first; either Trainer takes it
in its ``callbacks`` list). What it does:

* reports each training step to dlsub (step, loss, samples seen);
* when dlsub asks the job to stop (a time limit, a move, a resize,
  ``dlsub requeue``: SIGUSR1, or torchrun's SIGTERM), saves through
  Lightning's own ``trainer.save_checkpoint`` at the end of the current step,
  seals it, and leaves with dlsub's "resume me";
* on the next attempt, resumes from the newest sealed checkpoint without a
  ``ckpt_path`` (one the script passes is used only until dlsub has one of
  its own), at any world size (Lightning's DDP checkpoints are whole);
* refuses to train when the Trainer runs fewer processes than torchrun
  started (each would train a copy of its own, all writing one checkpoint):
  Lightning under torchrun wants ``devices`` and ``num_nodes`` to match the
  launcher's world, and an elastic job's world changes size. The one line
  for a job of more than one process (``--gpus 2``, ``--gpus 1:4``, ...):
  ``Trainer(..., **trainer_args())`` (``devices`` and ``num_nodes`` read
  from torchrun's environment; nothing outside torchrun);
* turns Lightning's own Slurm auto-requeue off (``SLURMEnvironment``'s
  ``auto_requeue``), so the one requeue is dlsub's;
* with ``every_n_steps=N``, also checkpoints every N steps, so that a crash
  (a node lost, an out-of-memory kill) loses at most N steps. Without it the
  job is still moved and continued: its start tells dlsub that it saves
  whenever asked (``init(saves_on_request=True)``), so the agent need not
  wait for a first checkpoint as it does for a plain script.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from dlsub.checkpointing.frameworks import Adapter, batch_length, loss_value

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the older package name
    from pytorch_lightning.callbacks import Callback  # type: ignore[assignment,no-redef,unused-ignore]

#: Where Lightning checkpoints go, under the job's checkpoint folder.
SUBDIR = "lightning"


def _name(step: int) -> str:
    return f"step-{step:08d}.ckpt"


def _launcher_world() -> tuple[int, int] | None:
    """(processes on this node, processes in all) as torchrun started them; None outside torchrun."""
    try:
        return int(os.environ["LOCAL_WORLD_SIZE"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        return None


#: What a script may give ``devices`` that means "as many as there are": torchrun's count is taken.
_ANY_DEVICES = (None, "auto", -1, "-1")


def trainer_args(**given: Any) -> dict[str, Any]:
    """The Trainer's keyword arguments with ``devices`` and ``num_nodes`` those of the world torchrun started
    this process in. Lightning under torchrun (its TorchElasticEnvironment) trains data-parallel only when
    they match the launcher's; an elastic job's world changes from one group to the next, so a script cannot
    write them down::

        trainer = Trainer(max_steps=1000, callbacks=[DlsubCallback()], **trainer_args())
        trainer = Trainer(**trainer_args(devices=4, max_steps=1000, callbacks=[DlsubCallback()]))

    A script that sets ``devices`` or ``num_nodes`` itself passes them here (in the Trainer's call beside
    ``**trainer_args()`` Python refuses the keyword twice). Outside torchrun what it set is kept, as it is
    (``{}`` when it set nothing: the Trainer's defaults). Under torchrun a value that says the same
    (``devices="auto"`` or ``-1``, the same count, a list of as many devices) is kept; one that does not
    raises ValueError naming the clash: Lightning would train each process apart, all writing one checkpoint.
    """
    world = _launcher_world()
    if world is None:
        return dict(given)
    local, total = world
    if local < 1 or total < local or total % local:
        raise ValueError(f"torchrun's environment is not a world Lightning can run: LOCAL_WORLD_SIZE={local}, "
                         f"WORLD_SIZE={total}")
    nodes = total // local
    out = dict(given)
    devices = given.get("devices")
    if devices in _ANY_DEVICES:
        out["devices"] = local
    elif _count(devices) != local:
        raise ValueError(f"Trainer(devices={devices!r}) clashes with the {local} process(es) dlsub started on "
                         f"this node (torchrun's LOCAL_WORLD_SIZE={local}): leave devices to trainer_args(), or "
                         f"submit with as many GPUs per node as devices says (dlsub --gpus-per-node)")
    num_nodes = given.get("num_nodes")
    if num_nodes is None:
        out["num_nodes"] = nodes
    elif num_nodes != nodes:
        raise ValueError(f"Trainer(num_nodes={num_nodes!r}) clashes with the {nodes} node(s) of processes dlsub "
                         f"started (torchrun's WORLD_SIZE={total} / LOCAL_WORLD_SIZE={local}): leave num_nodes to "
                         "trainer_args(), or submit with as many nodes (dlsub --nodes)")
    return out


def _count(devices: Any) -> int | None:
    """How many devices a Trainer's ``devices`` names (an int, its digits, a list; "0,1": two), or None."""
    if isinstance(devices, bool):
        return None
    if isinstance(devices, int):
        return devices
    if isinstance(devices, (list, tuple)):
        return len(devices)
    if isinstance(devices, str):
        text = devices.strip()
        if text.isdigit():
            return int(text)
        ids = [part for part in text.split(",") if part.strip()]
        return len(ids) if ids and all(p.strip().isdigit() for p in ids) else None
    return None


class DlsubCallback(Callback):
    """The one object a Lightning script adds (``Trainer(callbacks=[DlsubCallback()])``).

    ``keep``: how many of dlsub's Lightning checkpoints to keep (the newest that verifies always stays).
    ``every_n_steps``: also checkpoint every that many optimizer steps (None: only when dlsub asks).
    Other keyword arguments go to :func:`dlsub.checkpointing.init` (``total_steps=``, ``target_loss=``...;
    ``total_steps`` defaults to the Trainer's ``max_steps``).
    """

    def __init__(self, keep: int = 2, every_n_steps: int | None = None, **init_kwargs: Any) -> None:
        super().__init__()
        if every_n_steps is not None and (isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int)
                                          or every_n_steps < 1):
            raise ValueError(f"DlsubCallback(every_n_steps=...) takes a whole number of steps >= 1 or None, "
                             f"not {every_n_steps!r}")
        self.keep = keep
        self.every_n_steps = every_n_steps
        self._saved_step: int | None = None
        self._init_kwargs = init_kwargs
        self.adapter: Adapter | None = None
        self.samples = 0

    @property
    def run(self) -> Any:
        """The :class:`dlsub.checkpointing.Run` (after the Trainer's setup)."""
        return self.adapter.run if self.adapter is not None else None

    # Lightning keeps this in its checkpoints, so the count of samples continues across attempts.
    def state_dict(self) -> dict[str, Any]:
        return {"samples": self.samples}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.samples = int(state_dict.get("samples", 0))

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit" or self.adapter is not None:
            return
        world = _launcher_world()
        if world is not None and trainer.world_size != world[1]:
            raise RuntimeError(
                f"dlsub: torchrun started {world[1]} training processes but the Trainer runs as "
                f"{trainer.world_size} of them, so each would train a model of its own and overwrite the others' "
                f"checkpoints. Pass the launcher's world to the Trainer: "
                f"Trainer(..., **dlsub.checkpointing.lightning.trainer_args())")
        # What Lightning's signal connector reads (a single-device strategy has none of its own).
        environment = getattr(trainer._accelerator_connector, "cluster_environment", None)
        if environment is not None and getattr(environment, "auto_requeue", False):
            environment.auto_requeue = False  # exactly one requeue: dlsub's
        kwargs = dict(self._init_kwargs)
        if trainer.max_steps and trainer.max_steps > 0:
            kwargs.setdefault("total_steps", trainer.max_steps)
        # The process group is up by now (the strategy's set-up comes first): every rank agrees.
        self.adapter = Adapter(SUBDIR, self.keep, kwargs)
        resume = self.adapter.resume_candidate([(int(p.stem.split("-")[1]), p) for p in self._checkpoints()])
        if resume is not None:
            self._resume_from(trainer, resume)

    def _checkpoints(self) -> list[Path]:
        assert self.adapter is not None
        return sorted(self.adapter.directory.glob("step-*.ckpt"), reverse=True)

    @staticmethod
    def _resume_from(trainer: Any, path: Path) -> None:
        """Make this fit() restore ``path``. Lightning picks its checkpoint before any hook runs and
        loads it after ``setup``; the connector's ``resume_start`` is where the path is read."""
        connector = trainer._checkpoint_connector
        original = connector.resume_start

        def resume_start(checkpoint_path: Any = None, *args: Any, **kwargs: Any) -> None:
            connector.resume_start = original  # once
            original(str(path), *args, **kwargs)

        connector.resume_start = resume_start

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        # Lightning's own SIGTERM handler (set just before) would end fit() with an exit code of 0 at the
        # next step, which the launcher would take for a finished training; dlsub's checkpoints instead.
        assert self.adapter is not None
        signal.signal(signal.SIGTERM, self.adapter.run._on_signal)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        adapter = self.adapter
        if adapter is None:
            return
        self.samples += batch_length(batch) * trainer.world_size
        batches = trainer.num_training_batches
        epoch = trainer.current_epoch + (batch_idx + 1) / batches if isinstance(batches, int) and batches else None
        step = trainer.global_step
        adapter.run.report(step=step, epoch=epoch, loss=loss_value(outputs), samples=self.samples)
        stop = adapter.run.should_stop()  # every rank, every batch: a collective under torch.distributed
        # Periodic: once per optimizer step (with gradient accumulation several batches end at one step).
        due = bool(self.every_n_steps) and step > 0 and step % (self.every_n_steps or 1) == 0
        if (stop or due) and step != self._saved_step:
            path = adapter.directory / _name(step)
            trainer.save_checkpoint(path)
            adapter.checkpointed(path, step, [p for p in self._checkpoints() if p != path])
            self._saved_step = step
        if stop:
            adapter.run.exit_for_resume()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.adapter is not None:
            self.adapter.run.finish()
