"""``#DLSUB`` lines: submit options written in the training script, as ``#SBATCH`` lines are for sbatch.

::

    #!/usr/bin/env python3
    #DLSUB --gpus 2 --time 1:00:00
    #DLSUB --mode immediate   # a trailing comment is fine
    '''My training script.'''

They are read from the script's first comment block (after an optional
shebang; blank lines allowed), up to the first line that is neither a
comment nor blank, and split with :mod:`shlex`. Each holds options only,
the same as ``dlsub submit`` takes before SCRIPT; the command line wins.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

PREFIX = "#DLSUB"
#: Read no further into a script than this (the header is at the top).
MAX_HEADER_BYTES = 64 * 1024


class DirectiveError(ValueError):
    """A ``#DLSUB`` line that cannot be used; the message names the line and the fix."""


@dataclass(frozen=True)
class Directive:
    line: int  # 1-based, in the script
    text: str
    words: tuple[str, ...]


def read_directives(script: Path) -> list[Directive]:
    """The ``#DLSUB`` lines of ``script``'s header, split into words."""
    try:
        with open(script, "rb") as f:
            head = f.read(MAX_HEADER_BYTES)
    except OSError:
        return []  # the submit's own script check says what is wrong
    found: list[Directive] = []
    for number, raw in enumerate(head.decode("utf-8", errors="replace").splitlines(), start=1):
        line = raw.strip()
        if number == 1 and line.startswith("#!"):
            continue
        if not line:
            continue
        if not line.startswith("#"):
            break
        if not line.upper().startswith(PREFIX):
            continue
        if not line.startswith(PREFIX):
            raise DirectiveError(f"{script.name} line {number}: {line!r}: write #DLSUB in capitals")
        if line != PREFIX and line[len(PREFIX)] not in " \t":
            raise DirectiveError(f"{script.name} line {number}: {line!r}: put a space after #DLSUB")
        try:
            words = tuple(shlex.split(line[len(PREFIX):], comments=True))
        except ValueError as exc:
            raise DirectiveError(f"{script.name} line {number}: {line!r}: {exc} (close the quote)") from exc
        if words:
            found.append(Directive(number, line, words))
    return found
