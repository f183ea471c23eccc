"""The dashboard's web app (FastAPI): pages, the fragments htmx refreshes, and the token gate.

Rendering only: every read goes through :class:`dlsub.dashboard.data.Dashboard`
(the CLI's identity rules and status code) and the charts are
:mod:`dlsub.dashboard.charts`' SVG. Each page is whole without JavaScript;
the parts that change (the jobs table, a job's status, the cluster) are
also served alone under ``/fragments/`` for htmx's ``hx-trigger="every Ns"``.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from dlsub.dashboard import auth, charts
from dlsub.dashboard.data import Dashboard, JobDetail
from dlsub.dashboard.simulate import (
    MAX_POLICIES,
    Busy,
    PolicyRun,
    SimulateError,
    Simulator,
    cdf,
    policy_names,
    shipped_workloads,
)
from dlsub.job.status_window import DEFAULT_WINDOW_S, SinceError, parse_since

HERE = Path(__file__).resolve().parent
STATIC = HERE / "static"
#: Where install-dlsub.sh puts htmx (from the npm registry) beside the package's own assets.
HTMX_FILE = "htmx.min.js"


@dataclass
class AppConfig:
    token: str
    port: int
    dashboard: Dashboard
    simulator: Simulator = field(default_factory=Simulator)
    refresh_s: float = 2.0
    htmx: Path | None = None  # None: look beside the package's assets, then $DLSUB_HTMX_JS


def find_htmx() -> Path | None:
    for candidate in (STATIC / HTMX_FILE, Path(os.environ.get("DLSUB_HTMX_JS") or "/nonexistent")):
        if candidate.is_file():
            return candidate
    return None


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return f"{dt.datetime.fromtimestamp(float(ts)):%Y-%m-%d %H:%M:%S}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(round(float(seconds)))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def create_app(config: AppConfig) -> FastAPI:
    """The dashboard: the token gate in front of everything, then the pages, their fragments and assets."""
    app = FastAPI(title="dlsub dashboard", docs_url=None, redoc_url=None, openapi_url=None)
    pages = _Pages(config=config, board=config.dashboard, templates=_templates(), htmx=config.htmx or find_htmx())
    _add_token_gate(app, config, pages.templates)
    _add_job_routes(app, pages)
    _add_cluster_routes(app, pages)
    _add_simulate_route(app, pages)
    _add_asset_routes(app, pages.htmx)
    return app


def _templates() -> Jinja2Templates:
    """The package's templates, with the filters they format times with."""
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.filters["when"] = _when
    templates.env.filters["duration"] = _duration
    return templates


@dataclass(frozen=True)
class _Pages:
    """What the routes share: the app's configuration, its dashboard, the templates and htmx's file."""

    config: AppConfig
    board: Dashboard
    templates: Jinja2Templates
    htmx: Path | None

    def render(self, request: Request, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
        """Template ``name`` with ``context`` over what the layout needs: the viewer, htmx, the refresh."""
        base = {"viewer": self.board.viewer, "htmx": self.htmx is not None, "refresh_s": self.config.refresh_s,
                "now": time.time()}
        return self.templates.TemplateResponse(request, name, {**base, **context}, status_code=status_code)

    def job_or_404(self, request: Request, job_id: str) -> JobDetail | HTMLResponse:
        """The job's detail, or the 404 page when the viewer has no such job."""
        detail = self.board.job(job_id)
        if detail is None:
            return self.render(request, "not_found.html", title="No such job", job_id=job_id, status_code=404)
        return detail


# ---------------------------------------------------------------- the token gate
def _add_token_gate(app: FastAPI, config: AppConfig, templates: Jinja2Templates) -> None:
    """Let through only requests with the token (cookie or bearer header); trade ``?token=`` for the cookie."""
    cookie = auth.cookie_name(config.port)

    @app.middleware("http")
    async def token_gate(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        given = request.query_params.get(auth.TOKEN_PARAM)
        if given is not None and auth.matches(given, config.token):
            return _token_to_cookie(request, cookie, config.token)
        if request.url.path == "/static/dashboard.css":
            return await call_next(request)  # the token page's style: nothing of anyone's
        header = request.headers.get("authorization", "")
        bearer = header[7:] if header.lower().startswith("bearer ") else None
        if auth.matches(request.cookies.get(cookie), config.token) or auth.matches(bearer, config.token):
            return _private(await call_next(request))
        # No job, no name: only how to get in.
        return templates.TemplateResponse(request, "token.html", {"wrong": given is not None, "htmx": False},
                                          status_code=403)


def _token_to_cookie(request: Request, cookie: str, token: str) -> Response:
    """A redirect to the same page without ``?token=`` (so it stays out of history and referrers) that
    sets the cookie later requests carry instead."""
    rest = [(k, v) for k, v in request.query_params.multi_items() if k != auth.TOKEN_PARAM]
    target = request.url.path + (f"?{urlencode(rest)}" if rest else "")
    response: Response = RedirectResponse(target, status_code=303)
    response.set_cookie(cookie, token, httponly=True, samesite="strict", path="/")
    return response


def _private(response: Response) -> Response:
    """``response`` with headers that keep someone's jobs out of caches, sniffers, frames and referrers."""
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["Referrer-Policy"] = "no-referrer"
    return response


# ---------------------------------------------------------------- my jobs, a job
def _since_window(request: Request) -> tuple[float | None, str, str]:
    """(since, the filter's value, an error) from ?since= (default: the last day; "all": everything)."""
    text = request.query_params.get("since", "1d").strip() or "1d"
    if text == "all":
        return None, text, ""
    try:
        return parse_since(text, time.time()), text, ""
    except SinceError as exc:
        return time.time() - DEFAULT_WINDOW_S, "1d", str(exc)


def _add_job_routes(app: FastAPI, pages: _Pages) -> None:
    """The viewer's jobs (``/``) and one job (``/jobs/ID``), each with the fragment htmx refreshes."""

    @app.get("/", response_class=HTMLResponse)
    def jobs_page(request: Request) -> HTMLResponse:
        since, since_text, error = _since_window(request)
        return pages.render(request, "jobs.html", title="My jobs", jobs=pages.board.jobs(since), since=since_text,
                            error=error, status_code=400 if error else 200)

    @app.get("/fragments/jobs", response_class=HTMLResponse)
    def jobs_fragment(request: Request) -> HTMLResponse:
        since, since_text, _ = _since_window(request)
        return pages.render(request, "_jobs_table.html", jobs=pages.board.jobs(since), since=since_text)

    @app.get("/jobs/{job_id}", response_class=HTMLResponse)
    def job_page(request: Request, job_id: str) -> HTMLResponse:
        detail = pages.job_or_404(request, job_id)
        if isinstance(detail, HTMLResponse):
            return detail
        return pages.render(request, "job.html", title=f"Job {detail.view.status.id}", job=detail,
                            svg=job_charts(detail))

    @app.get("/fragments/jobs/{job_id}", response_class=HTMLResponse)
    def job_fragment(request: Request, job_id: str) -> HTMLResponse:
        detail = pages.job_or_404(request, job_id)
        if isinstance(detail, HTMLResponse):
            return detail
        return pages.render(request, "_job_live.html", job=detail, svg=job_charts(detail))


# ---------------------------------------------------------------- the cluster
def _add_cluster_routes(app: FastAPI, pages: _Pages) -> None:
    """The partitions and the agent's state (``/cluster``), with the fragment htmx refreshes."""

    @app.get("/cluster", response_class=HTMLResponse)
    def cluster_page(request: Request) -> HTMLResponse:
        rows, error = pages.board.cluster()
        return pages.render(request, "cluster.html", title="Cluster", partitions=rows, error=error,
                            agent=pages.board.agent_status())

    @app.get("/fragments/cluster", response_class=HTMLResponse)
    def cluster_fragment(request: Request) -> HTMLResponse:
        rows, error = pages.board.cluster()
        return pages.render(request, "_cluster_live.html", partitions=rows, error=error,
                            agent=pages.board.agent_status())


# ---------------------------------------------------------------- simulate
def _add_simulate_route(app: FastAPI, pages: _Pages) -> None:
    """``/simulate``: the form, and with ``?workload=`` the chosen policies' runs over it, charted."""

    @app.get("/simulate", response_class=HTMLResponse)
    def simulate_page(request: Request) -> HTMLResponse:
        workload = request.query_params.get("workload")
        chosen = request.query_params.getlist("policy")
        runs, error, code = _simulate(pages.config.simulator, workload, chosen)
        jct_chart, util_chart = _simulation_charts([r for r in runs if not r.error])
        return pages.render(request, "simulate.html", title="Simulate", workloads=shipped_workloads(),
                            policies=policy_names(), workload=workload or "pollux/workloads-0.5/workload-1.csv",
                            chosen=chosen or ["fifo", "tiresias"], runs=runs, error=error,
                            max_policies=MAX_POLICIES, jct_chart=jct_chart, util_chart=util_chart,
                            status_code=code)


def _simulate(simulator: Simulator, workload: str | None, chosen: list[str]) -> tuple[list[PolicyRun], str, int]:
    """(runs, an error, the status code): nothing to run without a workload; a request the simulator
    refuses is 400, and one made while another simulation runs is 429 (Too Many Requests: try later)."""
    if workload is None:
        return [], "", 200
    try:
        return simulator.run(workload, chosen), "", 200
    except SimulateError as exc:
        return [], str(exc), 400
    except Busy as exc:
        return [], str(exc), 429


def _simulation_charts(done: list[PolicyRun]) -> tuple[str, str]:
    """The JCT CDF and GPU utilisation SVGs of the runs that finished; empty strings when none did
    (no empty axes under a table of errors)."""
    if not done:
        return "", ""
    jct_chart = charts.line_chart([charts.Series(r.policy, cdf(r.jcts)) for r in done],
                                  title="Job completion time, CDF", x_label="JCT (hours)",
                                  y_label="fraction of jobs", chart_id="jct-cdf", y_from_zero=True)
    util_chart = charts.line_chart([charts.Series(r.policy, r.utilisation) for r in done],
                                   title="GPU utilisation over time", x_label="time (hours)",
                                   y_label="GPUs allocated (fraction)", chart_id="utilisation", y_from_zero=True)
    return jct_chart, util_chart


# ---------------------------------------------------------------- assets
def _add_asset_routes(app: FastAPI, htmx: Path | None) -> None:
    """``/static/NAME``: htmx when installed and the stylesheet; nothing else on disk is served."""

    @app.get("/static/{name}")
    def static(name: str) -> Response:
        if name == HTMX_FILE and htmx is not None:
            return FileResponse(htmx, media_type="text/javascript")
        if name == "dashboard.css":
            return FileResponse(STATIC / name, media_type="text/css")
        return Response("not found", status_code=404, media_type="text/plain")


def job_charts(detail: JobDetail) -> dict[str, str]:
    """The job page's SVGs: loss and throughput over steps (a series per attempt), the attempts' timeline."""
    # Series are keyed "<slurm attempt>" or "<slurm attempt> (world size N)" (an elastic job's sizes).
    bases = list(dict.fromkeys(k.split(" (", 1)[0] for k in [*detail.loss, *detail.throughput]))
    names = {k: f"attempt {bases.index(k.split(' (', 1)[0]) + 1}" + (f" ({k.split(' (', 1)[1]}" if " (" in k else "")
             for k in [*detail.loss, *detail.throughput]}
    loss = charts.line_chart([charts.Series(names[a], pts) for a, pts in detail.loss.items()],
                             title="Loss", x_label="step", y_label="loss", chart_id="loss-chart")
    speed = charts.line_chart([charts.Series(names[a], pts) for a, pts in detail.throughput.items()],
                              title=f"Throughput ({detail.throughput_unit})", x_label="step",
                              y_label=detail.throughput_unit, chart_id="throughput-chart", y_from_zero=True)
    segments = [charts.Segment(f"attempt {a['n']}", str(a["partition"]), a["start"], a["end"] or a["start"])
                for a in detail.attempts]
    lane = charts.timeline(segments, title="Attempts and moves", chart_id="attempts-chart", now=time.time())
    return {"loss_chart": loss, "throughput_chart": speed, "timeline_chart": lane}
