"""Whether a training script uses dlsub's library, read from its text (never run: it is the user's code).

A script uses it when it imports ``dlsub.checkpointing`` in any of the
documented ways (docs/user-guide.md, examples/): ``from dlsub import
checkpointing``, ``import dlsub.checkpointing``, ``from dlsub.checkpointing
import ...``, or an adapter or helper under it (``dlsub.checkpointing.lightning``,
``.hf_trainer``, ``.sharded``). Anything else (a plain PyTorch loop) cannot
checkpoint through dlsub: no move, continuation or resize keeps its progress.

This is submit's guess, to warn the user early; it can be wrong both ways (a
script that imports a module of its own which uses the library reads as
plain). The agent decides on what the job does: its training writes the
library's start event, or not (:func:`dlsub.policies.actions.move_rules.uses_no_library`).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

LIBRARY = "dlsub.checkpointing"
#: A script longer than this is read this far only (a training script is far shorter).
MAX_BYTES = 4 << 20
#: Where the text does not parse as Python: any mention of the library's module counts.
_MENTION = re.compile(r"\bdlsub\s*\.\s*checkpointing\b|\bfrom\s+dlsub\s+import\s+[^\n]*\bcheckpointing\b")


def _is_library(module: str) -> bool:
    return module == LIBRARY or module.startswith(LIBRARY + ".")


def uses_library(text: str) -> bool:
    """Whether the script ``text`` imports dlsub's checkpointing library (or one of its adapters)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return bool(_MENTION.search(text))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(_is_library(alias.name) for alias in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            if _is_library(node.module):
                return True
            if node.module == "dlsub" and any(alias.name in ("checkpointing", "*") for alias in node.names):
                return True
        # importlib.import_module("dlsub.checkpointing"), __import__("dlsub.checkpointing.lightning")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _is_library(node.value):
            return True
    return False


def script_uses_library(script: Path) -> bool:
    """:func:`uses_library` of the file ``script`` (its first :data:`MAX_BYTES`); an unreadable file reads
    as using it, so that no note is made up (submit's own checks say what is wrong with the file)."""
    try:
        with open(script, "rb") as f:
            raw = f.read(MAX_BYTES)
    except OSError:
        return True
    return uses_library(raw.decode("utf-8", errors="replace"))


__all__ = ["LIBRARY", "script_uses_library", "uses_library"]
