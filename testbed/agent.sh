#!/usr/bin/env bash
# The dlsub agent as the testbed runs it: `dlsub agent run` as the service
# account, from its pid file (a site would use etc/systemd/dlsub-agent.service).
#   agent.sh start | stop | restart | kill9 [HOST]   (kill9: as a crash would, for tests)
# HOST: the login host it runs on (login1, the default; login2 for the second of a pair, whose state is
# then named by $DLSUB_AGENT_DB: a database on the machine's disk, which both login hosts see as they would a
# shared filesystem). Its pid file and log as this machine sees them: /run/dlsub/agent.pid and
# /var/log/dlsub/agent.log on login1 (the machine's own); login2's /run/dlsub is its own
# (testbed/hosts.sh), its log /var/log/dlsub/agent-login2.log.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/common.sh"

host="${2:-$LOGIN_HOST}"
case "$host" in
    "$LOGIN_HOST") run_dir=/run/dlsub; state_dir=/var/lib/dlsub; log=/var/log/dlsub/agent.log ;;
    "$LOGIN_HOST2") run_dir="$HOSTS_DIR/$host/run-dlsub"; state_dir="$HOSTS_DIR/$host/var-lib-dlsub"
                    log="/var/log/dlsub/agent-$host.log" ;;
    *) die "agent.sh: the agent runs on a login host ($LOGIN_HOST or $LOGIN_HOST2), not on $host" ;;
esac
pidfile="$run_dir/agent.pid"
db_option=()
[ -n "${DLSUB_AGENT_DB:-}" ] && db_option=(--db "$DLSUB_AGENT_DB")
start() {
    # The socket users ask through lives in /run/dlsub (0755: anyone may reach
    # it); the state and the log are the service account's alone.
    install -d -m 755 -o "$AGENT_USER" -g "$AGENT_USER" "$run_dir"
    install -d -m 700 -o "$AGENT_USER" -g "$AGENT_USER" "$state_dir" /var/log/dlsub
    chmod 700 "$state_dir" /var/log/dlsub  # install -d leaves an existing directory's mode alone
    touch "$log"
    chown "$AGENT_USER:$AGENT_USER" "$log"
    chmod 600 "$log"
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
    # On the login host, as a site runs it (docs/admin-guide.md); the pid file as the host sees it.
    on_host "$host" runuser -u "$AGENT_USER" -- setsid "$DLSUB_PREFIX/venv/bin/dlsub" agent run \
        --pidfile /run/dlsub/agent.pid "${db_option[@]}" >>"$log" 2>&1 </dev/null &
    for _ in $(seq 1 50); do
        pid_alive "$pidfile" && return 0
        sleep 0.2
    done
    die "the agent did not start on $host: see $log"
}

case "${1:-start}" in
    start) start ;;
    stop) stop_pidfile "$pidfile" ;;
    restart) stop_pidfile "$pidfile"; start ;;
    kill9)
        if pid_alive "$pidfile"; then kill -9 "$(cat "$pidfile")"; fi
        ;;
    *) die "usage: agent.sh start|stop|restart|kill9 [HOST]" ;;
esac
