"""dlsub for a Hugging Face ``Trainer`` script: one callback, and one line to resume.

    from dlsub.checkpointing.hf_trainer import DlsubCallback

    dlsub = DlsubCallback()
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[dlsub])
    trainer.train(resume_from_checkpoint=dlsub.resume_checkpoint(args.output_dir))

Checkpoints are the Trainer's own ``checkpoint-N`` folders in ``output_dir``,
written by the Trainer as ``TrainingArguments`` says (``save_strategy``,
``save_steps``, ``save_total_limit``: the Trainer rotates them, dlsub does
not). What the callback adds:

* each checkpoint the Trainer writes is sealed once every rank has returned
  (sizes and SHA-256); :meth:`DlsubCallback.resume_checkpoint` gives the
  newest sealed one that verifies, the same on every rank, or None on a
  first start (which ``resume_from_checkpoint`` takes as "start afresh");
  a folder left by a save killed midway is never resumed;
* when dlsub asks the job to stop (SIGUSR1; torchrun's SIGTERM), the Trainer
  saves a checkpoint at the end of the current step, and the process leaves
  with dlsub's "resume me";
* each step is reported to dlsub (step, samples; the loss as the Trainer
  logs it, every ``logging_steps``).

Keep ``save_total_limit`` at 2 or more (or unset): with 1 the Trainer deletes
the previous checkpoint before dlsub has sealed the new one.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from dlsub.checkpointing.frameworks import Adapter
from dlsub.checkpointing.sealed import manifest

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def _own(found: list[tuple[int, Path]], owner: str) -> list[tuple[int, Path]]:
    """The checkpoints of ``found`` this job may resume: those its seal says it wrote, and unsealed ones (passed
    over later, with why). A checkpoint another job sealed (an ``output_dir`` two jobs share) is never
    resumed, nor one whose seal names no job (an older dlsub's: whose it was cannot be told)."""
    own = []
    for step, path in found:
        seal = manifest(path)
        if seal.get("files") and seal.get("job") != owner:
            print(f"dlsub: passed over {path}: not this job's (sealed by "
                  f"{'another job' if seal.get('job') else 'no job named'}); "
                  "give each job an output_dir of its own ($DLSUB_JOB_DIR)", file=sys.stderr, flush=True)
            continue
        own.append((step, path))
    return own


class DlsubCallback(TrainerCallback):
    """The callback a Hugging Face Trainer script adds. Keyword arguments go to
    :func:`dlsub.checkpointing.init` (``total_steps`` defaults to the Trainer's ``max_steps``)."""

    def __init__(self, **init_kwargs: Any) -> None:
        self._init_kwargs = init_kwargs
        self.adapter: Adapter | None = None
        self.samples = 0
        self._report_at_log = False
        self._stopping = False

    @property
    def run(self) -> Any:
        """The :class:`dlsub.checkpointing.Run` (once the training, or :meth:`resume_checkpoint`, began)."""
        return self.adapter.run if self.adapter is not None else None

    def _adapter(self, output_dir: str | Path) -> Adapter:
        if self.adapter is None:
            self.adapter = Adapter("", 0, dict(self._init_kwargs), directory=Path(output_dir))
        return self.adapter

    def resume_checkpoint(self, output_dir: str | Path) -> str | None:
        """The ``checkpoint-N`` folder of ``output_dir`` to resume from (the newest sealed one that verifies),
        or None: pass it to ``trainer.train(resume_from_checkpoint=...)``. Every rank calls it."""
        adapter = self._adapter(output_dir)
        folder = Path(output_dir)
        found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _CHECKPOINT.match(p.name)) and p.is_dir()] \
            if folder.is_dir() else []
        chosen = adapter.resume_candidate(_own(found, adapter.owner))
        if chosen is None:
            return None
        samples = manifest(chosen).get("samples")
        self.samples = samples if isinstance(samples, int) else 0
        return str(chosen)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        run = self._adapter(args.output_dir).run  # made by resume_checkpoint() already, as a rule
        if run.total_steps is None and state.max_steps and state.max_steps > 0:
            run.total_steps = state.max_steps  # for dlsub status's ETA

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        loss = (logs or {}).get("loss")
        if self._report_at_log and isinstance(loss, (int, float)):
            self._report(state, float(loss))
        self._report_at_log = False

    def _report(self, state: Any, loss: float | None) -> None:
        self._adapter_run().report(step=state.global_step, epoch=state.epoch, loss=loss, samples=self.samples)

    def _adapter_run(self) -> Any:
        assert self.adapter is not None
        return self.adapter.run

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        adapter = self._adapter(args.output_dir)
        self.samples += args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
        # The Trainer's flow callback, which runs first, has decided whether this step logs: then the
        # report waits for the step's loss (on_log).
        self._report_at_log = bool(control.should_log)
        if not self._report_at_log:
            self._report(state, None)
        if adapter.run.should_stop():
            control.should_save = True
            control.should_training_stop = True
            self._stopping = True

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        adapter = self._adapter(args.output_dir)
        step = state.global_step
        adapter.checkpointed(Path(args.output_dir) / f"checkpoint-{step}", step, samples=self.samples)
        if self._stopping:
            adapter.run.exit_for_resume()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._adapter(args.output_dir).run.finish()
