"""Unit (files only, no live testbed): the testbed's bring-up performs the admin guide's steps.

docs/admin-guide.md marks each site step, a fenced ``bash`` block, with an HTML comment just before it:

    <!-- site-step: testbed/SCRIPT | A LINE OF THAT SCRIPT -->    the testbed performs it there
    <!-- site-step: none | why not -->                            the testbed does not (and says why)

Every ``bash`` block must carry one, every named script must exist under testbed/ and still contain the
line, so renaming or removing a step in the testbed (or adding a site step to the guide without saying
where the testbed does it) fails here. The guide's other claims about files are checked where they are
cheap: every repository path it names exists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO

GUIDE = REPO / "docs" / "admin-guide.md"
MARKER = re.compile(r"^<!-- site-step: (?P<where>[^|]+?) \| (?P<what>.+?) -->$")


@dataclass(frozen=True)
class SiteStep:
    line: int  # of the marker, 1-based
    where: str  # testbed/SCRIPT, or "none"
    what: str  # a line of that script, or why the testbed does not do it
    block: str  # the step's commands


def site_steps(text: str) -> tuple[list[SiteStep], list[int]]:
    """The marked steps, and the lines of ``bash`` blocks that carry no marker."""
    lines = text.splitlines()
    steps: list[SiteStep] = []
    unmarked: list[int] = []
    pending: tuple[int, re.Match[str]] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("<!-- site-step"):
            match = MARKER.match(line)
            assert match, f"docs/admin-guide.md:{i + 1}: a site-step marker not of the form " \
                          "'<!-- site-step: testbed/SCRIPT | LINE -->': {line!r}"
            pending = (i + 1, match)
        elif line.startswith("```"):
            info = line[3:].strip()
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            if info == "bash":
                if pending is None:
                    unmarked.append(i + 1)
                else:
                    steps.append(SiteStep(pending[0], pending[1]["where"], pending[1]["what"],
                                          "\n".join(lines[i + 1:end])))
            else:
                assert pending is None, f"docs/admin-guide.md:{pending[0]}: a site-step marker before a " \
                                        f"```{info} block: steps are bash blocks"
            pending = None
            i = end
        elif line.strip() and pending is not None:
            raise AssertionError(f"docs/admin-guide.md:{pending[0]}: a site-step marker not just before its "
                                 "bash block")
        i += 1
    return steps, unmarked


def problems(steps: list[SiteStep], repo: Path) -> list[str]:
    """What is wrong with each step's claim about the testbed."""
    found = []
    for step in steps:
        if step.where == "none":
            if len(step.what.split()) < 4:
                found.append(f"line {step.line}: a step the testbed does not perform says why in a few words")
            continue
        script = repo / step.where
        if not step.where.startswith("testbed/") or not script.is_file():
            found.append(f"line {step.line}: {step.where} is not a script under testbed/")
        elif step.what not in script.read_text():
            found.append(f"line {step.line}: {step.where} no longer has {step.what!r}")
    return found


def test_every_site_step_names_a_line_the_testbed_runs() -> None:
    steps, unmarked = site_steps(GUIDE.read_text())
    assert unmarked == [], f"bash blocks of docs/admin-guide.md without a site-step marker, at lines {unmarked}"
    assert problems(steps, REPO) == []
    performed = [s for s in steps if s.where != "none"]
    # The guide's host roles each have steps the testbed performs (a guide with no markers would pass vacuously).
    assert len(performed) >= 15, len(performed)
    assert {s.where for s in performed} >= {"testbed/up.sh", "testbed/accounting.sh", "testbed/agent.sh",
                                             "testbed/install-dlsub.sh", "testbed/down.sh"}


def test_a_step_renamed_away_from_the_testbed_fails(tmp_path: Path) -> None:
    """The check against a copy of testbed/ where one step's line was renamed, and one script removed."""
    steps, _ = site_steps(GUIDE.read_text())
    (tmp_path / "testbed").mkdir()
    for script in (REPO / "testbed").glob("*.sh"):
        (tmp_path / "testbed" / script.name).write_text(script.read_text())
    accounting = tmp_path / "testbed" / "accounting.sh"
    accounting.write_text(accounting.read_text().replace("set adminlevel=Operator", "set adminlevel=Op"))
    (tmp_path / "testbed" / "down.sh").unlink()
    found = problems(steps, tmp_path)
    assert any("accounting.sh no longer has" in p and "adminlevel=Operator" in p for p in found), found
    assert any("testbed/down.sh is not a script" in p for p in found), found


@pytest.mark.parametrize("text, expected", [
    ("<!-- site-step: testbed/up.sh | x -->\n```bash\nls\n```\n", ([("testbed/up.sh", "x", "ls")], [])),
    ("```bash\nls\n```\n", ([], [1])),
    ("    <!-- site-step: testbed/up.sh | an example in prose -->\n```bash\nls\n```\n", ([], [2])),
    ("```ini\nA=1\n```\n", ([], [])),
])
def test_the_marker_reader(text: str, expected: tuple[list[tuple[str, str, str]], list[int]]) -> None:
    steps, unmarked = site_steps(text)
    assert ([(s.where, s.what, s.block) for s in steps], unmarked) == expected


def test_a_marker_away_from_its_block_is_refused() -> None:
    with pytest.raises(AssertionError, match="not just before"):
        site_steps("<!-- site-step: testbed/up.sh | x -->\nsome prose\n```bash\nls\n```\n")


def test_every_repository_path_the_guide_names_exists() -> None:
    text = GUIDE.read_text()
    named = set(re.findall(r"`((?:agent|cli|job|containers|checkpointing|dashboard|site_config|slurm_plugins|"
                           r"testbed|etc|tests|docs|dlsub|policies)/[\w./-]*)`", text))
    missing = sorted(p for p in named if not (REPO / p.rstrip("/")).exists() and not p.startswith("dlsub/slurm"))
    assert len(named) > 20
    assert missing == []


def test_the_units_the_guide_installs_are_the_shipped_ones() -> None:
    text = GUIDE.read_text()
    for name in ("dlsub-agent.service", "dlsub-dashboard.service"):
        assert f"etc/systemd/{name}" in text
    assert "docs/admin-guide.md" in (REPO / "etc" / "systemd" / "dlsub-dashboard.service").read_text()
