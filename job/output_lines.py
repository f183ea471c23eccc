"""A job's output as ``dlsub logs`` prints it: all of it, or one process's lines (``--rank N``, ``--node NAME``).

In a job with several training processes the launcher labels every line
(:data:`dlsub.contract.OUTPUT_LABEL`, ``[rank]:`` or ``[node/rank]:``; its
own and torchrun's ``[dlsub]:``), so a line's first label says where it came
from. What a process prints cannot move its line elsewhere:

* a fake label it prints comes after dlsub's (rank 1 printing ``[3]:x`` is
  written ``[1]:[3]:x``), and only the first label counts;
* a newline it prints starts a new line, which dlsub labels too; ``\\r``
  does the same. Lines are cut here at ``\\n`` only, as the launcher wrote
  them: never ``str.splitlines``, which also cuts at ``\\x0b``, ``\\x1c``,
  ``\\x85``, ``\\u2028``... where the launcher did not.

What this cannot tell apart: bytes a job's process writes into the output
file itself (it is in the job's own directory) carry whatever label it
likes; and a line longer than the launcher's limit is cut into pieces, each
with the label. Unlabelled lines are Slurm's, Podman's or the batch
script's (``dlsub: ...``: where each attempt starts and ends); with a
selection the batch script's go to stderr, so that attempts stay told
apart and stdout holds the selected process's lines alone. A job with one
process writes no labels: its lines are printed only without a selection.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby
from operator import itemgetter
from typing import TextIO

from dlsub.contract import OUTPUT_LABEL_RE

#: The batch script's own lines start so (unlabelled: it runs outside the container).
BATCH_LINE_START = b"dlsub: "
#: The longest unfinished line held while following (the launcher's lines are far shorter).
MAX_PENDING = 1024 * 1024


@dataclass(frozen=True)
class Selection:
    """Which process's lines: a global rank, a node's name, or both."""

    rank: int | None = None
    node: str | None = None

    def describe(self) -> str:
        parts = ([f"rank {self.rank}"] if self.rank is not None else []) + \
            ([f"node {self.node}"] if self.node is not None else [])
        return " on ".join(parts)


def line_source(line: bytes) -> tuple[str | None, str] | None:
    """(node or None, rank or ``dlsub``) from a line's first label; None for an unlabelled line."""
    match = OUTPUT_LABEL_RE.match(line)
    if match is None:
        return None
    node = match["node"]
    return (node.decode() if node else None, match["source"].decode())


@dataclass
class LineCounts:
    """Lines seen with a label, with a node in it, and selected."""

    labelled: int = 0
    with_node: int = 0
    selected: int = 0


#: A run of lines for one stream: (True: the batch script's, for stderr; False: the selection's), the bytes.
Run = tuple[bool, bytes]


class OutputFilter:
    """Feed it a job's output as it grows; it returns, in order, runs of the selection's lines and of the
    batch script's."""

    def __init__(self, selection: Selection, counts: LineCounts | None = None) -> None:
        self.selection = selection
        self._pending = b""
        self._skipping = False
        # Shared by the filters of one job's files: what `note` says is about all of them.
        self.counts = counts if counts is not None else LineCounts()

    def feed(self, chunk: bytes) -> list[Run]:
        if self._skipping:
            if b"\n" not in chunk:
                return []
            chunk = chunk.split(b"\n", 1)[1]
            self._skipping = False
        *lines, self._pending = (self._pending + chunk).split(b"\n")
        if len(self._pending) > MAX_PENDING:
            # Longer than any line the launcher writes: not a process's. Its rest, up to the next newline,
            # must not pass for a line of its own (it may start with anything).
            self._pending, self._skipping = b"", True
        return self._select(lines, b"\n")

    def finish(self) -> list[Run]:
        """The last line, if the output does not end with a newline (yet)."""
        rest, self._pending = self._pending, b""
        return self._select([rest], b"") if rest else []

    def _select(self, lines: list[bytes], end: bytes) -> list[Run]:
        tagged: list[Run] = []
        want_rank = None if self.selection.rank is None else str(self.selection.rank)
        for line in lines:
            source = line_source(line)
            if source is None:
                if line.startswith(BATCH_LINE_START):
                    tagged.append((True, line + end))
                continue
            node, rank = source
            self.counts.labelled += 1
            self.counts.with_node += node is not None
            if (want_rank is None or rank == want_rank) and self.selection.node in (None, node):
                self.counts.selected += 1
                tagged.append((False, line + end))
        return [(batch, b"".join(line for _, line in run)) for batch, run in groupby(tagged, key=itemgetter(0))]

    def note(self, job_id: str) -> str | None:
        """Why nothing was printed, when nothing was."""
        if self.counts.selected:
            return None
        if not self.counts.labelled:
            return (f"dlsub: no line of job {job_id}'s output carries a rank: a job with one training process "
                    f"writes its lines unlabelled (`dlsub logs {job_id}` shows them)")
        if self.selection.node is not None and not self.counts.with_node:
            return (f"dlsub: job {job_id} ran on one node: its lines carry a rank and no node name "
                    f"(use --rank alone)")
        return f"dlsub: no line of job {job_id}'s output came from {self.selection.describe()}"


class LogPrinter:
    """Prints chunks of a job's output files: as they come without a selection (as ``dlsub logs`` always has),
    else the selection's lines on ``out`` and the batch script's on ``err``.

    Each chunk names its file (``source``). With ``whole_lines`` (a job with several files: an elastic job's
    workers write their own) nothing is printed before its line ends, so one file's partial line is never
    glued to another's; :meth:`close` prints a file's unfinished last line.
    """

    def __init__(self, selection: Selection | None, out: TextIO, err: TextIO, whole_lines: bool = False) -> None:
        self.selection = selection
        self.whole_lines = whole_lines
        self.out, self.err = out, err
        self._counts = LineCounts()
        self._filters: dict[str, OutputFilter] = {}
        self._pending: dict[str, bytes] = {}

    def chunk(self, data: bytes, source: str = "") -> None:
        if self.selection is not None:
            self._print(self._filter(source).feed(data))
        elif not self.whole_lines:
            self._write(self.out, data)
        else:
            held = self._pending.pop(source, b"") + data
            cut = held.rfind(b"\n") + 1
            if len(held) - cut > MAX_PENDING:  # no line is this long: print it as it comes
                cut = len(held)
            self._write(self.out, held[:cut])
            if cut < len(held):
                self._pending[source] = held[cut:]

    def close(self, source: str = "") -> None:
        """The file's last line, though it has no newline (yet); it is printed with one when another file
        follows it."""
        if self.selection is not None:
            if source in self._filters:
                runs = self._filters.pop(source).finish()
                self._print([(batch, data if data.endswith(b"\n") or not self.whole_lines else data + b"\n")
                             for batch, data in runs])
            return
        rest = self._pending.pop(source, b"")
        if rest:
            self._write(self.out, rest + b"\n" if self.whole_lines else rest)

    def end(self, job_id: str) -> None:
        for source in [*self._filters, *self._pending]:
            self.close(source)
        if self.selection is None:
            return
        note = OutputFilter(self.selection, self._counts).note(job_id)
        if note:
            print(note, file=self.err)

    def _filter(self, source: str) -> OutputFilter:
        assert self.selection is not None
        if source not in self._filters:
            self._filters[source] = OutputFilter(self.selection, self._counts)
        return self._filters[source]

    def _print(self, runs: list[Run]) -> None:
        for batch, data in runs:
            self._write(self.err if batch else self.out, data)

    @staticmethod
    def _write(stream: TextIO, data: bytes) -> None:
        if data:
            stream.write(data.decode("utf-8", errors="replace"))
            stream.flush()
