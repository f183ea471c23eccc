"""``dlsub doctor``: the site check an admin runs once (and the testbed runs after it comes up)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from dlsub.cli.doctor import PROBLEM, Host, blocking, check_policy_file, run_doctor, shipped_site_files
from dlsub.cli.errors import fail
from dlsub.job.agent_client import AgentEndpoint
from dlsub.job.settings import load_settings
from dlsub.site_config.policy_file import PolicyFileError, load_policy, policy_path
from dlsub.slurm_plugins.client import SlurmClient


@click.command()
@click.option("--user", "user", default=None, metavar="NAME",
              help="Check rootless Podman for this user on this host (subordinate ids, runtime directory, image, "
                   "storage, containers.conf cgroup settings) and where their job directories go.")
@click.option("--policy", "policy_path_given", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="The admin's policy file [default: $DLSUB_POLICY or /etc/dlsub/policy.toml].")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: {ok, checks: [{check, status, detail, fix}]}.")
def doctor(user: str | None, policy_path_given: Path | None, as_json: bool) -> None:
    """Check that this site can run dlsub: Slurm version, the agent's Operator rights, job_submit.lua,
    cred_expire, GPU gres, the policy's partitions, the agent, clocks, the CDI spec of a GPU node, and rootless
    Podman and where the job directories go for --user. Run it on a compute node too: its checks are that node's own.
    Exits 0 only when nothing blocks dlsub (warnings do not)."""
    try:
        policy = load_policy(policy_path_given)
    except PolicyFileError as exc:
        fail(str(exc))
    image = policy.containers.image_for(None, os.environ) or load_settings().image  # the site's, unless named
    findings = [check_policy_file(policy_path(policy_path_given), shipped_site_files()),
                *run_doctor(SlurmClient(), Host(), policy, user=user, image=image,
                            socket_path=AgentEndpoint.of(policy))]
    if as_json:
        click.echo(json.dumps({"ok": not blocking(findings), "checks": [f.as_dict() for f in findings]}))
    else:
        for f in findings:
            click.echo(f"{f.status.upper():8} {f.check}: {f.detail}")
            if f.fix and f.status in (PROBLEM, "warn"):
                click.echo(f"{'':8} fix: {f.fix}")
        problems = sum(1 for f in findings if f.status == PROBLEM)
        click.echo(f"dlsub doctor: {problems} problem(s)" + ("; dlsub cannot run here until they are fixed"
                                                             if problems else "; nothing blocks dlsub"))
    sys.exit(1 if blocking(findings) else 0)
