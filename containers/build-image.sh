#!/usr/bin/env bash
# Build dlsub's default training image offline into USER's rootless Podman
# storage (Podman storage is per user, so build as the user who runs jobs).
#   1. debootstrap a minimal bookworm with python3 (as root), podman import it;
#   2. pip download the image's packages' wheels on the host (torch==2.13.0,
#      numpy, and the frameworks dlsub.checkpointing has adapters for:
#      lightning, transformers, accelerate);
#   3. podman build the Containerfile with the wheels bind-mounted.
# Each step is skipped when its result is already there and the recipe has
# not changed. Usage: build-image.sh [--cuda] [--wheels-only | --publish] USER [IMAGE]
#   --cuda: the site's GPU image instead, localhost/dlsub-torch:2.14.1-cuda: torch 2.14.1 as the package
#   registry ships it for Linux x86_64 (built with CUDA 13, the CUDA runtime, cuDNN and NCCL as nvidia-*
#   wheels), the same frameworks; 6.2 GB (measured), so never in CI's path (make image-cuda builds it and
#   checks torch.version.cuda in it). The node's driver comes in through CDI, as for any image.
#   --wheels-only: the downloads alone (step 2 and step 1's debootstrap), on a host that reaches the package
#   registries, for a build host that does not (the testbed's login host has no route out: testbed/up.sh
#   downloads on the host first).
#   --publish (as root, after a build): the built image into the site's read-only image store
#   (DLSUB_SITE_IMAGE_STORE, containers/site-image-store.sh), through an archive USER saves; nothing when the
#   store already holds that image under that name.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
wheels_only=0 publish=0 cuda=0
while [ $# -gt 0 ]; do
    case "$1" in
        --wheels-only) wheels_only=1; shift ;;
        --publish) publish=1; shift ;;
        --cuda) cuda=1; shift ;;
        *) break ;;
    esac
done
user="${1:?usage: build-image.sh [--cuda] [--wheels-only | --publish] USER [IMAGE]}"
if [ "$cuda" -eq 1 ]; then
    image="${2:-localhost/dlsub-torch:2.14.1-cuda}"
    torch="torch==2.14.1"
    description="PyTorch 2.14 with CUDA 13 (runtime, cuDNN, NCCL from the nvidia-* wheels), numpy, Lightning, transformers, accelerate on Debian bookworm, for dlsub jobs on GPU nodes"
else
    image="${2:-${DLSUB_IMAGE:-localhost/dlsub-torch:2.13.0-cpu}}"
    torch="torch==2.13.0"
    description="PyTorch 2.13 CPU, numpy, Lightning, transformers, accelerate on Debian bookworm, for dlsub jobs"
fi
base="localhost/dlsub-base:bookworm"
cache="${DLSUB_IMAGE_CACHE:-/var/cache/dlsub-image}"
venv_pip="${DLSUB_PREFIX:-/opt/dlsub}/venv/bin/pip"

say() { printf 'build-image: %s %s\n' "$(date +%T)" "$*" >&2; }  # timed: make demo's phases
# shellcheck source=containers/image-user.sh
source "$here/image-user.sh"

# Each variant has its own build context: podman build sends the whole context, and the CUDA wheels are GBs.
ctx="$cache/context"
[ "$cuda" -eq 0 ] || ctx="$cache/context-cuda"
# What the image installs: pip download fetches these and their dependencies into wheels/, and the Containerfile
# installs exactly these from there (--no-index), so the build needs no registry. torch is pinned (and the
# machine's CPU wheel found first) so that nothing pulls a CUDA build. The frameworks are pyproject's lightning
# and hf extras: jobs that train with them run in this image (tests/integration/test_frameworks_live.py).
# Their cost, measured (2026-11): +34 MB of wheels, +241 MB installed (torch and numpy alone: 966 MB).
# The CUDA variant asks for the registry's plain torch, which on Linux x86_64 is its CUDA build.
requirements="$torch
numpy
lightning>=2.0
transformers>=4.40
accelerate>=0.30"
mkdir -p "$ctx/wheels"
chmod 755 "$cache"
# The base system, debootstrapped from Debian's mirror: a download too, so it is made here with the wheels
# (a build host with no route out, the testbed's login host, finds it made), at the same time as them: the two
# wait on different servers (on a fresh machine about 45 s and 85 s, one after the other before).
make_base() {
    [ ! -s "$cache/rootfs.tar" ] || return 0
    say "debootstrap bookworm (minbase + python3)"
    rm -rf "$cache/rootfs"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
        bookworm "$cache/rootfs" >"$cache/debootstrap.log" 2>&1 \
        || { tail -20 "$cache/debootstrap.log" >&2; return 1; }
    rm -rf "$cache/rootfs/var/cache/apt/archives/"*.deb "$cache/rootfs/var/lib/apt/lists/"*
    tar -C "$cache/rootfs" -cf "$cache/rootfs.tar.part" .
    mv "$cache/rootfs.tar.part" "$cache/rootfs.tar"
    rm -rf "$cache/rootfs"
    say "bookworm base made"
}
make_base &
base_pid=$!
trap 'kill "$base_pid" 2>/dev/null || true' EXIT  # a failed download leaves no debootstrap behind
# The list downloaded last, written once its download succeeded: a changed list downloads again (pip skips
# the wheels already there).
if [ "$(cat "$ctx/wheels/requirements.txt" 2>/dev/null)" != "$requirements" ]; then
    say "downloading wheels ($(tr '\n' ' ' <<<"$requirements"))"
    printf '%s\n' "$requirements" >"$ctx/requirements.part"
    # Wheel folders already on the host are looked in first (a machine with the CPU wheel, or a site's own
    # mirror); anything else comes from the package registry.
    find_links=()
    for dir in /opt/wheels ${DLSUB_WHEEL_DIRS:-}; do
        [ -d "$dir" ] && find_links+=(--find-links "$dir")
    done
    "$venv_pip" download -q --disable-pip-version-check "${find_links[@]}" \
        -d "$ctx/wheels" -r "$ctx/requirements.part"
    mv "$ctx/requirements.part" "$ctx/wheels/requirements.txt"
    say "wheels downloaded"
fi
wait "$base_pid" || { say "making the bookworm base failed (debootstrap's last lines above)"; exit 1; }
trap - EXIT
[ "$wheels_only" -eq 1 ] && exit 0

if [ "$publish" -eq 1 ]; then
    site="${DLSUB_SITE_IMAGE_STORE:?--publish needs DLSUB_SITE_IMAGE_STORE, the site image store}"
    id="$(as_user podman image inspect --format '{{.Id}}' "$image")"
    if bash "$here/site-image-store.sh" --store "$site" list 2>/dev/null | grep -qF "${id:0:12}  ${image}  "; then
        say "$image (${id:0:12}) is in the site store $site"
        exit 0
    fi
    install -d -m 700 -o "$user" -g "$user" "$cache/archives"
    archive="$cache/archives/${id:0:12}.tar"
    rm -f "$archive"  # podman save does not overwrite, and a failed run may have left one
    trap 'rm -f "$archive"' EXIT
    say "saving $image (${id:0:12}) for the site store"
    as_user podman save -q -o "$archive" "$image"
    bash "$here/site-image-store.sh" --store "$site" add "$archive"
    exit 0
fi

# The CUDA image's torch, checked on every run (built now or before): a registry that handed out a CPU build
# would give a site's GPU nodes CPU torch without a word. torch.version.cuda is what the build was compiled
# against and needs no GPU; the libraries are loaded to read their versions (no driver needed for that).
check_cuda() {
    local found size
    found="$(as_user podman run --rm --network none --entrypoint python3 "$image" -c '
import torch
cuda = torch.version.cuda
if cuda is None:
    raise SystemExit(f"torch {torch.__version__} in this image is not a CUDA build")
nccl = ".".join(map(str, torch.cuda.nccl.version()))
print(f"torch {torch.__version__}, CUDA {cuda}, cuDNN {torch.backends.cudnn.version()}, NCCL {nccl}, "
      f"a GPU here: {torch.cuda.is_available()}")
')" || { say "$image: its torch check failed (its message above)"; exit 1; }
    size="$(as_user podman image inspect --format '{{.Size}}' "$image")"
    say "$image: $found; $((size / 1000000)) MB"
}

# The recipe: the Containerfile, this script, and the variant's list (the CPU and CUDA images share the first two).
recipe="$({ cat "$here/Containerfile" "$0"; printf '%s\n' "$requirements"; } | sha256sum | cut -c1-16)"
if as_user podman image exists "$image" \
   && [ "$(as_user podman image inspect --format '{{ index .Labels "dlsub.recipe" }}' "$image")" = "$recipe" ]; then
    say "$image is up to date"
    [ "$cuda" -eq 0 ] || check_cuda
    exit 0
fi

if ! as_user podman image exists "$base"; then
    [ -s "$cache/rootfs.tar" ] || { say "no $cache/rootfs.tar: run build-image.sh --wheels-only first"; exit 1; }
    chmod 644 "$cache/rootfs.tar"
    say "importing $base"
    as_user podman import --quiet "$cache/rootfs.tar" "$base" >/dev/null
fi

cp "$here/Containerfile" "$ctx/Containerfile"
chmod -R a+rX "$ctx"
say "building $image"
# The recipe as a build argument its RUN names: Podman's layer cache keys a RUN on its text, not on what its
# bind mount holds, so without it the CUDA build reused the CPU image's layer (torch 2.13.0+cpu, which the
# check below caught).
as_user podman build --quiet --network host --build-arg "DLSUB_RECIPE=$recipe" --label "dlsub.recipe=$recipe" \
    --label "org.opencontainers.image.description=$description" -t "$image" -f "$ctx/Containerfile" "$ctx" >/dev/null
say "built $image"
[ "$cuda" -eq 0 ] || check_cuda
