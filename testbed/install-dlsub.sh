#!/usr/bin/env bash
# Install dlsub system-wide, as a site would on a login node: a virtualenv
# under /opt/dlsub (readable by every user) and `dlsub` on every user's PATH.
# torch and numpy go in too: the examples and the bare-metal benchmark run on
# the host as well as in the container.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
. "$here/common.sh"

venv="$DLSUB_PREFIX/venv"
pip_opts=(-q --disable-pip-version-check)
# The machine's local torch wheel (a CPU build); without it pip would pull
# the CUDA build and GBs of packages.
[ -d /opt/wheels ] && pip_opts+=(--find-links /opt/wheels)

ensure_venv
# Whether the venv has these modules, found without importing them (importing torch and the frameworks took
# 9 s, at each of CI's three testbed runs).
has() {  # module...
    "$venv/bin/python" -c 'import importlib.util, sys; sys.exit(any(importlib.util.find_spec(m) is None for m in sys.argv[1:]))' "$@" 2>/dev/null
}
if ! has torch numpy scipy matplotlib apscheduler pytest hypothesis click sqlite_utils; then
    say "installing torch==2.13.0, numpy, scipy, matplotlib, apscheduler, pytest, hypothesis into $venv"
    "$venv/bin/pip" install "${pip_opts[@]}" "torch==2.13.0" numpy "scipy>=1.10" "matplotlib>=3.7" "apscheduler>=3.10,<4" pytest \
        "hypothesis>=6.80" "click>=8.1" "sqlite-utils>=3.35"
fi
# The dashboard (FastAPI, uvicorn, Jinja2) and the agent's metrics (prometheus-client).
if ! has fastapi uvicorn jinja2 prometheus_client; then
    say "installing fastapi, uvicorn, jinja2, prometheus-client into $venv"
    "$venv/bin/pip" install "${pip_opts[@]}" "fastapi>=0.110" "uvicorn>=0.29" "jinja2>=3.1" "prometheus-client>=0.17"
fi
# For the tests only (TESTBED_FOR, common.sh; make demo goes without them).
if [ "$TESTBED_FOR" != demo ]; then
    # The dashboard's tests: httpx for FastAPI's test client; Playwright, which drives Debian's chromium.
    if ! has httpx playwright; then
        say "installing httpx, playwright into $venv"
        "$venv/bin/pip" install "${pip_opts[@]}" httpx playwright
    fi
    # The training frameworks dlsub.checkpointing has adapters for (pyproject's lightning and hf extras), for
    # their unit tests and examples. torch==2.13.0 is named again so that pip keeps the CPU build installed above.
    if ! has lightning pytorch_lightning transformers accelerate; then
        say "installing lightning, transformers, accelerate into $venv"
        "$venv/bin/pip" install "${pip_opts[@]}" "torch==2.13.0" "lightning>=2.0" "transformers>=4.40" "accelerate>=0.30"
    fi
    # `make lint`. (What dlsub imports ships its types, or is listed in pyproject's mypy overrides: no stub
    # packages needed.) import-linter checks the layering (pyproject's [tool.importlinter]).
    if ! has mypy ruff importlinter; then
        say "installing mypy, ruff and import-linter into $venv"
        "$venv/bin/pip" install "${pip_opts[@]}" mypy ruff import-linter
    fi
fi
# htmx for the dashboard's live updates, from the npm registry (served by the dashboard itself:
# no CDN at run time). Kept under $DLSUB_PREFIX/share so a reinstall needs no network.
htmx_version=2.0.11
htmx="$DLSUB_PREFIX/share/htmx-$htmx_version.min.js"
if [ ! -s "$htmx" ]; then
    say "fetching htmx $htmx_version from the npm registry"
    npm_dir="$(mktemp -d)"
    (cd "$npm_dir" && npm pack --silent "htmx.org@$htmx_version" >/dev/null \
        && tar -xzf "htmx.org-$htmx_version.tgz" package/dist/htmx.min.js)
    install -D -m 644 "$npm_dir/package/dist/htmx.min.js" "$htmx"
    rm -rf "$npm_dir"
fi
# Build from a copy so that nothing is written into the checkout.
build="$(mktemp -d)"
trap 'rm -rf "$build"' EXIT
# Less the caches tools leave in a checkout (bytecode, pytest's, hypothesis', ruff's, mypy's) and benchmarks' out/: no
# part of dlsub, and would make the same sources look changed below.
tar -C "$repo" --exclude=.git --exclude=build --exclude='*.egg-info' --exclude=__pycache__ --exclude='*.pyc' \
    --exclude=.pytest_cache --exclude=.hypothesis --exclude=.ruff_cache --exclude=.mypy_cache --exclude=./out -cf - . \
    | tar -C "$build" -xf -
install -m 644 "$htmx" "$build/dashboard/static/htmx.min.js"  # package data of the installed dlsub only
# The same sources as the installed dlsub (every file's content, htmx's included): nothing to build. CI's
# version switches (make test-compat) install the same checkout again, and pip's build took most of this script's
# 10 s each time.
sources="$(cd "$build" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)"
installed_from="$venv/dlsub-sources.sha256"
if [ -x "$venv/bin/dlsub" ] && [ "$(cat "$installed_from" 2>/dev/null)" = "$sources" ]; then
    say "dlsub's sources unchanged since it was installed: not built again"
else
    rm -f "$installed_from"
    "$venv/bin/pip" install "${pip_opts[@]}" --no-deps --force-reinstall "$build" >/dev/null
    echo "$sources" > "$installed_from"
fi
ln -sf "$venv/bin/dlsub" /usr/local/bin/dlsub
rm -rf "$DLSUB_PREFIX/examples"
cp -r "$repo/examples" "$DLSUB_PREFIX/examples"
chmod -R a+rX "$DLSUB_PREFIX"
say "dlsub $("$venv/bin/dlsub" --version 2>/dev/null | awk '{print $NF}') installed in $venv"
