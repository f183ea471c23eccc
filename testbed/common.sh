# shellcheck shell=bash disable=SC2034
# Shared by the testbed's scripts (sourced, not run; the variables are theirs).
# The unprivileged job users: the first runs the tests' jobs (and has the
# image); the second plays another user for the privacy and trust tests.
TESTBED_USER="${DLSUB_TESTBED_USER:-dltest}"
TESTBED_USER2="${DLSUB_TESTBED_USER2:-dltest2}"
TESTBED_NODES="cpu1 cpu2 gpu1 gpu2"
DLSUB_PREFIX="${DLSUB_PREFIX:-/opt/dlsub}"
# The agent's service account (a Slurm Operator) and MariaDB's pid file.
AGENT_USER="${DLSUB_AGENT_USER:-dlsub}"
MARIADB_PIDFILE=/run/mysqld/mysqld.pid  # written by mariadbd itself, as user mysql

say() { printf 'testbed: %s\n' "$*" >&2; }
die() { printf 'testbed: error: %s\n' "$*" >&2; exit 1; }

# True when the pid file names a live process.
pid_alive() {
    local pidfile="$1" pid
    [ -s "$pidfile" ] || return 1
    pid="$(cat "$pidfile")"
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null
}

# Stop one daemon by its pid file (only processes we started), waiting for it.
stop_pidfile() {
    local pidfile="$1" pid
    pid_alive "$pidfile" || { rm -f "$pidfile"; return 0; }
    pid="$(cat "$pidfile")"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    if kill -0 "$pid" 2>/dev/null; then
        kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
}

stop_slurm() {
    local node
    for node in $TESTBED_NODES; do
        stop_pidfile "/run/dlsub-testbed/slurmd-$node.pid"
    done
    stop_pidfile /run/dlsub-testbed/slurmctld.pid
}

# Wait until every node has registered and none is down or invalid.
wait_for_nodes() {
    local states
    for _ in $(seq 1 60); do
        states="$(sinfo -h -N -o '%N %t' 2>/dev/null | sort -u)"
        if [ -n "$states" ] && ! grep -Eq ' (unk|down|inval|drain|drng|fail|no_respond)' <<<"$states" \
           && [ "$(wc -l <<<"$states")" -ge 4 ]; then
            return 0
        fi
        # A node that was down before a restart stays down until resumed.
        if grep -Eq ' (down|drain)' <<<"$states"; then
            scontrol update nodename="$(awk '/ (down|drain)/{print $1}' <<<"$states" | paste -sd,)" state=resume 2>/dev/null || true
        fi
        sleep 1
    done
    die "nodes did not come up: $states (see /var/log/dlsub-testbed/)"
}
