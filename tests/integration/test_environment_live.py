"""Integration (live testbed: real Slurm, rootless Podman): what of the submitting shell's environment enters a
job's container (`dlsub submit --export`, issue 49 item 3). Two jobs from one shell, side by side on the cpu
partition: one with ``--export ALL,SEED=3`` gets the shell's own variable, the set one, and its PYTHONPATH entry
that lies in the (shared) submit directory, never the shell's PATH, LD_* or a PYTHONPATH entry the nodes do not
see; one with the default gets none of the shell's."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

from livebed import TestbedUser, job_output, jobs_made_since, put, slurm_jobs

SHOW = '''import json
import os

import helper_mod  # from the PYTHONPATH entry in the submit directory, where --export passes it

keys = ("MY_SETTING", "SEED", "LD_LIBRARY_PATH", "PYTHONPATH", "PATH")
print("ENV " + json.dumps({k: os.environ.get(k) for k in keys}) + " " + helper_mod.WHERE, flush=True)
'''
PLAIN = '''import json
import os

print("ENV " + json.dumps({k: os.environ.get(k) for k in ("MY_SETTING", "SEED")}), flush=True)
'''


def _env_line(job: dict[str, object]) -> dict[str, object]:
    text = job_output(str(job["job_dir"]))
    line = next((ln for ln in text.splitlines() if "ENV {" in ln), None)
    assert line is not None, text
    return json.loads(line.split("ENV ", 1)[1].rsplit("}", 1)[0] + "}")


def test_export_passes_what_it_names_and_the_default_passes_nothing_of_the_shell(
        user: TestbedUser, workdir: Path) -> None:
    lib = workdir / "lib"
    put(user, lib / "helper_mod.py", 'WHERE = "helper from the submit directory"\n')
    shown = put(user, workdir / "show_env.py", SHOW)
    plain = put(user, workdir / "plain_env.py", PLAIN)
    shell = ("env", "MY_SETTING=it's $HOME; `id`", "LD_LIBRARY_PATH=/nowhere", f"PYTHONPATH={lib}:/opt/not-shared")
    out = user.run(*shell, "dlsub", "--json", "-p", "cpu", "--export", "ALL,SEED=3", str(shown), cwd=workdir,
                   check=True)
    exported = json.loads(out.stdout)
    assert "PYTHONPATH: /opt/not-shared left out" in out.stderr, out.stderr
    default = json.loads(user.run(*shell, "dlsub", "--json", "-p", "cpu", str(plain), cwd=workdir,
                                  check=True).stdout)
    for job in (exported, default):
        assert user.wait_until_ended(str(job["id"]), timeout=180)["state"] == "COMPLETED", \
            job_output(str(job["job_dir"]))
    env = _env_line(exported)
    assert env["MY_SETTING"] == "it's $HOME; `id`" and env["SEED"] == "3", env
    assert env["LD_LIBRARY_PATH"] is None and env["PATH"] != user.env["PATH"], env
    assert str(env["PYTHONPATH"]).split(":")[1:] == [str(lib)], env
    assert "helper from the submit directory" in job_output(str(exported["job_dir"]))
    assert _env_line(default) == {"MY_SETTING": None, "SEED": None}


def test_an_image_without_the_python_dlsub_needs_is_refused_at_submit_naming_what_it_lacks(
        user: TestbedUser, workdir: Path) -> None:
    """The user's own image, imported into their storage from a file system of one file (no python3 in it):
    submit runs python3 in it once, refuses it with exit 2 naming what it lacks, and nothing reaches Slurm.
    (Built FROM the site's image instead, Podman 4.3 cannot commit a user's layer over the root-owned store:
    "chown .../dlsub-images/overlay/...: operation not permitted"; the user guide says so.)"""
    rootfs = workdir / "rootfs.tar"
    data = b"an image without python\n"
    info = tarfile.TarInfo("etc/image-name")
    info.size = len(data)
    with tarfile.open(rootfs, "w") as tar:
        tar.addfile(info, io.BytesIO(data))
    os.chown(rootfs, user.uid, user.gid)
    tag = f"localhost/dlsub-it-no-python:{workdir.name[-8:].lower()}"
    imported = user.run("podman", "import", str(rootfs), tag, cwd=workdir, timeout=120)
    assert imported.returncode == 0, imported.stderr
    try:
        script = put(user, workdir / "never_runs.py", "print('never')\n")
        before = {j["job_id"] for j in slurm_jobs()}
        refused = user.run("dlsub", "--image", tag, "-p", "cpu", str(script), cwd=workdir)
        assert refused.returncode == 2, (refused.stdout, refused.stderr)
        assert f"image '{tag}' cannot run a dlsub job: no python3 that runs" in refused.stderr, refused.stderr
        assert not jobs_made_since(before), "nothing reached Slurm"
    finally:
        user.run("podman", "rmi", "-f", tag)


def test_a_venv_on_the_shared_home_gives_the_job_a_package_the_image_lacks(
        user: TestbedUser, workdir: Path) -> None:
    """A virtualenv made on the login host (its Python is the image's version, 3.11) with a package of its own:
    the job imports it from there."""
    env = workdir / "my venv"
    made = user.run("python3", "-m", "venv", "--without-pip", str(env), cwd=workdir)
    assert made.returncode == 0, made.stderr
    (site,) = env.glob("lib/python3.*/site-packages")
    put(user, site / "venv_only_pkg.py", 'WHERE = "from the venv"\n')
    script = put(user, workdir / "uses_venv.py", "import venv_only_pkg\nprint('PKG', venv_only_pkg.WHERE)\n")
    job = user.submit("-p", "cpu", "--venv", str(env), str(script), cwd=workdir)
    final = user.wait_until_ended(job["id"], timeout=180)
    assert final["state"] == "COMPLETED", job_output(job["job_dir"])
    assert "PKG from the venv" in job_output(job["job_dir"])
