#!/usr/bin/env bash
# One head's slurmctld, for tests that fail the controller on purpose (the testbed's failover test):
#   controller.sh start HEAD   (the version that is up; whether it is the primary or the backup, Slurm's
#                               configuration says by the host's name: etc/testbed/slurm.conf)
# Stopping one is a kill of its pid (tests/integration's livebed.kill_slurmctld), as a crash would be.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
[ -s /run/dlsub-testbed/slurm-version ] && DLSUB_SLURM="$(cat /run/dlsub-testbed/slurm-version)"
. "$here/common.sh"
case "${1:-}" in
    start) [ -n "$(slurmctld_on_port "${2:?head}")" ] || start_slurmctld "$2" ;;
    *) die "usage: controller.sh start HEAD" ;;
esac
