#!/usr/bin/env bash
# The dlsub agent as the testbed runs it: `dlsub agent run` as the service
# account, from its pid file (a site would use etc/systemd/dlsub-agent.service).
#   agent.sh start | stop | restart | kill9   (kill9: as a crash would, for tests)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/common.sh"

pidfile=/run/dlsub/agent.pid
start() {
    # The socket users ask through lives in /run/dlsub (0755: anyone may reach
    # it); the state and the log are the service account's alone.
    install -d -m 755 -o "$AGENT_USER" -g "$AGENT_USER" /run/dlsub
    install -d -m 700 -o "$AGENT_USER" -g "$AGENT_USER" /var/lib/dlsub /var/log/dlsub
    chmod 700 /var/lib/dlsub /var/log/dlsub  # install -d leaves an existing directory's mode alone
    touch /var/log/dlsub/agent.log
    chown "$AGENT_USER:$AGENT_USER" /var/log/dlsub/agent.log
    chmod 600 /var/log/dlsub/agent.log
    pid_alive "$pidfile" && return 0
    say "starting the dlsub agent as $AGENT_USER"
    # A daemon keeps no descriptor it was not meant to: one inherited from
    # whoever started it (a lock held by a test run, say) would outlive them.
    local fd
    for fd in "/proc/$$/fd"/*; do
        fd="${fd##*/}"
        if [ "$fd" -gt 2 ] && [ "$fd" != 255 ]; then
            eval "exec ${fd}>&-"
        fi
    done
    # On the login host, as a site runs it (docs/admin-guide.md).
    on_host "$LOGIN_HOST" runuser -u "$AGENT_USER" -- setsid "$DLSUB_PREFIX/venv/bin/dlsub" agent run --pidfile "$pidfile" \
        >>/var/log/dlsub/agent.log 2>&1 </dev/null &
    for _ in $(seq 1 50); do
        pid_alive "$pidfile" && return 0
        sleep 0.2
    done
    die "the agent did not start: see /var/log/dlsub/agent.log"
}

case "${1:-start}" in
    start) start ;;
    stop) stop_pidfile "$pidfile" ;;
    restart) stop_pidfile "$pidfile"; start ;;
    kill9)
        if pid_alive "$pidfile"; then kill -9 "$(cat "$pidfile")"; fi
        ;;
    *) die "usage: agent.sh start|stop|restart|kill9" ;;
esac
