"""Unit: the site's shared file systems and the user's --mount/--mount-rw (checked on this host, rendered into
the batch script, recorded), and the site's OCI runtime. The submits run against the fake Slurm (cli_env);
no Podman is involved: the rendered script is read, and test_sbatch.py runs one under bash."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlsub.cli.main import main
from dlsub.containers.mounts import ORIGIN_SITE, Mount, MountError, MountRequest, merge_mounts, resolve_mount
from dlsub.site_config.policy_file import PolicyFileError, parse_policy
from dlsub.slurm_plugins.fake import FakeSlurm


def invoke(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def _volumes(fake: FakeSlurm) -> list[str]:
    """The --volume values of the submitted job's podman line, as bash would split them."""
    (job,) = fake.submitted()
    words = shlex.split(Path(job.script).read_text().split("podman --cgroup-manager", 1)[1].split("\nfi\n", 1)[0]
                        .replace("\\\n", " "))
    return [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--volume"]


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A submit directory with the script, and shared data beside it (not under the directories mounted anyway)."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text("print('training')\n")
    (tmp_path / "shared" / "data set").mkdir(parents=True)
    (tmp_path / "shared" / "out").mkdir()
    monkeypatch.chdir(proj)
    monkeypatch.setenv("DLSUB_POLICY", str(tmp_path / "no-policy.toml"))
    return proj


# ---------------------------------------------------------------- checking one path


def test_a_relative_path_is_taken_from_the_submit_directory_and_a_link_mounted_from_its_real_path(
        tmp_path: Path) -> None:
    (tmp_path / "real data").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real data")
    got = resolve_mount(MountRequest("link"), tmp_path)
    assert got == Mount(tmp_path / "real data", tmp_path / "link", read_only=True)
    assert got.volume() == f"{tmp_path / 'real data'}:{tmp_path / 'link'}:ro"
    rw = resolve_mount(MountRequest(str(tmp_path / "real data" / ".." / "link"), read_only=False), Path("/"))
    assert rw.target == tmp_path / "link" and rw.volume() == f"{tmp_path / 'real data'}:{tmp_path / 'link'}"


@pytest.mark.parametrize(("name", "message"), [
    ("missing", "does not exist on this host"),
    ("with:colon", "contains ':'"),
    ("line\nbreak", "has a line break"),
    ("", "needs a path"),
    ("/", "cannot mount the whole file system"),
    ("fifo", "neither a directory nor a file"),
    ("to-colon", "contains ':'"),  # a link whose real path Podman could not take
])
def test_a_path_that_cannot_be_mounted_is_refused_with_why(tmp_path: Path, name: str, message: str) -> None:
    (tmp_path / "with:colon").mkdir()
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "to-colon").symlink_to(tmp_path / "with:colon")
    with pytest.raises(MountError, match=message):
        resolve_mount(MountRequest(name), tmp_path)


def test_nested_mounts_keep_their_own_mode_and_parents_come_first() -> None:
    home, data = Path("/home/u"), Path("/home/u/data")
    merged = merge_mounts([Mount(data, data), Mount(Path("/p"), Path("/p")), Mount(home, home, read_only=False),
                           Mount(Path("/p/x"), Path("/p/x")), Mount(Path("/s"), Path("/s")),
                           Mount(Path("/s"), Path("/s"), read_only=False)])
    # /p/x adds nothing to /p; /s asked both ways is read-write; data stays read-only inside the read-write home.
    assert [(str(m.target), m.read_only) for m in merged] == [
        ("/p", True), ("/s", False), ("/home/u", False), ("/home/u/data", True)]


# ---------------------------------------------------------------- dlsub submit --mount


def test_mounts_reach_the_batch_script_and_the_jobs_record(cli_env: FakeSlurm, project: Path) -> None:
    out = json.loads(invoke("--mount", "../shared/data set", "--mount-rw", str(project.parent / "shared" / "out"),
                            "--json", "train.py").stdout)
    shared = project.parent / "shared"
    assert f"{shared / 'data set'}:{shared / 'data set'}:ro" in _volumes(cli_env)
    assert f"{shared / 'out'}:{shared / 'out'}" in _volumes(cli_env)
    status = json.loads(invoke("status", out["id"], "--json").stdout)
    assert [(m["path"], m["read_only"], m["origin"]) for m in status["mounts"]] == [
        (str(shared / "data set"), True, "user"), (str(shared / "out"), False, "user")]
    shown = invoke("status", out["id"]).stdout
    assert f"mounts {shared / 'data set'} (read-only, yours), {shared / 'out'} (read-write, yours)" in shown


def test_an_elastic_jobs_workers_and_a_cpu_component_mount_the_same(cli_env: FakeSlurm, project: Path) -> None:
    data = project.parent / "shared" / "data set"
    for shape in (("--nodes", "1:2", "-p", "gpu"), ("--cpu-nodes", "1", "-p", "gpu", "--gpus", "1")):
        cli_env.jobs.clear()
        result = invoke(*shape, "--mount", str(data), "train.py")
        assert result.exit_code == 0, result.output
        texts = [Path(j.script).read_text() for j in cli_env.submitted()]
        volume = f"--volume {shlex.quote(f'{data}:{data}:ro')}"
        # Every podman line of every script: the main job's, its workers', the CPU component's.
        assert texts and all(t.count(volume) == t.count("cgroupfs run --rm") > 0 for t in texts), shape
        assert sum(t.count("cgroupfs run --rm") for t in texts) == 2, shape


@pytest.mark.parametrize("path", ["../nowhere", "../shared/a:b"])
def test_a_bad_mount_submits_nothing(cli_env: FakeSlurm, project: Path, path: str) -> None:
    (project.parent / "shared" / "a:b").mkdir()
    result = invoke("--mount", path, "train.py")
    assert result.exit_code == 2 and f"--mount {path}" in result.output
    assert cli_env.submitted() == []
    assert not (project.parent / "dlsub-home" / "jobs").exists() or \
        not any((project.parent / "dlsub-home" / "jobs").iterdir())


def test_dlsub_lines_mounts_add_up_with_the_command_lines(cli_env: FakeSlurm, project: Path) -> None:
    shared = project.parent / "shared"
    (project / "train.py").write_text(f"#DLSUB --mount '{shared / 'data set'}'\n#DLSUB --mount-rw ../shared/out\n"
                                      "print(1)\n")
    (shared / "more").mkdir()
    assert invoke("--mount", "../shared/more", "train.py").exit_code == 0
    volumes = _volumes(cli_env)
    assert f"{shared / 'data set'}:{shared / 'data set'}:ro" in volumes
    assert f"{shared / 'out'}:{shared / 'out'}" in volumes
    assert f"{shared / 'more'}:{shared / 'more'}:ro" in volumes


def test_a_bad_dlsub_mount_line_is_named(cli_env: FakeSlurm, project: Path) -> None:
    (project / "train.py").write_text("#DLSUB --cpus 1\n#DLSUB --mount /no/such/data\nprint(1)\n")
    result = invoke("train.py")
    assert result.exit_code == 2 and "train.py line 2" in result.output and "does not exist" in result.output
    assert cli_env.submitted() == []


# ---------------------------------------------------------------- the site's policy.toml


def _site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    (tmp_path / "policy.toml").write_text(body)
    monkeypatch.setenv("DLSUB_POLICY", str(tmp_path / "policy.toml"))


def test_the_sites_shared_file_systems_are_mounted_and_a_missing_one_is_left_out_with_a_warning(
        cli_env: FakeSlurm, project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shared = tmp_path / "shared"
    _site(tmp_path, monkeypatch, f'[containers]\nshared_mounts = ["{shared / "data set"}", "/no/such/projects"]\n'
                                 f'shared_mounts_rw = ["{shared / "out"}"]\n')
    result = invoke("--json", "train.py")
    assert result.exit_code == 0, result.output
    assert "/no/such/projects does not exist" in result.stderr and "policy.toml [containers]" in result.stderr
    volumes = _volumes(cli_env)
    assert f"{shared / 'data set'}:{shared / 'data set'}:ro" in volumes
    assert f"{shared / 'out'}:{shared / 'out'}" in volumes
    assert not any("/no/such" in v for v in volumes)
    status = json.loads(invoke("status", json.loads(result.stdout)["id"], "--json").stdout)
    assert {m["origin"] for m in status["mounts"]} == {ORIGIN_SITE}


def test_the_runtime_is_podmans_default_unless_the_site_or_the_user_names_one(
        cli_env: FakeSlurm, project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def podman_line() -> str:
        (job,) = cli_env.submitted()
        cli_env.jobs.clear()
        return next(line for line in Path(job.script).read_text().splitlines() if "cgroupfs run --rm" in line)

    assert invoke("train.py").exit_code == 0
    assert "--runtime" not in podman_line()
    _site(tmp_path, monkeypatch, '[containers]\nruntime = "runc"\n')
    assert invoke("train.py").exit_code == 0
    assert "podman --runtime runc --cgroup-manager" in podman_line()
    monkeypatch.setenv("DLSUB_RUNTIME", "crun")
    assert invoke("train.py").exit_code == 0
    assert "podman --runtime crun --cgroup-manager" in podman_line()


@pytest.mark.parametrize(("table", "message"), [
    ('shared_mounts = ["scratch"]', "expected an absolute path"),
    ('shared_mounts = ["/a:b"]', "contains ':'"),
    ('shared_mounts = ["/"]', "expected an absolute path below /"),
    ('shared_mounts = ["/s"]\nshared_mounts_rw = ["/s"]', "in both shared_mounts and shared_mounts_rw"),
    ('runtime = "crun --debug"', "name one runtime"),
    ('shared_mount = ["/s"]', "shared_mount"),
    ("shared_mounts = \"/s\"", "expected a list of strings"),
    ('image = "site torch"', "name an image as Podman does"),
    ('image = "-v /:/host"', "name an image as Podman does"),
])
def test_a_bad_containers_table_is_refused_naming_the_key(table: str, message: str) -> None:
    import tomllib

    with pytest.raises(PolicyFileError, match=message):
        parse_policy(tomllib.loads(f"[containers]\n{table}\n"))


def test_the_example_policy_and_the_testbeds_parse_with_their_containers_tables() -> None:
    import tomllib

    repo = Path(__file__).resolve().parents[2]
    testbed = parse_policy(tomllib.loads((repo / "etc" / "testbed" / "policy.toml").read_text()))
    assert testbed.containers.runtime == "runc"  # the testbed VM's hybrid cgroups need it
    example = parse_policy(tomllib.loads((repo / "etc" / "policy.toml.example").read_text()))
    assert example.containers.runtime == ""


def test_the_sites_socket_interface_reaches_the_batch_script_and_a_bad_one_is_refused(
        cli_env: FakeSlurm, project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit (fake Slurm): policy.toml [containers] socket_ifname, rendered as the batch script's value."""
    _site(tmp_path, monkeypatch, '[containers]\nsocket_ifname = "ib0"\n')
    assert invoke("train.py").exit_code == 0
    (job,) = cli_env.submitted()
    assert " --socket-ifname ib0\n" in Path(job.script).read_text()
    cli_env.jobs.clear()
    # A broken policy file is reported and set aside, as for any of its keys: the value never reaches a script.
    _site(tmp_path, monkeypatch, '[containers]\nsocket_ifname = "ib0; touch /tmp/x"\n')
    result = CliRunner().invoke(main, ["train.py"])
    assert "socket_ifname" in result.output and "NCCL_SOCKET_IFNAME" in result.output, result.output
    (job,) = cli_env.submitted()
    assert "touch" not in Path(job.script).read_text()


def test_the_sites_image_is_what_a_job_runs_unless_its_user_names_one(
        cli_env: FakeSlurm, project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit (fake Slurm and image store, which holds only dlsub's own image): policy.toml [containers] image is
    the image a job runs when its user names none; --image, then $DLSUB_IMAGE, win over it."""
    _site(tmp_path, monkeypatch, '[containers]\nimage = "localhost/site-torch:2.13.0-cu128"\n')
    monkeypatch.delenv("DLSUB_IMAGE", raising=False)
    refused = invoke("train.py")
    assert refused.exit_code == 2 and "'localhost/site-torch:2.13.0-cu128' is not in your Podman" in refused.output
    assert cli_env.submitted() == []
    assert invoke("--image", "localhost/dlsub-torch:2.13.0-cpu", "train.py").exit_code == 0
    monkeypatch.setenv("DLSUB_IMAGE", "localhost/dlsub-torch:2.13.0-cpu")
    assert invoke("train.py").exit_code == 0
    assert len(cli_env.submitted()) == 2
