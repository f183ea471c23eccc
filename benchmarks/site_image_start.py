"""A user's container start from the site's read-only image store, against each user keeping the image.

    python benchmarks/site_image_start.py [--node cpu1] [--samples 3]

On one node, as the testbed's third user (who has no image of their own), with their node-local Podman
storage removed first (a user who never ran Podman there):

* site store: the first container start (``import torch``, the first job of that user on that node: Podman
  makes its storage) and later ones, through the site's store (fuse-overlayfs, no copy);
* per-user image, the alternative a site without a shared store leaves users: the image loaded into the
  user's own storage from an archive (podman load, what each user does on each node before a first job),
  its first start (native overlay) and later ones.

Prints the seconds of each, and the disk each way takes per user on the node: what N users cost. Runs as root
on a testbed brought up by `make testbed`; leaves the user's storage as it found it (none).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testbed"))

from livebed import NODE_LOCAL, SITE_IMAGE_STORE, USER3, TestbedUser, on_host

REPO = Path(__file__).resolve().parents[1]
IMAGE = "localhost/dlsub-torch:2.13.0-cpu"
RUN = ["--runtime", "runc", "--cgroup-manager", "cgroupfs", "run", "--rm", "--network", "host", "--userns",
       "keep-id", IMAGE, "python3", "-c", "import torch"]


def podman(user: TestbedUser, node: str, argv: list[str], conf: str | None = None) -> float:
    env = [f"HOME={user.home}", f"XDG_RUNTIME_DIR=/tmp/dlsub-bench-xdg-{user.uid}"]
    if conf:
        env.append(f"CONTAINERS_STORAGE_CONF={conf}")
    start = time.monotonic()
    subprocess.run([*on_host(node), "runuser", "-u", user.name, "--", "env", *env, "podman", *argv],
                   check=True, capture_output=True, text=True)
    return time.monotonic() - start


def kib(node: str, path: Path) -> int:
    out = subprocess.run([*on_host(node), "du", "-sk", str(path)], capture_output=True, text=True).stdout.split()
    return int(out[0]) if out else 0


def fresh(user: TestbedUser, node: str) -> None:
    """No Podman storage or runtime state of the user's on the node."""
    subprocess.run([*on_host(node), "rm", "-rf", str(NODE_LOCAL / user.name / "containers"),
                    str(NODE_LOCAL / user.name / "bench-own"), f"/tmp/dlsub-bench-xdg-{user.uid}"], check=True)
    subprocess.run([*on_host(node), "install", "-d", "-m", "700", "-o", user.name, "-g", user.name,
                    f"/tmp/dlsub-bench-xdg-{user.uid}"], check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--node", default="cpu1")
    parser.add_argument("--samples", type=int, default=3)
    args = parser.parse_args()
    user, node = TestbedUser(USER3), args.node
    home_cache = user.home / ".local" / "share" / "containers"
    had_home_cache = home_cache.exists()
    store_kib = kib(node, SITE_IMAGE_STORE)
    figures: dict[str, object] = {"node": node, "store_kib": store_kib}
    # The site store: the user's first start, then later ones.
    fresh(user, node)
    figures["site_first_start_s"] = round(podman(user, node, RUN), 2)
    figures["site_later_start_s"] = round(statistics.median(podman(user, node, RUN) for _ in range(args.samples)), 2)
    site_kib = figures["site_user_kib"] = kib(node, NODE_LOCAL / user.name / "containers")
    # The image of the user's own: an archive loaded into their storage (native overlay, no site store).
    with tempfile.TemporaryDirectory(dir="/var/cache") as tmp:
        archive = Path(tmp) / "image.tar"
        subprocess.run(["bash", str(REPO / "containers" / "site-image-store.sh"), "--store", str(SITE_IMAGE_STORE),
                        "save", IMAGE, str(archive)], check=True)
        Path(tmp).chmod(0o755)
        archive.chmod(0o644)
        own = Path(tmp) / "own-storage.conf"
        own.write_text(f'[storage]\ndriver = "overlay"\nrootless_storage_path = "{NODE_LOCAL}/{user.name}/bench-own"\n')
        own.chmod(0o644)
        fresh(user, node)
        figures["own_load_s"] = round(podman(user, node, ["load", "-q", "-i", str(archive)], str(own)), 2)
        figures["own_first_start_s"] = round(podman(user, node, RUN, str(own)), 2)
        figures["own_later_start_s"] = round(statistics.median(podman(user, node, RUN, str(own))
                                                              for _ in range(args.samples)), 2)
        own_kib = figures["own_user_kib"] = kib(node, NODE_LOCAL / user.name / "bench-own")
    fresh(user, node)
    subprocess.run([*on_host(node), "rm", "-rf", f"/tmp/dlsub-bench-xdg-{user.uid}"], check=True)
    if not had_home_cache:  # podman load's blob cache, in the home: the user had no Podman file there
        shutil.rmtree(home_cache, ignore_errors=True)
    figures["disk_for_100_users_gib"] = {"site": round((store_kib + 100 * site_kib) / 2**20, 1),
                                         "own": round(100 * own_kib / 2**20, 1)}
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
