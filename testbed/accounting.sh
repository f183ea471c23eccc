#!/usr/bin/env bash
# Slurm accounting for the testbed (docs/admin-guide.md, the agent's account
# and its Operator level): MariaDB and slurmdbd started from their pid files, idempotently.
#   accounting.sh               start MariaDB and slurmdbd, create the database
#   accounting.sh associations  the cluster, account, users, and the agent's
#                               service account as Operator (needs slurmctld)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
. "$here/common.sh"

start_mariadb() {
    mkdir -p /run/mysqld
    chown mysql:mysql /run/mysqld
    if [ ! -d /var/lib/mysql/mysql ]; then
        say "initialising MariaDB's data directory"
        mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
    fi
    if ! pid_alive "$MARIADB_PIDFILE"; then
        say "starting MariaDB"
        setsid /usr/sbin/mariadbd --user=mysql --pid-file="$MARIADB_PIDFILE" \
            --socket=/run/mysqld/mysqld.sock --bind-address=127.0.0.1 \
            >>/var/log/dlsub-testbed/mariadb.log 2>&1 < /dev/null &
    fi
    for _ in $(seq 1 60); do
        mariadb -e 'select 1' >/dev/null 2>&1 && break
        sleep 0.5
    done
    mariadb -e 'select 1' >/dev/null || die "MariaDB did not start: see /var/log/dlsub-testbed/mariadb.log"
    # Newer client libraries (Debian unstable's, under Slurm 26.05) look for the socket here.
    mkdir -p /run/mariadbd
    ln -sfn /run/mysqld/mysqld.sock /run/mariadbd/mysqld.sock
    # slurmdbd connects as the Unix user slurm over the socket: no password.
    # Each Slurm version has a database of its own (see slurmdbd.conf).
    local database
    database="$(render_slurm_conf "$repo/etc/testbed/slurmdbd.conf" | awk -F= '/^StorageLoc=/{print $2}')"
    mariadb <<SQL
CREATE DATABASE IF NOT EXISTS $database;
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED VIA unix_socket;
GRANT ALL ON $database.* TO 'slurm'@'localhost';
SQL
}

start_slurmdbd() {
    if ! render_slurm_conf "$repo/etc/testbed/slurmdbd.conf" | cmp -s - /etc/slurm/slurmdbd.conf; then
        render_slurm_conf "$repo/etc/testbed/slurmdbd.conf" \
            | install -m 600 -o slurm -g slurm /dev/stdin /etc/slurm/slurmdbd.conf
        stop_pidfile /run/dlsub-testbed/slurmdbd.pid
    fi
    if ! pid_alive /run/dlsub-testbed/slurmdbd.pid; then
        say "starting slurmdbd $SLURM_VERSION"
        on_host "$HEAD_HOST" "$SLURM_SBIN/slurmdbd"
    fi
    for _ in $(seq 1 60); do
        slurm_cli sacctmgr -n show cluster >/dev/null 2>&1 && return 0
        sleep 0.5
    done
    die "slurmdbd does not answer: see /var/log/dlsub-testbed/slurmdbd.log"
}

# Add an accounting entity only when it is not there yet (sacctmgr add
# fails on duplicates).
ensure() {  # kind name [options...]
    local kind="$1" name="$2"
    shift 2
    if [ -z "$(slurm_cli sacctmgr -n -P show "$kind" "$name" "format=$kind" 2>/dev/null | head -1)" ]; then
        slurm_cli sacctmgr -i add "$kind" "$name" "$@" >/dev/null
    fi
}

associations() {
    local cluster
    cluster="$(awk -F= '/^ClusterName=/{print $2}' /etc/slurm/slurm.conf)"
    ensure cluster "$cluster"
    ensure account research "cluster=$cluster" "description=testbed users" "organization=dlsub"
    ensure user "$TESTBED_USER" account=research "cluster=$cluster"
    ensure user "$TESTBED_USER2" account=research "cluster=$cluster"
    ensure user "$TESTBED_USER3" account=research "cluster=$cluster"
    [ "$TESTBED_FOR" = demo ] || ensure user "$TESTBED_LDAP_USER" account=research "cluster=$cluster"
    ensure user root account=research "cluster=$cluster"
    ensure user "$AGENT_USER" account=research "cluster=$cluster"
    if ! slurm_cli sacctmgr -n -P show user "$AGENT_USER" format=adminlevel | grep -qx Operator; then
        slurm_cli sacctmgr -i modify user "$AGENT_USER" set adminlevel=Operator >/dev/null
    fi
    # slurmctld reads associations when it starts or when told to.
    slurm_cli scontrol reconfigure >/dev/null 2>&1 || true
}

case "${1:-start}" in
    start)
        start_mariadb
        start_slurmdbd
        ensure cluster "$(awk -F= '/^ClusterName=/{print $2}' "$repo/etc/testbed/slurm.conf")"
        ;;
    associations) associations ;;
    *) die "usage: accounting.sh [start|associations]" ;;
esac
