#!/usr/bin/env bash
# `make demo`: submit the example training through dlsub, as the testbed's
# unprivileged user on a login node would, and show it to completion:
# status (step, loss, throughput, ETA) while it runs, then its output.
set -euo pipefail
user="${DLSUB_TESTBED_USER:-dltest}"
prefix="${DLSUB_PREFIX:-/opt/dlsub}"
as_user() {
    runuser -u "$user" -- env -i HOME="$(getent passwd "$user" | cut -d: -f6)" USER="$user" \
        PATH=/usr/local/bin:/usr/bin:/bin XDG_RUNTIME_DIR="/run/user/$(id -u "$user")" LANG=C.UTF-8 "$@"
}
# From the user's home, on the shared filesystem (a node sees it; the login host's /tmp is its own).
cd "$(getent passwd "$user" | cut -d: -f6)"
echo "\$ dlsub $prefix/examples/train_digits.py --epochs 15 --throttle 0.02   (as $user)"
out="$(as_user dlsub --json "$prefix/examples/train_digits.py" --epochs 15 --throttle 0.02)"
echo "$out"
id="$(python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])' <<<"$out")"
while :; do
    sleep 3
    echo "\$ dlsub status $id"
    table="$(as_user dlsub status "$id")"
    echo "$table"
    state="$(as_user dlsub status "$id" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')"
    case "$state" in COMPLETED|FAILED|CANCELLED|TIMEOUT|UNKNOWN) break ;; esac
done
echo "\$ dlsub logs $id"
as_user dlsub logs "$id"
[ "$state" = COMPLETED ] || { echo "demo: the job ended $state" >&2; exit 1; }
echo "demo: job $id COMPLETED through Slurm, in rootless Podman, under torchrun"
