"""Strict parsing of admin-written tables (policy.toml, cluster files): one wording for unknown keys."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def unknown_keys(where: str, table: Mapping[str, Any], valid: Iterable[str]) -> str | None:
    """The error message for keys of ``table`` not in ``valid`` (listing the valid ones), or None."""
    valid = sorted(valid)
    unknown = sorted(set(table) - set(valid))
    if not unknown:
        return None
    return (f"{where}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
            f"valid keys: {', '.join(valid)}")


def read_toml(path: Any, what: str, error: type[ValueError]) -> dict[str, Any]:
    """A TOML file as a dict; ``error`` (with ``what`` the file is) when it cannot be read or parsed."""
    import tomllib

    try:
        return tomllib.loads(path.read_text())
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{path}: not valid TOML: {exc}") from None
