"""Unit (files only): the README is the front page. Its first block is still the two set-up commands CI and
new users run (the first the main job, the second the tests), it links into both guides, and every
relative link of the README and the guides reaches a file, and every #anchor a heading of its page."""

from __future__ import annotations

import re

from conftest import REPO

PAGES = [REPO / "README.md", REPO / "docs" / "user-guide.md", REPO / "docs" / "admin-guide.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The page without its fenced blocks (code may hold anything that looks like a link)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _anchors(text: str) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation but - and _ dropped, spaces to -."""
    return {re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            for line in _prose(text).splitlines() if re.match(r"#{1,6} ", line)}


def test_the_first_block_is_the_two_setup_commands() -> None:
    block = re.search(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    assert block
    lines = block.group(1).splitlines()
    assert [line.split("#")[0].strip() for line in lines] == ["make demo", "make test"]


def test_the_readme_links_into_both_guides() -> None:
    links = LINK.findall((REPO / "README.md").read_text())
    assert "docs/user-guide.md" in links and "docs/admin-guide.md" in links


def test_every_relative_link_and_anchor_resolves() -> None:
    broken = []
    for page in PAGES:
        for target in LINK.findall(_prose(page.read_text())):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto: not checked here
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in _anchors(file.read_text()):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert broken == []


def test_the_anchor_reader_follows_githubs_rule() -> None:
    assert _anchors("# A b\n## Knowing before the run: `dlsub estimate`\n```\n# not a heading\n```\n") == \
        {"a-b", "knowing-before-the-run-dlsub-estimate"}
