"""Integration (live Slurm testbed + rootless Podman + the agent service), in a real browser: Playwright
(PyPI) driving Debian's chromium, headless. `dlsub dashboard` runs as `dltest` and as `dltest2`, each
with its own token. While a job of `dltest` runs, its progress bar advances with no reload (htmx); the
job page's loss chart has drawn points; `dltest2`'s dashboard answers 404 for that job; a request
without the token is refused; the cluster page shows the testbed's partitions and their GPUs as sinfo
counts them. Screenshots go to $DLSUB_SCREENSHOTS (default /tmp/dlsub-screenshots), outside the checkout.
"""

from __future__ import annotations

import os
import re
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from livebed import TestbedUser, put, sinfo_gpus, wait_for

CHROMIUM = "/usr/bin/chromium"
SHOTS = Path(os.environ.get("DLSUB_SCREENSHOTS", "/tmp/dlsub-screenshots"))
BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run"]

# Reports a step every 0.4 s with its loss, towards a declared total: about 30 s of training.
TRAIN = """
import time
from dlsub import checkpointing

run = checkpointing.init(total_steps=75)
state = run.restore() or {"step": 0}
for step in range(state["step"], 75):
    time.sleep(0.4)
    run.report(step=step + 1, loss=2.0 / (step + 2), samples=(step + 1) * 32)
    if run.should_stop():
        run.save({"step": step + 1})
        run.exit_for_resume()
run.finish()
"""


@dataclass
class Served:
    url: str  # http://127.0.0.1:PORT/
    token: str
    process: subprocess.Popen[str]


def start_dashboard(who: TestbedUser) -> Served:
    """`dlsub dashboard` as ``who``, as they would start it on a login node; its first line is the URL."""
    process = subprocess.Popen(["dlsub", "dashboard", "--refresh", "1"], user=who.uid, group=who.gid,
                               extra_groups=[], env=who.env, cwd=who.home, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    first = process.stdout.readline()
    found = re.search(r"(http://127\.0\.0\.1:\d+/)\?token=(\S+)", first)
    if not found:
        process.kill()
        raise AssertionError(f"dlsub dashboard printed {first!r}{process.stdout.read()}")
    rest = process.stdout.readline()
    assert f"ssh -N -L {found.group(1).split(':')[2].rstrip('/')}:127.0.0.1:" in rest
    return Served(found.group(1), found.group(2), process)


def stop(served: Served) -> None:
    served.process.terminate()
    try:
        served.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        served.process.kill()
        served.process.wait()


def fetch(url: str, token: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture(scope="module")
def dashboards(user: TestbedUser, user2: TestbedUser) -> Iterator[tuple[Served, Served]]:
    mine, theirs = start_dashboard(user), start_dashboard(user2)
    yield mine, theirs
    stop(mine)
    stop(theirs)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: testbed/up.sh installs Debian's chromium package")
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=BROWSER_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def running_job(user: TestbedUser) -> Iterator[dict[str, Any]]:
    """A job of `dltest` that is running and has reported a few steps."""
    import shutil
    import tempfile

    workdir = Path(tempfile.mkdtemp(prefix="dlsub-it-", dir=user.home))  # shared with the nodes, as conftest's
    os.chown(workdir, user.uid, user.gid)
    workdir.chmod(0o755)
    script = put(user, workdir / "train_dash.py", TRAIN)
    job = user.submit("-J", "dash-it", str(script), cwd=workdir)
    wait_for("the job to report steps",
             lambda: (s := user.status(job["id"]))["state"] == "RUNNING" and (s["step"] or 0) >= 3, timeout=150)
    yield job
    user.dlsub("cancel", job["id"], check=False)
    shutil.rmtree(workdir, ignore_errors=True)


def test_without_the_token_every_page_is_refused(dashboards: tuple[Served, Served],
                                                 running_job: dict[str, Any], browser: Any) -> None:
    mine, _ = dashboards
    for path in ("", "cluster", f"jobs/{running_job['id']}", "fragments/jobs", "simulate"):
        code, body = fetch(mine.url + path)
        assert code == 403, path
        assert running_job["id"] not in body and "dash-it" not in body
    code, _ = fetch(mine.url + "?token=not-the-token")
    assert code == 403
    page = browser.new_page()
    response = page.goto(mine.url)
    assert response.status == 403 and page.title().startswith("Token needed")
    assert page.get_by_label("Token").count() == 1
    page.screenshot(path=str(SHOTS / "token-refused.png"))
    page.close()


def test_the_progress_bar_advances_without_a_reload(dashboards: tuple[Served, Served],
                                                    running_job: dict[str, Any], browser: Any) -> None:
    mine, _ = dashboards
    page = browser.new_page(viewport={"width": 1280, "height": 720})
    page.goto(f"{mine.url}?token={mine.token}")
    assert page.title() == "My jobs · dlsub"
    bar = f"#progress-{running_job['id']}"
    page.wait_for_selector(bar)
    first = int(page.eval_on_selector(bar, "e => e.value"))
    page.evaluate("window.__notReloaded = true")
    page.wait_for_function(f"() => document.querySelector('{bar}') && document.querySelector('{bar}').value > {first}",
                           timeout=30_000)
    second = int(page.eval_on_selector(bar, "e => e.value"))
    assert second > first
    assert page.evaluate("window.__notReloaded === true"), "htmx swapped the table: the page was not reloaded"
    assert page.get_by_label("Show jobs alive or ended since").count() == 1
    page.screenshot(path=str(SHOTS / "my-jobs.png"), full_page=True)
    page.close()


def test_the_job_page_draws_the_loss_curve(dashboards: tuple[Served, Served], running_job: dict[str, Any],
                                           browser: Any) -> None:
    mine, _ = dashboards
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    page.goto(f"{mine.url}jobs/{running_job['id']}?token={mine.token}")
    assert page.title() == f"Job {running_job['id']} · dlsub"
    points = page.locator("#loss-chart circle.point")
    wait_for("points on the loss chart", lambda: points.count() >= 3, timeout=20, interval=0.5)
    box = page.locator("#loss-chart").bounding_box()
    assert box is not None and box["width"] > 200 and box["height"] > 80, "the chart is drawn, not hidden"
    assert page.locator("#throughput-chart circle.point").count() >= 2
    page.screenshot(path=str(SHOTS / "job.png"), full_page=True)
    page.close()


def test_another_users_job_is_not_found(dashboards: tuple[Served, Served], running_job: dict[str, Any]) -> None:
    mine, theirs = dashboards
    assert fetch(f"{mine.url}jobs/{running_job['id']}", mine.token)[0] == 200
    code, body = fetch(f"{theirs.url}jobs/{running_job['id']}", theirs.token)
    assert code == 404 and "dash-it" not in body
    assert running_job["id"] not in fetch(f"{theirs.url}?since=all", theirs.token)[1]
    # And one dashboard's token is no key to the other.
    assert fetch(theirs.url, mine.token)[0] == 403


def test_the_cluster_page_shows_partitions_and_gpus(dashboards: tuple[Served, Served], browser: Any) -> None:
    mine, _ = dashboards
    expected = sinfo_gpus()
    assert {"cpu", "gpu", "gpu-dev"} <= set(expected)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{mine.url}cluster?token={mine.token}")
    assert page.title() == "Cluster · dlsub"
    for partition, gpus in expected.items():
        row = page.locator(f'tr[data-partition="{partition}"]')
        assert row.count() == 1, partition
        assert row.locator("td.gpus").inner_text().strip() == str(gpus), partition
    assert "The agent" in page.content()
    page.screenshot(path=str(SHOTS / "cluster.png"), full_page=True)
    page.close()
