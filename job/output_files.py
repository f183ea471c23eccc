"""Which files hold a job's output, and what is new in them since the last look (``dlsub logs``).

A job writes one Slurm output file (:func:`dlsub.contract.output_file`; all
its attempts append to it). An elastic job's worker tasks each write their
own (:func:`worker_output_files`): they run on other nodes as
separate Slurm jobs, and a task that leaves and rejoins the group appends to
the same file. Worker files appear while the job runs (a task's first start
creates it), so every look lists them again.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from dlsub.contract import WORKER_OUTPUT_PATTERN, output_file

#: How much of an output file's end :func:`tail` reads unless told (the dashboard's job page shows it).
TAIL_BYTES = 16 * 1024


def worker_output_file(job_dir: Path, worker_array_id: int, task: int) -> Path:
    return job_dir / WORKER_OUTPUT_PATTERN.replace("%A", str(int(worker_array_id))).replace("%a", str(int(task)))


def worker_output_files(job_dir: Path, worker_array_id: int, tasks: int) -> list[tuple[int, Path]]:
    """(task index, file) of the worker tasks, of an array of ``tasks``, whose output file exists now.

    Each is looked for by name, not by listing the directory: a file named for an index the array does not
    have is none of its tasks', and a directory full of such names costs nothing."""
    found = [(task, worker_output_file(job_dir, worker_array_id, task)) for task in range(max(0, tasks))]
    return [(task, path) for task, path in found if path.exists()]


@dataclass(frozen=True)
class OutputSource:
    """One output file: ``worker`` is its worker task's index, None for the main job's file."""

    path: Path
    worker: int | None = None


class OutputFiles:
    """The job's output files, read incrementally: the main job's first, then the workers' in task order."""

    def __init__(self, job_dir: Path, slurm_job_id: int | None, worker_array_id: int | None = None,
                 worker_tasks: int = 0) -> None:
        self.job_dir = job_dir
        self.main = OutputSource(output_file(job_dir, slurm_job_id or 0))
        self.worker_array_id = worker_array_id
        self.worker_tasks = worker_tasks
        self._offsets: dict[Path, int] = {}

    def sources(self) -> list[OutputSource]:
        """The files that exist now (a job that has not started has none)."""
        found = [self.main] if self.main.path.exists() else []
        if self.worker_array_id is not None:
            workers = worker_output_files(self.job_dir, self.worker_array_id, self.worker_tasks)
            found += [OutputSource(path, task) for task, path in workers]
        return found

    def read_new(self) -> list[tuple[OutputSource, bytes, bool]]:
        """(file, the bytes written since the last call, whether this is the file's first read) per file,
        including files that have nothing new."""
        out = []
        for source in self.sources():
            first = source.path not in self._offsets
            offset = self._offsets.get(source.path, 0)
            try:
                with open(source.path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read()
            except FileNotFoundError:  # removed between listing and reading: nothing to show
                continue
            self._offsets[source.path] = offset + len(chunk)
            out.append((source, chunk, first))
        return out

    def grew(self) -> bool:
        """Whether any file has bytes not read yet (or a new file has appeared)."""
        return any(s.path not in self._offsets or s.path.stat().st_size > self._offsets[s.path]
                   for s in self.sources())


def tail(path: Path, limit: int = TAIL_BYTES) -> str:
    """The end of a job's output, read without following links (a user's file)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return ""
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return ""
        os.lseek(fd, max(0, info.st_size - limit), os.SEEK_SET)
        data = os.read(fd, limit)
    finally:
        os.close(fd)
    text = data.decode("utf-8", errors="replace")
    return text.split("\n", 1)[1] if info.st_size > limit and "\n" in text else text
