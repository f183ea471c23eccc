"""The one way a command fails: ``dlsub: error: ...`` on stderr and an exit code (2: the user can fix it)."""

from __future__ import annotations

import sys
from typing import NoReturn

import click


def fail(message: str, code: int = 2) -> NoReturn:
    click.echo(f"dlsub: error: {message}", err=True)
    sys.exit(code)
