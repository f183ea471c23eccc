#!/usr/bin/env bash
# Build dlsub's optional Horovod image offline into USER's rootless Podman storage:
#   1. pip download Horovod 0.28.1's source and its dependencies' wheels on the host, and build Horovod's
#      wheel there in a virtualenv holding the CPU image's own torch wheel, for the image's Python (its
#      wheels' cp tag): HOROVOD_WITH_PYTORCH, HOROVOD_WITH_GLOO, no MPI, TensorFlow or MXNet;
#   2. the CPU image (build-image.sh USER), then podman build Containerfile.horovod on it: those wheels,
#      installed with --no-index, and a check that Horovod starts in it.
# Usage: build-horovod-image.sh [--wheels-only] USER [IMAGE]   (IMAGE: localhost/dlsub-torch:2.13.0-cpu-horovod)
#   --wheels-only: step 1 alone, on a host that reaches the package registries (the testbed's login host
#   has none: make image-horovod runs step 1 on the machine, step 2 there).
# Why a patch: Horovod 0.28.1 (its last release) sets CMAKE_CXX_STANDARD 14 in CMakeLists.txt and again in
# horovod/torch/CMakeLists.txt, and torch 2.13's headers refuse it ("#error C++17 or later compatible compiler
# is required to use PyTorch", then some 20,000 errors). Both lines are set to 17 here, and checked.
# Needs g++ and make on the build host (cmake comes as a wheel). About 9 minutes at one core; never in CI's
# path (make image-horovod builds it; tests/integration/test_horovod_live.py runs where it exists).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
wheels_only=0
if [ "${1:-}" = --wheels-only ]; then
    wheels_only=1
    shift
fi
user="${1:?usage: build-horovod-image.sh [--wheels-only] USER [IMAGE]}"
image="${2:-localhost/dlsub-torch:2.13.0-cpu-horovod}"
base_image="localhost/dlsub-torch:2.13.0-cpu"
horovod="horovod==0.28.1"
cache="${DLSUB_IMAGE_CACHE:-/var/cache/dlsub-image}"
ctx="$cache/context-horovod"
build="$cache/horovod-build"
python="${DLSUB_HOROVOD_PYTHON:-python3}"

say() { printf 'build-horovod-image: %s\n' "$*" >&2; }

# 1. Horovod's wheel, built once, against the CPU image's torch wheel (downloaded by build-image.sh).
mkdir -p "$ctx/wheels" "$build"
wheel="$(find "$ctx/wheels" -maxdepth 1 -name 'horovod-0.28.1-*.whl' | head -1)"
if [ -z "$wheel" ]; then
    [ "$wheels_only" -eq 1 ] || { say "no Horovod wheel in $ctx/wheels: run build-horovod-image.sh --wheels-only first"; exit 1; }
    bash "$here/build-image.sh" --wheels-only "$user"
    torch_wheel="$(find "$cache/context/wheels" -maxdepth 1 -name 'torch-2.13.0*.whl' | head -1)"
    [ -n "$torch_wheel" ] || { say "no torch 2.13.0 wheel in $cache/context/wheels"; exit 1; }
    wanted="$(basename "$torch_wheel" | grep -o -- '-cp3[0-9]*-' | head -1 | tr -d -)"
    have="$("$python" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')"
    [ "$have" = "$wanted" ] || {
        say "$python is $have, the image's torch is $wanted: Horovod's extension must be built for the image's" \
            "Python (set DLSUB_HOROVOD_PYTHON to that Python)"; exit 1; }
    if ! command -v g++ >/dev/null || ! command -v make >/dev/null; then
        say "needs g++ and make on the build host (apt install g++ make)"; exit 1
    fi
    say "downloading $horovod's source and the build's tools"
    rm -rf "$build/src" "$build/venv" "$build/wheel"
    mkdir -p "$build/src"
    "$python" -m venv "$build/venv"
    "$build/venv/bin/pip" download -q --disable-pip-version-check --no-deps --no-binary horovod \
        -d "$build/src" "$horovod"
    "$build/venv/bin/pip" install -q --disable-pip-version-check --find-links "$cache/context/wheels" \
        "$torch_wheel" cmake setuptools wheel packaging pyyaml cloudpickle psutil cffi
    tar -C "$build/src" -xzf "$build/src"/horovod-0.28.1.tar.gz
    src="$build/src/horovod-0.28.1"
    sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$src/CMakeLists.txt" \
        "$src/horovod/torch/CMakeLists.txt"
    for f in "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"; do
        if ! grep -q 'set(CMAKE_CXX_STANDARD 17)' "$f" || grep -q 'set(CMAKE_CXX_STANDARD 14)' "$f"; then
            say "the C++17 patch did not apply to $f: is it still Horovod 0.28.1's?"; exit 1
        fi
    done
    say "building Horovod's wheel (about 9 minutes at one core; log in $build/wheel.log)"
    (cd "$build" && HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
        HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=gloo \
        "$build/venv/bin/pip" wheel --no-deps --no-build-isolation -w "$build/wheel" "$src" >"$build/wheel.log" 2>&1) \
        || { tail -30 "$build/wheel.log" >&2; say "Horovod's build failed (the log's end above)"; exit 1; }
    wheel="$(find "$build/wheel" -maxdepth 1 -name 'horovod-0.28.1-*.whl' | head -1)"
    "$build/venv/bin/pip" download -q --disable-pip-version-check -d "$ctx/wheels" \
        cloudpickle psutil pyyaml packaging cffi
    cp "$wheel" "$ctx/wheels/"
    wheel="$ctx/wheels/$(basename "$wheel")"
fi
printf '%s\n' "$horovod" >"$ctx/wheels/requirements.txt"
[ "$wheels_only" -eq 1 ] && exit 0

# 2. The CPU image (nothing to do when it is up to date), then this one on it, built again when the recipe,
# the wheel or the base image changed.
# shellcheck source=containers/image-user.sh
source "$here/image-user.sh"
DLSUB_IMAGE="$base_image" bash "$here/build-image.sh" "$user"
base_id="$(as_user podman image inspect --format '{{.Id}}' "$base_image")"
recipe="$({ cat "$here/Containerfile.horovod" "$0"; sha256sum "$wheel" | cut -c1-64; echo "$base_id"; } \
    | sha256sum | cut -c1-16)"
if as_user podman image exists "$image" \
   && [ "$(as_user podman image inspect --format '{{ index .Labels "dlsub.recipe" }}' "$image")" = "$recipe" ]; then
    say "$image is up to date"
else
    cp "$here/Containerfile.horovod" "$ctx/Containerfile"
    chmod -R a+rX "$ctx"
    chmod 755 "$cache"
    say "building $image"
    as_user podman build --quiet --network none --build-arg "DLSUB_BASE_IMAGE=$base_image" \
        --build-arg "DLSUB_RECIPE=$recipe" --label "dlsub.recipe=$recipe" \
        --label "org.opencontainers.image.description=PyTorch 2.13 CPU with Horovod 0.28.1 (gloo), numpy, Lightning, transformers, accelerate on Debian bookworm, for dlsub jobs" \
        -t "$image" -f "$ctx/Containerfile" "$ctx" >/dev/null
fi
found="$(as_user podman run --rm --network none --env HOROVOD_GLOO_IFACE=lo --entrypoint python3 "$image" -c '
import horovod, torch, horovod.torch as hvd
hvd.init()
print(f"horovod {horovod.__version__} (gloo {hvd.gloo_built()}, mpi {hvd.mpi_built()}), torch {torch.__version__}")
')" || { say "$image: its Horovod check failed (its message above)"; exit 1; }
size="$(as_user podman image inspect --format '{{.Size}}' "$image")"
say "$image: $found; $((size / 1000000)) MB"
