"""Checkpoint, resume and report progress from a training script.

    from dlsub import checkpointing

    run = checkpointing.init()
    state = run.restore() or {"step": 0}
    for step in range(state["step"], 1000):
        loss = train_step()
        run.report(step=step + 1, loss=loss)   # optional: without it each should_stop() counts a step
        if run.should_stop():           # SIGUSR1 before the time limit, SIGTERM, a move, dlsub requeue
            run.save({"step": step + 1})        # recorded at the last report()'s step
            run.exit_for_resume()       # exits 85: "checkpointed, resume me"
    run.finish()

A script may let dlsub choose its batch size within declared limits:
``checkpointing.init(batch_size=checkpointing.BatchSizes(init=128, max=4096,
local_max=256))``, then ``run.batch_size``, ``run.accumulation_steps`` and
``run.micro_batch_size`` at each (re)start (:mod:`dlsub.checkpointing.batch`).

The same script runs unchanged off-cluster (a local ``./dlsub-run`` job dir).
Nothing here installs signal handlers at import time: ``init()`` does.
"""

from dlsub.checkpointing.batch import BatchSizes
from dlsub.checkpointing.regroup import Change
from dlsub.checkpointing.run import RESUME_EXIT_CODE, Run, init

__all__ = ["RESUME_EXIT_CODE", "BatchSizes", "Change", "Run", "init"]
