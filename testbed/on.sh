#!/usr/bin/env bash
# Run a command on one of the testbed's hosts (testbed/hosts.sh), as root; the login host and a shell by default:
#   sudo bash testbed/on.sh                        a shell on login1, where users submit (as ssh login1 would)
#   sudo bash testbed/on.sh login1 runuser -u dltest -- dlsub status
#   sudo bash testbed/on.sh gpu1 ls /dev/nvidia*   a node's own view
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
[ -s /run/dlsub-testbed/slurm-version ] && DLSUB_SLURM="$(cat /run/dlsub-testbed/slurm-version)"
# shellcheck source=testbed/common.sh
. "$here/common.sh"
[ "$(id -u)" -eq 0 ] || die "run as root: sudo bash testbed/on.sh [HOST [COMMAND...]]"
host="${1:-$LOGIN_HOST}"
[ $# -gt 0 ] && shift
host_addr "$host" >/dev/null
host_is_up "$host" || die "host $host is not up: make testbed"
if [ $# -eq 0 ]; then
    set -- bash -l
fi
on_host "$host" "$@"
