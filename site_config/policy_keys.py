"""Every key of policy.toml with its type, its default and what it does, read from the code: the dataclasses
of :mod:`dlsub.site_config.policy_file` (and :mod:`~dlsub.site_config.budget`) and the comment above each
field. ``docs/policy-keys.md`` is this module's output (``python -m dlsub.site_config.policy_keys``, or
``... policy_keys .`` in a checkout, against its example); a unit
test keeps the two the same, so the table cannot drift from what dlsub does when a key is left out.

A default here is the code's: ``etc/policy.toml.example`` sets some keys to other values (it shows a site's
choices), and the table says which and to what."""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import MISSING, dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

from dlsub.site_config.budget import Budget, Budgets
from dlsub.site_config.policy_file import (
    _TOML_KEYS,
    NODE_LOCAL_PATHS,
    AgentPolicy,
    Backfill,
    ContainerSite,
    Failover,
    GoodputSettings,
    GpuTypePrice,
    Limits,
    MetricsPolicy,
    Moves,
    PartitionRole,
    Retention,
    SitePaths,
    TimeLimits,
    Window,
)

#: The tables in the order the example file has them: (the table as TOML names it, its dataclass, the fields
#: that are tables of their own and so are not keys of it).
TABLES: tuple[tuple[str, type, frozenset[str]], ...] = (
    ("", AgentPolicy, frozenset()),
    ("partitions.NAME", PartitionRole, frozenset()),
    ("gpu_types.NAME", GpuTypePrice, frozenset()),
    ("moves", Moves, frozenset()),
    ("goodput", GoodputSettings, frozenset()),
    ("time_limits", TimeLimits, frozenset()),
    ("limits", Limits, frozenset()),
    ("retention", Retention, frozenset()),
    ("budgets", Budgets, frozenset({"users", "accounts"})),
    ("budgets.users.NAME / budgets.accounts.NAME", Budget, frozenset()),
    ("metrics", MetricsPolicy, frozenset()),
    ("failover", Failover, frozenset()),
    ("backfill", Backfill, frozenset({"windows"})),
    ("[backfill.window]", Window, frozenset()),
    ("containers", ContainerSite, frozenset()),
    ("site", SitePaths, frozenset()),
)

#: Defaults the code writes as None and reads as a value: the value.
EFFECTIVE: dict[tuple[type, str], Any] = {(SitePaths, "node_local_paths"): NODE_LOCAL_PATHS}

_FIELD = re.compile(r"^    (\w+): ([^=]+?)(?: = (.*?))?(?:\s+#\s*(.*))?$")
_COMMENT = re.compile(r"^    #\s?(.*)$")


@dataclass(frozen=True)
class Key:
    table: str
    name: str  # as policy.toml spells it
    kind: str
    default: Any  # the code's value; MISSING: the key is required
    what: str

    @property
    def default_text(self) -> str:
        return "(required)" if self.default is MISSING else toml_value(self.default, self.kind)


def _comments(cls: type) -> dict[str, str]:
    """Each field's comment in the class's source: the comment lines right above it, and its line's own."""
    found: dict[str, str] = {}
    pending: list[str] = []
    for line in inspect.getsource(cls).splitlines():
        comment = _COMMENT.match(line)
        if comment:
            pending.append(comment.group(1))
            continue
        field_line = _FIELD.match(line)
        if field_line:
            found[field_line.group(1)] = " ".join([*pending, *(field_line.group(4) or "",)]).strip()
        pending = []
    return found


def _kind(hint: str) -> str:
    hint = hint.replace(" ", "")
    if hint.startswith("tuple[tuple[str,str]"):
        return "table of strings"
    return {"str": "string", "float": "number", "int": "integer", "bool": "boolean", "float|None": "number",
            "tuple[str,...]": "list of strings", "tuple[str,...]|None": "list of strings"}.get(hint, hint)


def toml_value(value: Any, kind: str = "") -> str:
    """A value as policy.toml writes it (``kind``: the key's, which tells an empty table from a list)."""
    if value is None:
        return "(none)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, dict) or kind == "table of strings":
        pairs = sorted(value.items()) if isinstance(value, dict) else value
        return "{ " + ", ".join(f'{k} = "{v}"' for k, v in pairs) + " }" if pairs else "{}"
    if isinstance(value, tuple | list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _default(field: dataclasses.Field[Any]) -> Any:
    if field.default is not MISSING:
        return field.default
    if field.default_factory is not MISSING:
        return field.default_factory()
    return MISSING


def same_value(example: Any, default: Any) -> bool:
    """Whether the example sets a key to its default (a TOML list or table against the code's tuple)."""
    if isinstance(example, dict):
        example = tuple(sorted(example.items()))
    if isinstance(example, list):
        example = tuple(example)
    return bool(example == default)


def keys() -> Iterator[Key]:
    """Every key, table by table, with the code's default."""
    for table, cls, tables in TABLES:
        renames = {field: spelled for spelled, field in _TOML_KEYS.get(cls.__name__, {}).items()}
        comments = _comments(cls)
        for field in fields(cls):
            if field.name in tables or dataclasses.is_dataclass(field.default) or field.name in (
                    "partitions", "gpu_types", "budgets"):
                continue
            default = EFFECTIVE.get((cls, field.name), _default(field))
            yield Key(table, renames.get(field.name, field.name), _kind(str(field.type)), default,
                      comments.get(field.name, "").replace("``", "`"))


def example_values(text: str) -> dict[tuple[str, str], Any]:
    """The keys the example file sets, by (table as in :data:`TABLES`, key): partitions, GPU kinds and budget
    holders are read as their NAME table, windows as the window table."""
    data = tomllib.loads(text)
    found: dict[tuple[str, str], Any] = {}

    def table_of(path: tuple[str, ...]) -> str:
        if path[:1] in (("partitions",), ("gpu_types",)) and len(path) == 2:
            return f"{path[0]}.NAME"
        if path[:1] == ("budgets",) and len(path) == 3:
            return "budgets.users.NAME / budgets.accounts.NAME"
        return ".".join(path)

    def walk(path: tuple[str, ...], value: Mapping[str, Any]) -> None:
        for key, item in value.items():
            if key in ("partition_images", "environment") or not isinstance(item, dict | list) or (
                    isinstance(item, list) and not any(isinstance(i, dict) for i in item)):
                found[(table_of(path), key)] = item
            elif isinstance(item, dict):
                walk((*path, key), item)
            else:
                for entry in item:
                    walk(("[backfill.window]",) if path == ("backfill",) and key == "window" else (*path, key), entry)

    walk((), data)
    return found


def render(example: str) -> str:
    """docs/policy-keys.md: one table per policy.toml table, each key with its type, default and purpose, and
    what ``etc/policy.toml.example`` sets it to where that differs."""
    set_there = example_values(example)
    lines = ["# policy.toml: every key and its default", "",
             "Generated from the code by `python -m dlsub.site_config.policy_keys` (a unit test checks it is up",
             "to date). A key left out of `/etc/dlsub/policy.toml` takes the default below; `dlsub config check",
             "FILE` checks a file. *Example* is what `etc/policy.toml.example` sets where it differs from the",
             "default (a site's choices, not dlsub's).", ""]
    current = None
    for key in keys():
        if key.table != current:
            current = key.table
            title = "top level" if not key.table else (key.table if key.table.startswith("[") else f"[{key.table}]")
            lines += ["", f"## {title}", "", "| key | type | default | example | what it does |",
                      "|---|---|---|---|---|"]
        shown = set_there.get((key.table, key.name), MISSING)
        there = "" if shown is MISSING or same_value(shown, key.default) else f"`{toml_value(shown, key.kind)}`"
        what = key.what.replace("|", "\\|")
        lines.append(f"| `{key.name}` | {key.kind} | `{key.default_text}` | {there} | {what} |")
    return "\n".join(lines) + "\n"


#: Where the example and the generated table live in a checkout.
EXAMPLE = Path("etc") / "policy.toml.example"
TABLE = Path("docs") / "policy-keys.md"


def main(argv: list[str]) -> int:
    """The table, against the example of a checkout (``argv[1]``) or, by default, the installed one."""
    example = (Path(argv[1]) / EXAMPLE).read_text() if len(argv) > 1 else \
        resources.files("dlsub.etc").joinpath(EXAMPLE.name).read_text(encoding="utf-8")
    sys.stdout.write(render(example))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
