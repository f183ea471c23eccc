"""The measured behaviour of one training application (one folder of traces).

Step times come from ``placements.csv`` (interpolated over the local batch
size for a measured placement) or, for unmeasured placements, a linear
interpolation over (nodes, replicas, local batch) of the placement means
and ``scalability.csv``. Sia's traces (``../shared/data/sia``) profile each
application on several GPU types: ``placements-<type>.csv`` and
``scalability-<type>.csv`` beside the type-independent validation files;
``load_application(dir, gpu_type)`` reads one type's. Statistical progress, epochs and gradient
statistics come from ``validation-<B>.csv``, interpolated linearly between
measured batch sizes.
"""

from __future__ import annotations

import csv
import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.interpolate import LinearNDInterpolator, NearestNDInterpolator

from dlsub.batch_split import BatchLimits, split_batch

# Epochs each application trains for (README: "A job finishes after a fixed
# number of epochs").
EPOCHS = {"bert": 2, "cifar10": 100, "deepspeech2": 80, "imagenet": 90, "ncf": 10, "yolov3": 50}
# Local batch limits that Pollux's traces do not show (README: "yolov3: max local 8"); Pollux's (untyped)
# traces only. Sia's artifact (applications.py) sets none for its per-type traces: each type's largest
# profiled local batch is its limit there (yolov3: 16 on aws, 8 on rtx, 32 on dgx-ext).
MAX_LOCAL_BATCH = {"yolov3": 8}
# Per GPU type (Sia's artifact, applications.py: deepspeech2 on the 2080 Ti's 11 GB).
MAX_LOCAL_BATCH_ON_TYPE = {("deepspeech2", "rtx"): 57}


class TraceError(ValueError):
    """A traces folder that lacks what a simulation needs; the message says what is there."""


def profiled_types(trace_dir: Path) -> list[str]:
    """The GPU types an application's traces profile (``placements-<type>.csv``)."""
    return sorted(p.stem[len("placements-"):] for p in trace_dir.glob("placements-*.csv"))


def _read_csv(path: Path) -> dict[str, np.ndarray]:
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    if not rows:
        raise ValueError(f"{path}: no rows")
    return {key: np.array([float(row[key]) for row in rows]) for key in rows[0]}


def normalise(placement: tuple[int, ...]) -> tuple[int, ...]:
    """Drop empty nodes and rotate to the lexicographically smallest form, as the traces key them."""
    kept = tuple(p for p in placement if p)
    if not kept:
        return kept
    return min(kept[i:] + kept[:i] for i in range(len(kept)))


@dataclass(frozen=True)
class BatchConfig:
    """How a total batch size runs on a number of replicas."""

    atomic: int  # per replica per micro-step
    accum_steps: int  # extra micro-steps per optimiser step

    def total(self, replicas: int) -> int:
        return replicas * self.atomic * (self.accum_steps + 1)


class Application:
    def __init__(self, trace_dir: Path, epochs: int | None = None, max_local_bsz: int | None = None,
                 gpu_type: str = "") -> None:
        self.name = trace_dir.name
        self.gpu_type = gpu_type
        suffix = f"-{gpu_type}" if gpu_type else ""
        if gpu_type and not (trace_dir / f"placements{suffix}.csv").is_file():
            raise TraceError(f"{trace_dir}: no placements{suffix}.csv: {self.name} is not profiled on GPU type "
                             f"{gpu_type!r}; profiled types: {', '.join(profiled_types(trace_dir)) or 'none'}")
        self.validation: dict[int, dict[str, np.ndarray]] = {}
        for path in trace_dir.glob("validation-*.csv"):
            self.validation[int(path.stem.split("-")[-1])] = _read_csv(path)
        if not self.validation:
            raise ValueError(f"{trace_dir}: no validation-<B>.csv files")
        self.validation = dict(sorted(self.validation.items()))
        self.batch_sizes = np.array(list(self.validation), dtype=float)
        self.init_batch_size = int(self.batch_sizes[0])
        self.max_batch_size = int(self.batch_sizes[-1])
        self.epochs = epochs or EPOCHS.get(self.name) or min(len(v["progress"]) for v in self.validation.values())
        # Per-epoch gradient statistics as (batch sizes × epochs) grids.
        n = min(len(v["progress"]) for v in self.validation.values())
        self.grad_sqr = np.array([v["grad_sqr"][:n] for v in self.validation.values()])
        self.grad_var = np.array([v["grad_var"][:n] for v in self.validation.values()])
        # Epoch k ends at the smallest measured progress for epoch k.
        self.epoch_end = np.array([min(v["progress"][k] for v in self.validation.values()) for k in range(n)])

        placements = _read_csv(trace_dir / f"placements{suffix}.csv")
        self.min_local_bsz = int(placements["local_bsz"].min())
        self.max_local_bsz = int(max_local_bsz or MAX_LOCAL_BATCH_ON_TYPE.get((self.name, gpu_type))
                                 or (None if gpu_type else MAX_LOCAL_BATCH.get(self.name))
                                 or placements["local_bsz"].max())
        # Samples per second on one GPU at the largest local batch profiled there: what
        # a short profile on one GPU of this type measures (Sia's bootstrapping).
        one = placements["placement"] == 1
        self.one_gpu_throughput = (float(placements["local_bsz"][one].max() / placements["step_time"][one].max())
                                   if one.any() else 0.0)
        rows: dict[tuple[int, ...], list[tuple[float, float, float]]] = {}
        groups: dict[tuple[int, int, float], list[tuple[float, float]]] = {}
        # Columns of one CSV file: the same length.
        for pid, local, step, sync in zip(
            placements["placement"], placements["local_bsz"], placements["step_time"], placements["sync_time"],
            strict=True,
        ):
            key = normalise(tuple(int(d) for d in str(int(pid))))
            rows.setdefault(key, []).append((local, step, sync))
            groups.setdefault((len(key), sum(key), local), []).append((step, sync))
        # Per measured placement: (local batch, step time, sync time) columns, by local batch.
        self._measured: dict[tuple[int, ...], tuple[np.ndarray, ...]] = {
            key: tuple(np.array(col) for col in zip(*sorted(found), strict=True)) for key, found in rows.items()
        }
        points = [list(key) for key in groups]
        values = [np.mean(vals, axis=0) for vals in groups.values()]
        scal = _read_csv(trace_dir / f"scalability{suffix}.csv")
        for row in zip(
            scal["num_nodes"], scal["num_replicas"], scal["local_bsz"], scal["step_time"], scal["sync_time"],
            strict=True,
        ):
            points.append(list(row[:3]))
            values.append(np.array(row[3:]))
        pts, vals = np.array(points, dtype=float), np.array(values, dtype=float)
        self._linear = LinearNDInterpolator(pts, vals)
        self._nearest = NearestNDInterpolator(pts, vals)
        self.step_sync = functools.lru_cache(maxsize=None)(self._step_sync)
        self.grad_stats = functools.lru_cache(maxsize=None)(self._grad_stats)
        self.batch_config = functools.lru_cache(maxsize=None)(self._batch_config)
        self._micro_step = functools.lru_cache(maxsize=None)(self._micro_step_uncached)

    # -- throughput ---------------------------------------------------------

    def _step_sync(self, placement: tuple[int, ...], atomic_bsz: int) -> tuple[float, float]:
        """(step time, sync time) in seconds of one micro-step on ``placement``."""
        key = normalise(placement)
        if key in self._measured:
            local, step, sync = self._measured[key]
            return float(np.interp(atomic_bsz, local, step)), float(np.interp(atomic_bsz, local, sync))
        query = (min(len(key), 16), sum(key), atomic_bsz)
        result = self._linear([query])[0]
        if np.isnan(result).any():
            # Outside the measured hull: the nearest measurement beats no answer.
            result = self._nearest([query])[0]
        return float(result[0]), float(result[1])

    def _batch_config(self, replicas: int, batch_size: int) -> BatchConfig:
        """Split a total batch over replicas, accumulating gradients above the local maximum (the rule
        the live library runs: dlsub.batch_split)."""
        limits = BatchLimits(self.init_batch_size, self.max_batch_size, self.min_local_bsz, self.max_local_bsz)
        return BatchConfig(*split_batch(limits, replicas, batch_size))

    def step_time(self, placement: tuple[int, ...], config: BatchConfig) -> float:
        """Seconds per optimiser step: one synchronised micro-step plus the accumulated ones."""
        return self._micro_step(placement, config.atomic, config.accum_steps)

    def _micro_step_uncached(self, placement: tuple[int, ...], atomic: int, accum_steps: int) -> float:
        step, sync = self.step_sync(normalise(placement), atomic)
        return step + (step - sync) * accum_steps

    # -- statistical efficiency --------------------------------------------

    def _grad_stats(self, batch_size: int, epoch: int) -> tuple[float, float]:
        epoch = min(epoch, self.grad_sqr.shape[1] - 1)
        b = float(min(max(batch_size, self.batch_sizes[0]), self.batch_sizes[-1]))
        return (
            float(np.interp(b, self.batch_sizes, self.grad_sqr[:, epoch])),
            float(np.interp(b, self.batch_sizes, self.grad_var[:, epoch])),
        )

    def efficiency(self, batch_size: int, epoch: int) -> float:
        """Progress per step at ``batch_size`` relative to one step at the initial batch size."""
        sqr, var = self.grad_stats(batch_size, epoch)
        scale = batch_size / self.init_batch_size
        return (var + sqr) / (var / scale + sqr)

    def efficiencies(self, batch_sizes: np.ndarray, epoch: int) -> np.ndarray:
        """:meth:`efficiency` for many batch sizes at once (the batch-size search)."""
        epoch = min(epoch, self.grad_sqr.shape[1] - 1)
        b = np.clip(batch_sizes, self.batch_sizes[0], self.batch_sizes[-1])
        sqr = np.interp(b, self.batch_sizes, self.grad_sqr[:, epoch])
        var = np.interp(b, self.batch_sizes, self.grad_var[:, epoch])
        scale = batch_sizes / self.init_batch_size
        result: np.ndarray = (var + sqr) / (var / scale + sqr)
        return result

    def goodput(self, placement: tuple[int, ...], config: BatchConfig, epoch: int) -> float:
        replicas = sum(placement)
        return self.efficiency(config.total(replicas), epoch) / self.step_time(placement, config)

    def progress_at(self, epoch: int) -> float:
        """Statistical progress at which ``epoch`` epochs are done."""
        return 0.0 if epoch <= 0 else float(self.epoch_end[epoch - 1])

    @property
    def total_progress(self) -> float:
        return self.progress_at(self.epochs)


@functools.cache
def load_application(trace_dir: Path, gpu_type: str = "") -> Application:
    """An application's traces (one GPU type's, when ``gpu_type`` is given); read once."""
    return Application(trace_dir, gpu_type=gpu_type)
