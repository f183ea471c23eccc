"""Unit, against the stateful fake Slurm (no browser): the dashboard's token gate, that a user sees only
their own jobs (another's id is a 404; an admin sees both), the pages' contents (progress, the loss
chart's drawn points, the cluster's partitions and GPUs, the simulate page), and the SVG charts."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import WEIRD_NAME
from fastapi.testclient import TestClient

from dlsub.cli.dashboard_command import banner
from dlsub.cli.main import main
from dlsub.contract import output_file
from dlsub.dashboard import charts
from dlsub.dashboard.app import AppConfig, create_app
from dlsub.dashboard.auth import TokenFileError, cookie_name, read_token_file
from dlsub.dashboard.data import Dashboard, Viewer, curves
from dlsub.job.output_files import worker_output_file
from dlsub.job.settings import Settings
from dlsub.job.user_store import JobStore
from dlsub.site_config.policy_file import AgentPolicy
from dlsub.slurm_plugins.client import SlurmClient
from dlsub.slurm_plugins.fake import FakeSlurm

TOKEN = "t0ken-" + "x" * 30
PORT = 8123


def submit(fake: FakeSlurm, tmp_path: Path, home: Path, name: str) -> dict[str, object]:
    os.environ["DLSUB_HOME"] = str(home)
    script = tmp_path / f"{name}.py"
    script.write_text("print('training')\n")
    out = json.loads(CliRunner().invoke(main, ["--json", "-J", name, str(script)], catch_exceptions=False).stdout)
    return out


def progress(job_dir: Path, steps: int, total: int = 100) -> None:
    now = time.time() - steps
    lines = [{"event": "progress", "time": now + i, "step": i * 10, "loss": 2.0 / (i + 1), "samples": i * 320,
              "total_steps": total, "attempt": "a-0"} for i in range(1, steps + 1)]
    (job_dir / "progress.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))


@pytest.fixture
def world(cli_env: FakeSlurm, tmp_path: Path) -> dict[str, object]:
    """Two users' stores: mine with a running job at 50 %, another's with a job of their own."""
    mine, theirs = tmp_path / "me", tmp_path / "them"
    job = submit(cli_env, tmp_path, mine, "mine")
    other = submit(cli_env, tmp_path, theirs, "theirs")
    os.environ["DLSUB_HOME"] = str(mine)
    cli_env.set_job_state(int(job["slurm_job_id"]), "RUNNING", nodes="cpu1")  # type: ignore[call-overload]
    progress(Path(str(job["job_dir"])), 5)
    return {"fake": cli_env, "job": job, "other": other, "mine": mine, "theirs": theirs, "tmp": tmp_path}


def client_for(world: dict[str, object], admin: bool = False) -> TestClient:
    fake = world["fake"]
    assert isinstance(fake, FakeSlurm)
    tmp = world["tmp"]
    assert isinstance(tmp, Path)
    theirs = world["theirs"]
    assert isinstance(theirs, Path)
    policy = AgentPolicy(socket=str(tmp / "no-agent.sock"))
    board = Dashboard(Viewer(os.getuid(), "me", admin), Settings(home=Path(str(world["mine"]))), policy,
                      client_factory=lambda: SlurmClient(runner=fake),
                      stores=lambda uid: [("them", theirs / "dlsub.db")])
    return TestClient(create_app(AppConfig(token=TOKEN, port=PORT, dashboard=board)))


def test_no_token_is_refused_and_shows_no_job(world: dict[str, object]) -> None:
    client = client_for(world)
    job_id = str(world["job"]["id"])  # type: ignore[index]
    for path in ("/", f"/jobs/{job_id}", "/fragments/jobs", "/cluster", "/simulate"):
        response = client.get(path)
        assert response.status_code == 403, path
        assert job_id not in response.text and "mine" not in response.text
        assert "<label for=\"token\">" in response.text
    wrong = client.get("/?token=nope", follow_redirects=False)
    assert wrong.status_code == 403 and "not this dashboard" in wrong.text
    # A cookie of another port's dashboard is no key here either.
    client.cookies.set(cookie_name(PORT + 1), TOKEN)
    assert client.get("/").status_code == 403


def test_the_token_sets_a_cookie_and_leaves_the_url(world: dict[str, object]) -> None:
    client = client_for(world)
    response = client.get("/?token=" + TOKEN + "&since=all", follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/?since=all"
    set_cookie = response.headers["set-cookie"].lower()
    assert "httponly" in set_cookie and "samesite=strict" in set_cookie
    page = client.get("/")
    assert page.status_code == 200
    assert client.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_my_jobs_shows_mine_with_progress_and_not_theirs(world: dict[str, object]) -> None:
    client = client_for(world)
    client.get("/?token=" + TOKEN)
    page = client.get("/").text
    job, other = world["job"], world["other"]
    assert f'href="/jobs/{job["id"]}"' in page  # type: ignore[index]
    assert str(other["id"]) not in page  # type: ignore[index]
    assert re.search(rf'<progress id="progress-{job["id"]}" max="100" value="50"', page)  # type: ignore[index]
    assert "<title>My jobs · dlsub</title>" in page
    assert '<label for="since">' in page
    fragment = client.get("/fragments/jobs").text
    assert "<html" not in fragment and f'progress-{job["id"]}' in fragment  # type: ignore[index]


def test_another_users_job_is_404_and_an_admin_sees_it(world: dict[str, object]) -> None:
    other_id = str(world["other"]["id"])  # type: ignore[index]
    client = client_for(world)
    client.get("/?token=" + TOKEN)
    response = client.get(f"/jobs/{other_id}")
    assert response.status_code == 404 and "theirs" not in response.text
    assert client.get(f"/fragments/jobs/{other_id}").status_code == 404
    assert client.get("/jobs/../../etc").status_code == 404
    admin = client_for(world, admin=True)
    admin.get("/?token=" + TOKEN)
    assert admin.get(f"/jobs/{other_id}").status_code == 200
    assert other_id in admin.get("/").text


def test_the_job_page_draws_the_loss_curve(world: dict[str, object]) -> None:
    client = client_for(world)
    client.get("/?token=" + TOKEN)
    page = client.get(f"/jobs/{world['job']['id']}").text  # type: ignore[index]
    loss_svg = re.search(r'<svg id="loss-chart".*?</svg>', page, re.S)
    assert loss_svg is not None
    assert loss_svg.group(0).count('class="point"') == 5, "one point per progress report with a loss"
    speed_svg = re.search(r'<svg id="throughput-chart".*?</svg>', page, re.S)
    assert speed_svg is not None and speed_svg.group(0).count('class="point"') == 4
    assert "the agent does not answer" in page  # no agent in a unit test: said, not hidden


def test_weird_paths_show_on_the_pages(cli_env: FakeSlurm, tmp_path: Path, weird_dir: Path) -> None:
    """A script in a folder of weird characters, DLSUB_HOME in one too (less the line break submit refuses):
    the pages find the job's files and show its name and output escaped."""
    home = tmp_path / WEIRD_NAME.replace("\n", " ") / "me"
    job = submit(cli_env, weird_dir, home, "<b>train<b> 'é' $x")
    job_dir = Path(str(job["job_dir"]))
    cli_env.set_job_state(int(job["slurm_job_id"]), "RUNNING", nodes="cpu1")  # type: ignore[call-overload]
    progress(job_dir, 5)
    output_file(job_dir, int(job["slurm_job_id"])).write_text("step 1 <script>alert(1)</script> é\n")  # type: ignore[call-overload]
    world = {"fake": cli_env, "mine": home, "theirs": tmp_path / "nobody", "tmp": tmp_path}
    client = client_for(world)
    client.get("/?token=" + TOKEN)
    listing = client.get("/").text
    assert f'href="/jobs/{job["id"]}"' in listing and "<td>&lt;b&gt;train&lt;b&gt; &#39;é&#39; $x</td>" in listing
    assert re.search(rf'<progress id="progress-{job["id"]}" max="100" value="50"', listing)
    page = client.get(f"/jobs/{job['id']}").text
    assert "step 1 &lt;script&gt;alert(1)&lt;/script&gt; é" in page and "<script>alert" not in page


def test_an_elastic_jobs_page_shows_each_workers_output(cli_env: FakeSlurm, tmp_path: Path) -> None:
    mine = tmp_path / "me"
    os.environ["DLSUB_HOME"] = str(mine)
    script = tmp_path / "train.py"
    script.write_text("print('training')\n")
    job = json.loads(CliRunner().invoke(main, ["--json", "--nodes", "1:2", str(script)],
                                        catch_exceptions=False).stdout)
    job_dir = Path(job["job_dir"])
    record = JobStore(Settings(home=mine).db_path).get(job["id"])
    assert record.worker_array_id is not None
    cli_env.set_job_state(int(job["slurm_job_id"]), "RUNNING", nodes="cpu1")
    output_file(job_dir, int(job["slurm_job_id"])).write_text("[cpu1/0]:main rank\n")
    worker_output_file(job_dir, record.worker_array_id, 0).write_text("[cpu2/1]:<i>worker</i> rank\n")
    client = client_for({"fake": cli_env, "mine": mine, "theirs": tmp_path / "nobody", "tmp": tmp_path})
    client.get("/?token=" + TOKEN)
    page = client.get(f"/jobs/{job['id']}").text
    assert "[cpu1/0]:main rank" in page
    assert f"Worker output: slurm-{record.worker_array_id}_0.out" in page
    assert "[cpu2/1]:&lt;i&gt;worker&lt;/i&gt; rank" in page


def test_the_cluster_page_shows_partitions_and_gpus(world: dict[str, object]) -> None:
    client = client_for(world)
    client.get("/?token=" + TOKEN)
    page = client.get("/cluster").text
    for name in ("cpu", "gpu", "gpu-dev"):
        assert f'data-partition="{name}"' in page
    gpu_row = re.search(r'data-partition="gpu">.*?</tr>', page, re.S)
    assert gpu_row is not None and '<td class="gpus">8</td>' in gpu_row.group(0)
    assert "The agent is not answering" in page


def test_the_simulate_page_runs_a_shipped_workload_and_refuses_others(world: dict[str, object]) -> None:
    client = client_for(world)
    client.get("/?token=" + TOKEN)
    page = client.get("/simulate", params={"workload": "pollux/workloads-0.5/workload-1.csv",
                                           "policy": ["fifo", "tiresias"]})
    assert page.status_code == 200, page.text
    jct = re.search(r'<svg id="jct-cdf".*?</svg>', page.text, re.S)
    assert jct is not None and jct.group(0).count('class="point"') > 50
    assert 'data-series="fifo"' in jct.group(0) and 'data-series="tiresias"' in jct.group(0)
    bad = client.get("/simulate", params={"workload": "/etc/passwd", "policy": "fifo"})
    assert bad.status_code == 400 and "unknown workload" in bad.text
    many = client.get("/simulate", params={"workload": "pollux/workloads-0.5/workload-1.csv",
                                           "policy": ["fifo", "rr", "efifo", "gang", "tiresias"]})
    assert many.status_code == 400 and "at most" in many.text


def test_charts_draw_every_point_and_escape_names() -> None:
    svg = charts.line_chart([charts.Series("<script>x</script>", [(0, 1), (1, 2), (2, 1.5)])],
                            title="Loss", x_label="step", y_label="loss", chart_id="c")
    assert svg.count('class="point"') == 3 and "<script>" not in svg
    empty = charts.line_chart([], title="Loss", x_label="step", y_label="loss", chart_id="c")
    assert "no data yet" in empty and 'class="point"' not in empty
    assert len(charts.thin([(float(i), 0.0) for i in range(5000)], 100)) == 100


def test_curves_split_attempts() -> None:
    events = [{"event": "progress", "time": 1e9 + i, "step": i, "loss": 1.0 / (i + 1), "attempt": a}
              for a, steps in (("x-0", range(0, 3)), ("x-1", range(3, 6))) for i in steps]
    loss, speed, unit = curves(events)
    assert list(loss) == ["x-0", "x-1"] and len(loss["x-1"]) == 3
    assert unit == "steps/s" and all(rate == 1.0 for _, rate in speed["x-0"])


def test_token_file_must_be_private(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("s3cret-" + "y" * 30 + "\n")
    path.chmod(0o644)
    with pytest.raises(TokenFileError, match="open to every user"):
        read_token_file(path)
    path.chmod(0o640)
    assert read_token_file(path) == "s3cret-" + "y" * 30
    path.write_text("short")
    with pytest.raises(TokenFileError, match="16 or more"):
        read_token_file(path)


def test_banner_has_the_url_and_the_ssh_line() -> None:
    text = banner(8123, "abc", "login1.example", "alice")
    assert "http://127.0.0.1:8123/?token=abc" in text
    assert "ssh -N -L 8123:127.0.0.1:8123 alice@login1.example" in text


def test_the_systemd_unit_runs_a_command_that_exists() -> None:
    """etc/systemd/dlsub-dashboard.service's ExecStart parses as `dlsub dashboard` options."""
    import shlex

    from dlsub.cli.dashboard_command import dashboard

    unit = (Path(__file__).resolve().parents[2] / "etc" / "systemd" / "dlsub-dashboard.service").read_text()
    line = next(x for x in unit.splitlines() if x.startswith("ExecStart="))
    argv = shlex.split(line.removeprefix("ExecStart="))
    assert argv[1] == "dashboard"
    ctx = dashboard.make_context("dashboard", argv[2:])
    assert ctx.params["token_file"] == Path("/etc/dlsub/dashboard.token") and ctx.params["port"] == 8765


def test_curves_split_an_elastic_jobs_sizes_and_the_page_names_them() -> None:
    """Unit (pure): a resize within one Slurm attempt starts a new series, named by its world size."""
    events = [{"event": "start", "time": 1.0, "attempt": "5-0", "world_size": 4},
              {"event": "progress", "time": 2.0, "step": 10, "loss": 1.0, "attempt": "5-0"},
              {"event": "start", "time": 3.0, "attempt": "5-0", "world_size": 8},
              {"event": "progress", "time": 4.0, "step": 20, "loss": 0.5, "attempt": "5-0"}]
    loss, _, _ = curves(events)
    assert loss == {"5-0 (world size 4)": [(10.0, 1.0)], "5-0 (world size 8)": [(20.0, 0.5)]}
    from dlsub.dashboard.app import job_charts
    from dlsub.dashboard.data import JobDetail
    detail = JobDetail.__new__(JobDetail)
    detail.loss, detail.throughput, detail.throughput_unit, detail.attempts = loss, {}, "samples/s", []
    svg = job_charts(detail)["loss_chart"]
    assert "attempt 1 (world size 4)" in svg and "attempt 1 (world size 8)" in svg
