"""Helpers for the integration tests: act as the testbed user on the live testbed."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


USER = os.environ.get("DLSUB_TESTBED_USER", "dltest")
EXAMPLES = Path(os.environ.get("DLSUB_PREFIX", "/opt/dlsub")) / "examples"


class TestbedUser:
    """Runs commands as the testbed user, in a login-like environment."""

    __test__ = False  # not a test class

    def __init__(self, name: str) -> None:
        entry = pwd.getpwnam(name)
        self.name, self.uid, self.gid, self.home = name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir)
        self.env = {
            "HOME": str(self.home), "USER": name, "LOGNAME": name,
            "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            "XDG_RUNTIME_DIR": f"/run/user/{self.uid}", "LANG": "C.UTF-8",
        }

    def run(self, *argv: str, cwd: Path | None = None, check: bool = False, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        cmd = ["runuser", "-u", self.name, "--", "env", "-i", *(f"{k}={v}" for k, v in self.env.items()), *argv]
        result = subprocess.run(cmd, cwd=cwd or self.home, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"{argv} exited {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}")
        return result

    def dlsub(self, *args: str, cwd: Path | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run("dlsub", *args, cwd=cwd, check=check)

    def submit(self, *args: str, cwd: Path | None = None) -> dict[str, Any]:
        return json.loads(self.dlsub(*args, "--json", cwd=cwd).stdout)

    def status(self, job: str) -> dict[str, Any]:
        return json.loads(self.dlsub("status", job, "--json").stdout)

    def containers(self, label: str) -> list[str]:
        out = self.run("podman", "ps", "-a", "--format", "{{.Names}}", "--filter", f"label={label}", check=True)
        return out.stdout.split()


def put(user: TestbedUser, path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    for p in (path, *[q for q in path.parents if str(q).startswith(tempfile.gettempdir() + "/dlsub-it-")]):
        os.chown(p, user.uid, user.gid)
    return path


def wait_for(what: str, predicate: Callable[[], Any], timeout: float = 120, interval: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")
