#!/usr/bin/env bash
# One slurmd of the testbed, for tests that fail a node on purpose:
#   node.sh stop NODE | start NODE   (the version that is up)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
[ -s /run/dlsub-testbed/slurm-version ] && DLSUB_SLURM="$(cat /run/dlsub-testbed/slurm-version)"
. "$here/common.sh"
case "${1:-}" in
    stop) stop_pidfile "/run/dlsub-testbed/slurmd-${2:?node}.pid" ;;
    start) pid_alive "/run/dlsub-testbed/slurmd-${2:?node}.pid" || start_slurmd "$2" ;;
    *) die "usage: node.sh stop|start NODE" ;;
esac
