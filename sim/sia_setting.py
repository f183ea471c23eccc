"""Sia's heterogeneous setting (SOSP '23), as its artifact's simulator ran it.

Facts read from the artifact (siasosp23/artifacts, ``sia-simulator/``:
``simulator_config.py``, ``applications.py``, ``cluster_unaware.py``); no
code copied. ``dlsub simulate --calibration sia`` (the default on a
cluster whose groups name GPU types) applies them:

- **Calibration**: the artifact slows every simulated job's progress by a
  factor per application, fitted to real runs on the ``rtx`` machines; the
  jobs' own reports (what a policy fits) stay the traces' times.
- **Restart penalties**: seconds without progress after a (re)start, per
  application, measured on its physical cluster.
- **Batch size re-tuned every interval**: each adaptive job picks its batch size again at the end of
  every interval it ran (``job.py``: ``step`` ends with ``update_local_bsz``), on the model its reports
  so far fit; not only between epochs and when its GPUs change.
- **Resizes** (not Sia's: issue 52): Sia's paper and artifact measured restarts only, and charge one for
  every change of a job's GPUs. dlsub resizes a job in place (the same kind of GPUs, grown onto more or
  shrunk onto fewer of the ones it holds) in process, a grow in a measured 6 s and a shrink in 0.4 s
  (``SimConfig.resize_penalty_s``, ``shrink_penalty_s``); here that costs the same for every application,
  never more than the application's restart. dlsub's figure
  was measured on a small model, so for an application whose restart is mostly its own start-up
  (imagenet's 250 s) it is a lower bound on what a resize would cost it; ``resize_penalty_s=None``
  (``--resize-penalty restart``) is Sia's own pricing, a restart for every change.
- **What Sia's policy is told a restart costs** (its restart factor):
  another table per application, measured on the physical cluster
  (``sia.py``'s ``get_restart_penalty``); 30 s for any other.
- **Type-unaware jobs** (pollux there): at most as many GPUs as the
  smallest GPU type has (the artifact's ``clusterwide_max_replicas``), and
  a decision that spans types keeps the GPUs of the type holding most of
  the job's (a tie: the type where the job runs fastest on one GPU); the
  rest stay idle that interval, as the artifact dropped them.
"""

from __future__ import annotations

SLOWDOWN = {"cifar10": 1.8, "imagenet": 1.2, "yolov3": 1.2, "bert": 1.2, "deepspeech2": 1.2, "ncf": 1.5,
            "gpt_pmp": 1.0}
RESTART_S = {"cifar10": 50, "deepspeech2": 25, "bert": 120, "yolov3": 80, "imagenet": 250, "ncf": 15}
DEFAULT_RESTART_S = 30
POLICY_RESTART_S = {"deepspeech2": 25, "imagenet": 250, "cifar10": 30, "bert": 120, "yolov3": 45}
CALIBRATIONS = ("none", "sia")


def retunes_each_interval(calibration: str) -> bool:
    """Whether an adaptive job re-tunes its batch size after every interval it ran (Sia's artifact), not
    only between epochs and when its GPUs change."""
    return calibration == "sia"


def slowdown(calibration: str, application: str) -> float:
    """How many times slower than its traces a job of ``application`` progresses."""
    return SLOWDOWN.get(application, 1.0) if calibration == "sia" else 1.0


def restart_s(calibration: str, application: str, default: float) -> float:
    """Seconds without progress after each (re)start of a job of ``application``."""
    return float(RESTART_S.get(application, DEFAULT_RESTART_S)) if calibration == "sia" else default


def told_restart_s(calibration: str, application: str) -> float | None:
    """What a policy is told one restart of a job of ``application`` costs (None: not told)."""
    return float(POLICY_RESTART_S.get(application, DEFAULT_RESTART_S)) if calibration == "sia" else None
