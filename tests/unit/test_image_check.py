"""Unit: submit's check of what a job's image holds (issue 49, item 3: `--image` for one's own image): a Python
dlsub's library runs on and torch, read by one run of python3 in the image, once per image ID. Podman is stubbed
at its one seam (``containers.podman._podman``); the live test builds a real image that lacks them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dlsub.containers import podman
from dlsub.containers.podman import ImageError, check_image_contents, image_shortfalls

ID = "ab" * 32


def ran(stdout: str, rc: int = 0, stderr: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess(["podman"], rc, stdout, stderr)


@pytest.mark.parametrize(("probe", "lacks"), [
    (ran('{"python": "3.11.2", "torch": "2.13.0"}\n'), []),
    (ran('{"python": "3.13.0", "torch": "2.13.0+cu128"}\n'), []),
    (ran('{"python": "3.9.18", "torch": "2.1.0"}\n'), ["Python 3.9.18 (dlsub's library needs 3.11 or newer)"]),
    (ran('{"python": "3.12.1", "torch": null}\n'), ["no torch (torchrun starts every job; pip install torch in "
                                                     "the image)"]),
    (ran("", 127, 'Error: crun: executable file `python3` not found in $PATH: No such file or directory\n'),
     ["no python3 that runs (python3 in it: Error: crun: executable file `python3` not found in $PATH: No such "
      "file or directory)"]),
    (ran("Python 2 says hello\n"), ["no python3 that runs (python3 in it: Python 2 says hello)"]),
])
def test_what_an_image_lacks_is_named(probe: subprocess.CompletedProcess[str], lacks: list[str]) -> None:
    assert image_shortfalls(probe) == lacks


def test_an_image_is_asked_once_per_id_as_the_job_runs_it_and_a_bad_one_is_refused_every_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []
    answer = ran('{"python": "3.11.2", "torch": "2.13.0"}')

    def fake_podman(argv: list[str]) -> subprocess.CompletedProcess[str]:
        calls.append(list(argv))
        return answer

    monkeypatch.setattr(podman, "_podman", fake_podman)
    checked = tmp_path / "checked-images"
    assert check_image_contents("mine:1", ID, checked, "runc") == ("3.11.2", "")
    assert check_image_contents("mine:1", ID, checked, "runc") == ("3.11.2", ""), "the recorded version"
    (argv,) = calls
    assert argv[:5] == ["--runtime", "runc", "--cgroup-manager", "cgroupfs", "run"], "as the job's podman runs"
    assert argv[argv.index("--entrypoint") + 1] == "python3" and argv[argv.index("--entrypoint") + 2] == ID, \
        "run by the ID submit records, never by a name that may move"
    answer = ran('{"python": "3.10.4", "torch": "2.0.0"}')
    for _ in range(2):
        with pytest.raises(ImageError, match=r"image 'old:1' cannot run a dlsub job: Python 3\.10\.4 .*--venv"):
            check_image_contents("old:1", "cd" * 32, checked)
    assert len(calls) == 3 and not (checked / ("cd" * 32)).exists()
    # An answer that is no version is no Python that runs (and nothing of it is recorded).
    answer = ran('{"python": "3.11.2/../../x", "torch": "2"}')
    with pytest.raises(ImageError, match="no python3 that runs"):
        check_image_contents("odd:1", "ef" * 32, checked)


@pytest.mark.parametrize("failure", [
    ran("", 125, "Error: cannot set up namespace using newuidmap: exit status 1\n"),
    ran("", 124, "podman did not answer in 60 s"),
    # Podman 4.3 on a host whose /dev/fuse users cannot open (seen on a fresh machine): exit 1, not 125.
    ran("", 1, "Error: mounting storage for container f852: creating overlay mount to /x/merged, mount_data=\"lowerdir"
               "=/l\": using mount program /usr/bin/fuse-overlayfs: unknown argument ignored: lazytime\n"
               "unknown argument ignored: \nfuse: failed to open /dev/fuse: Permission denied\n"
               "fuse-overlayfs: cannot mount: Permission denied\n: exit status 1\n"),
])
def test_a_podman_that_cannot_start_a_container_here_blames_no_image_and_leaves_it_unchecked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: subprocess.CompletedProcess[str]) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(podman, "_podman", lambda argv: (calls.append(list(argv)), failure)[1])
    python, warning = check_image_contents("site:1", ID, tmp_path / "checked")
    assert python is None and "could not start a container of site:1 on this host" in warning
    said = failure.stderr.strip() if failure.returncode != 1 else (
        "fuse: failed to open /dev/fuse: Permission denied; fuse-overlayfs: cannot mount: Permission denied")
    assert said in warning and "dlsub doctor" in warning
    assert not (tmp_path / "checked" / ID).exists(), "checked again next time"
    if failure.returncode == 124:  # the probe's container, by its name, is removed
        name = calls[0][calls[0].index("--name") + 1]
        assert calls[-1] == ["rm", "--force", "--ignore", name]


STALE_PAUSE = "Error: cannot re-exec process to join the existing user namespace\n"


def test_a_podman_that_does_not_run_for_the_user_is_said_to_and_no_image_is_blamed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Podman 4.3 with a dead pause process's pid file (a runtime directory no reboot emptied) fails every command:
    submit said the site's image was "not in your Podman storage (... images there: none)", which sent the user
    looking for an image they had (CI rehearsal 34)."""
    monkeypatch.setattr(podman, "_podman", lambda argv: ran("", 125, STALE_PAUSE))
    with pytest.raises(ImageError) as refused:
        podman.check_image("localhost/dlsub-torch:2.13.0-cpu")
    said = str(refused.value)
    assert said.startswith("Podman does not run for you on this host (Error: cannot re-exec process to join the "
                           "existing user namespace), so image 'localhost/dlsub-torch:2.13.0-cpu' could not be "
                           "looked up")
    assert "dlsub doctor --user $USER" in said and "not in your Podman storage" not in said


def test_an_image_missing_from_a_working_podman_names_where_it_looked(monkeypatch: pytest.MonkeyPatch) -> None:
    info = '{"store": {"graphRoot": "/var/lib/dlsub-local/alice/containers", "graphOptions": ' \
           '{"overlay.imagestore": "/var/lib/dlsub-images"}}}'
    answers = {"inspect": ran("", 125, "Error: inspecting object: localhost/nope:1: image not known\n"),
               "info": ran(info), "images": ran("localhost/dlsub-torch:2.13.0-cpu\n")}
    monkeypatch.setattr(podman, "_podman", lambda argv: answers[argv[1] if argv[0] == "image" else argv[0]])
    with pytest.raises(ImageError) as refused:
        podman.check_image("localhost/nope:1")
    assert str(refused.value).startswith(
        "image 'localhost/nope:1' is not in your Podman storage (looked in /var/lib/dlsub-local/alice/containers "
        "and the site's read-only store /var/lib/dlsub-images; images there: localhost/dlsub-torch:2.13.0-cpu)")
