"""What the node gives the job's container: Podman's runtime directory, the network interface gloo and NCCL
use, and a free port for a gang's rendezvous."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from dlsub import contract


class RuntimeDirRefused(RuntimeError):
    """The runtime directory fallback is not a private directory of ours (someone else may have made it)."""


def runtime_dir(env: Mapping[str, str], uid: int, fallback: Path | None = None) -> str | None:
    """Podman's runtime directory for this job, where ``env`` lacks a usable one (None: keep the job's own).

    Rootless Podman needs one; Slurm jobs get none from logind. The fallback in /tmp
    (contract.runtime_dir_fallback) could have been made by someone else first: it is used only if it is a
    real directory of ours that nobody else can enter; else :class:`RuntimeDirRefused`.
    """
    given = env.get("XDG_RUNTIME_DIR", "")
    if given and os.access(given, os.W_OK):
        return None
    own = f"/run/user/{uid}"
    if os.access(own, os.W_OK):
        return own
    path = contract.runtime_dir_fallback(uid) if fallback is None else fallback
    try:
        os.mkdir(path, 0o700)
        os.chmod(path, 0o700)  # whatever the umask, as `mkdir -m 700`
    except OSError:
        pass  # there already, or not to be made: judged below
    try:
        info = os.lstat(path)
    except OSError:
        info = None
    if info is None or not stat.S_ISDIR(info.st_mode) or info.st_uid != uid or stat.S_IMODE(info.st_mode) != 0o700:
        raise RuntimeDirRefused(
            f"{path}, Podman's runtime directory, is not a directory of yours with mode 700 (someone else may "
            "have made it); remove it, or set XDG_RUNTIME_DIR to a private directory, and resubmit")
    return str(path)


def _output(argv: Sequence[str], env: Mapping[str, str]) -> str:
    """A command's standard output ("" when it cannot run); its errors are not the job's."""
    try:
        return subprocess.run(list(argv), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                              text=True, env=dict(env), check=False).stdout
    except OSError:
        return ""


def first_address(getent: str) -> str:
    """The first address in ``getent ahostsv4 HOST``'s output."""
    lines = getent.splitlines()
    fields = lines[0].split() if lines else []
    return fields[0] if fields else ""


def interface_of(address: str, ip_addr: str) -> str:
    """The interface holding ``address`` in ``ip -o -4 addr show``'s output ("" when none)."""
    for line in ip_addr.splitlines():
        fields = line.split()
        local = fields[3].split("/", 1)[0] if len(fields) > 3 else ""
        if local == address:
            return fields[1] if len(fields) > 1 else ""
    return ""


def socket_ifname(site: str, env: Mapping[str, str]) -> str:
    """The interface gloo and NCCL open their sockets on: the site's (policy.toml [containers] socket_ifname),
    else the one holding this node's own address (what its name resolves to, as the rendezvous endpoint
    does), so the members of a gang reach each other on the network Slurm knows the nodes by."""
    if site:
        return site
    address = first_address(_output(["getent", "ahostsv4", socket.gethostname()], env))
    return interface_of(address, _output(["ip", "-o", "-4", "addr", "show"], env))


def socket_env(ifname: str, env: Mapping[str, str]) -> dict[str, str]:
    """GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME to export: ``ifname``, unless the user set their own at
    submit (Slurm passes the submit environment to the job); none without an interface."""
    if not ifname:
        return {}
    return {name: env.get(name) or ifname for name in contract.SOCKET_IFNAME_ENV}


def free_port() -> int:
    """A port free on this node now (the kernel's choice, so no other job on the node has it)."""
    with socket.socket() as s:
        s.bind(("", 0))
        port: int = s.getsockname()[1]
        return port
