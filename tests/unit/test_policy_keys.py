"""Unit tests (pure): docs/policy-keys.md, the table of every policy.toml key with its default, is what the code
says (site_config.policy_keys renders it from policy_file's dataclasses), every key the example file sets is
in it, and a key left out of a policy file takes the default the table gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlsub.site_config.policy_file import AgentPolicy, load_policy
from dlsub.site_config.policy_keys import EXAMPLE, TABLE, example_values, keys, render, toml_value

ROOT = Path(__file__).resolve().parents[2]


def test_the_table_in_docs_is_the_codes() -> None:
    assert (ROOT / TABLE).read_text() == render((ROOT / EXAMPLE).read_text()), (
        "docs/policy-keys.md is out of date: python -m dlsub.site_config.policy_keys > docs/policy-keys.md")


def test_every_key_the_example_sets_is_in_the_table_and_described() -> None:
    known = {(k.table, k.name) for k in keys()}
    assert set(example_values((ROOT / EXAMPLE).read_text())) <= known
    assert all(k.what for k in keys()), [k.name for k in keys() if not k.what]


def test_an_empty_file_takes_the_tables_defaults(tmp_path: Path) -> None:
    empty = tmp_path / "policy.toml"
    empty.write_text("")
    loaded = load_policy(empty)
    assert loaded == AgentPolicy()
    top = {k.name: k for k in keys() if k.table == ""}
    assert toml_value(loaded.tick_interval_s) == top["tick_interval_s"].default_text == "30"
    assert toml_value(loaded.moves.min_saving_s) == next(
        k.default_text for k in keys() if (k.table, k.name) == ("moves", "min_saving_s"))
    # Where the example differs from the code, the table says so.
    text = (ROOT / TABLE).read_text()
    assert '| `min_saving_s` | number | `60` | `120` |' in text
    assert '| `policy` | string | `"fifo"` | `"tiresias"` |' in text


def test_doctor_names_the_policy_file_read_and_where_the_shipped_site_files_are(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dlsub.cli.doctor import check_policy_file, shipped_site_files
    from dlsub.site_config.policy_file import policy_path

    shipped = shipped_site_files()
    for name in ("policy.toml.example", "systemd/dlsub-agent.service", "systemd/dlsub-dashboard.service",
                 "slurm/taskepilog.sh", "cron.d/dlsub-backfill"):
        assert (shipped / name).is_file(), name
    monkeypatch.setenv("DLSUB_POLICY", str(tmp_path / "none.toml"))
    missing = check_policy_file(policy_path(), shipped)
    assert missing.status == "warn" and "dlsub's defaults are in use" in missing.detail
    assert missing.fix.startswith(f"install -m 644 {shipped / 'policy.toml.example'} /etc/dlsub/policy.toml")
    there = tmp_path / "policy.toml"
    there.write_text('policy = "fifo"\n')
    monkeypatch.setenv("DLSUB_POLICY", str(there))
    found = check_policy_file(policy_path(), shipped)
    assert found.status == "ok" and found.detail.startswith(str(there))


def test_the_wheel_ships_every_site_file_but_the_testbeds() -> None:
    """pyproject's package-data for dlsub.etc matches every file of etc/ but etc/testbed/ (the testbed's own)."""
    import fnmatch
    import tomllib

    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["dlsub.etc"]
    for path in (ROOT / "etc").rglob("*"):
        relative = path.relative_to(ROOT / "etc").as_posix()
        if path.is_dir() or relative.startswith("testbed/") or "__pycache__" in relative or relative.endswith(".py"):
            continue
        assert any(fnmatch.fnmatch(relative, g) for g in globs), f"etc/{relative} is not in the wheel"
    assert not any(g.startswith("testbed") for g in globs)
