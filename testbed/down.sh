#!/usr/bin/env bash
# Stop what testbed/up.sh started, by pid file only. Packages, the user,
# its image and Slurm's state stay, so the next `make testbed` is fast.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/common.sh"
[ "$(id -u)" -eq 0 ] || die "run as root: sudo make testbed-down"
"$here/agent.sh" stop
"$here/agent.sh" stop "$LOGIN_HOST2"  # the second of a pair, where a test started one
stop_slurm
# Slurm's cgroup sub-trees (slurm_<node> in each v1 hierarchy, made by its cgroup plugins), empty once its
# daemons and jobs are gone: the host's hierarchies are left as they were. A cgroup still holding a process
# is not removable and stays.
for node in $TESTBED_NODES; do
    for tree in /sys/fs/cgroup/*/slurm_"$node"; do
        [ -d "$tree" ] && { find "$tree" -depth -type d -exec rmdir {} + 2>/dev/null || true; }
    done
done
stop_pidfile /run/dlsub-testbed/slurmdbd.pid
stop_pidfile "$MARIADB_PIDFILE"
stop_pidfile /run/munge/munged.pid
nethome_down
ldap_down
# The hosts (testbed/hosts.sh): their namespaces and the bridge. Their node-local disks stay
# (/var/lib/dlsub-testbed/hosts), so the next `make testbed` finds its image layers and state.
hosts_down
rm -f "$SLURM_UP_FILE"
say "testbed is down"
