"""``dlsub dashboard [--port N]``: serve the web pages on 127.0.0.1 behind a random token.

The socket is bound before anything is printed, so the URL printed is the
one that answers; the token is new each start unless ``--token-file``
names one (a site's service for its admins, etc/systemd/dlsub-dashboard.service).
"""

from __future__ import annotations

import errno
import getpass
import socket
import sys
from pathlib import Path

import click

from dlsub.cli.errors import fail

#: Only loopback: other machines reach it through `ssh -L`.
ADDRESS = "127.0.0.1"


def bind(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((ADDRESS, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            fail(f"port {port} on {ADDRESS} is in use; pick another with --port, or leave it out for a free one")
        fail(f"cannot listen on {ADDRESS}:{port}: {exc.strerror}; pick another --port")
    sock.listen(64)
    return sock


def banner(port: int, token: str, host: str, user: str, shown_token: bool = True) -> str:
    url = f"http://{ADDRESS}:{port}/" + (f"?token={token}" if shown_token else "")
    return (f"dlsub dashboard: {url}\n"
            f"dlsub dashboard: from your laptop: ssh -N -L {port}:{ADDRESS}:{port} {user}@{host}\n"
            f"dlsub dashboard: then open {url}\n"
            "dlsub dashboard: Ctrl-C stops it")


@click.command()
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="Port on 127.0.0.1 (0: a free one).")
@click.option("--token-file", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Read the token from this file (mode 640 or stricter) instead of making a new one.")
@click.option("--refresh", "refresh_s", type=click.FloatRange(0.5, 3600), default=2.0, show_default=True,
              help="Seconds between live updates of a page.")
def dashboard(port: int, token_file: Path | None, refresh_s: float) -> None:
    """Web pages of your jobs (progress, loss curves, ETA, why), the cluster and the simulator.

    Listens on 127.0.0.1 only and prints the address with its token and the
    `ssh -L` line to reach it from a laptop. Without the token every page is refused.
    """
    import uvicorn

    from dlsub.dashboard import auth
    from dlsub.dashboard.app import AppConfig, create_app
    from dlsub.dashboard.data import Dashboard, Viewer
    from dlsub.job.settings import load_settings
    from dlsub.site_config.policy_file import AgentPolicy, PolicyFileError, load_policy

    try:
        token = auth.read_token_file(token_file) if token_file else auth.new_token()
    except auth.TokenFileError as exc:
        fail(str(exc))
        return
    try:
        policy = load_policy()
    except PolicyFileError as exc:
        click.echo(f"dlsub: warning: {exc}; using dlsub's default policy", err=True)
        policy = AgentPolicy()
    sock = bind(port)
    port = sock.getsockname()[1]
    board = Dashboard(Viewer.current(policy), load_settings(), policy)
    app = create_app(AppConfig(token=token, port=port, dashboard=board, refresh_s=refresh_s))
    click.echo(banner(port, token, socket.getfqdn(), getpass.getuser(), shown_token=token_file is None))
    sys.stdout.flush()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
    server.run(sockets=[sock])
