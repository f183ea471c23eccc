"""What a job's one-GPU profile of every GPU type costs in the simulator (issue 54: the profile cost).

A policy that reads a job's one-GPU profile of each type (``profiles_types``: goodput) is charged for it:
profiled "before" (``SimConfig.profile``), the job's first start waits this long more, holding its GPUs.
Until issue 54 that wait was assumed: 60 s for the profile and 20 s for each batch size beyond the first
(``PROFILE_COSTS`` "flat", still there so that the figures run with it can be reproduced). "steps" models
it from what a profile is, so that a job whose steps are slow pays more than one whose steps are fast:

- **Start-up** (``SimConfig.profile_startup_s``): the profile job's start to its first measured step (the
  container, the interpreter and its imports, torchrun, the data and the model built), and its end after
  the last: measured on the testbed (:data:`MEASURED_STARTUP_S`, :data:`MEASURED_TEARDOWN_S`; a floor, as it
  has no GPU). The same on every type; the job's own restart penalty is not used for it, because the
  profile loads no checkpoint.
- **Timed steps**: ``dlsub estimate``'s stop rule (``checkpointing/run_support.py``, ``Profile``): at
  least ``SimConfig.profile_steps`` steps and ``profile_min_s`` seconds after the first report, each step
  the job's own step on one GPU of the type from the traces, at the batch the profile times (its first
  batch), slowed by the setting's calibration (Sia's: real runs are that much slower than the traces).
  This is the "scaled by each GPU kind's speed" part: a slow type's profile takes longer.
- The types are profiled **side by side** (one GPU of each, as ``dlsub estimate`` queues a profile per
  partition by default), so the job waits for the slowest of them.
- **Further batch sizes** (``profile_batches`` above 1, timed on the job's fastest type only, the run
  already started there going on): each adds ``SimConfig.profile_batch_startup_s`` (the step's new shape:
  allocator and warm-up again) and its own timed steps at that batch. The job waits for whichever is
  longer, the fastest type's run with its further batch sizes or the slowest type's single one.

Pure: traces in, seconds out.
"""

from __future__ import annotations

from collections.abc import Mapping

from dlsub.sim.apps import Application
from dlsub.sim.information import profile_batch_sizes

# How a profile's wait is charged (SimConfig.profile_cost): "steps", modelled (above); "flat", the constant
# profile_s plus profile_batch_s for each further batch size, as every figure before the measurement.
PROFILE_COSTS = ("steps", "flat")
# dlsub estimate's profiling stop rule (estimate/estimator.py PROFILE_STEPS, PROFILE_SECONDS).
PROFILE_STEPS = 30
PROFILE_MIN_S = 2.0
# The start-up and end of a one-GPU profile as measured on the testbed, 2 Dec 2026 (issue 54; the main
# engineer's note /work/msg/profile_cost.json): 106 runs of `dlsub estimate` (examples/train_digits.py,
# batch sizes 32-512, partitions cpu, gpu, gpu-dev; 2 cores, Slurm 24.11, rootless Podman, the CPU image with
# torch 2.13.0), from the profiling job's start on its node to its first timed step: median 5.7 s (3.6-13.9:
# Podman's start about 0.7 s, the interpreter and `import torch` 3-5 s, torchrun and its rendezvous, data and
# model built); after the last timed step to the job's end: median 0.6 s. The testbed has no GPU: CUDA's
# context and moving the model to the GPU (seconds on a real GPU, more with NCCL) are not in them, nor any
# queueing for the profile's GPU, so the charge is a floor for a real site.
MEASURED_STARTUP_S = 5.7
MEASURED_TEARDOWN_S = 0.6
# dlsub estimate profiles each batch size as a run of its own (another start-up); a further batch size
# timed in the run already started, as the simulator's profile models it, costs only its own timed steps.
MEASURED_BATCH_STARTUP_S = 0.0


def timed_s(app: Application, batch: int, steps: int, min_s: float, slowdown: float = 1.0) -> float:
    """Seconds a profile on one GPU of ``app``'s type times at ``batch`` (total, accumulated where one GPU
    holds less): ``steps`` steps, and at least ``min_s`` seconds, each step the trace's, ``slowdown`` times
    slower (the setting's calibration)."""
    step = app.step_time((1,), app.batch_config(1, batch)) * slowdown
    return max(steps * step, min_s)


def modelled_profile_s(apps: Mapping[str, Application], batch: int, adaptive: bool, batches: int, *,
                       startup_s: float, batch_startup_s: float, steps: int = PROFILE_STEPS,
                       min_s: float = PROFILE_MIN_S, slowdown: float = 1.0) -> float:
    """How much longer a job's first start waits for its one-GPU profile of every type in ``apps`` (the
    "steps" model, module docstring). ``batch``: the batch the profile times first (an adaptive job's first
    batch, the application's initial one; else the job's own); ``batches``: how many batch sizes the policy
    has it time on its fastest type (an adaptive job only, as :meth:`OnlineInformation.observe_profile`
    records them)."""
    if not apps:
        return 0.0
    each = {t: timed_s(app, batch, steps, min_s, slowdown) for t, app in apps.items()}
    wait = startup_s + max(each.values())
    if adaptive and batches > 1:
        fastest = max(apps, key=lambda t: apps[t].one_gpu_throughput)  # as observe_profile chooses it
        app = apps[fastest]
        largest = min(app.max_local_bsz, app.max_batch_size)
        further = profile_batch_sizes(app.init_batch_size, largest, batches)[1:]
        longest = startup_s + each[fastest] + sum(batch_startup_s + timed_s(app, b, steps, min_s, slowdown)
                                                  for b in further)
        wait = max(wait, longest)
    return wait
