# shellcheck shell=bash disable=SC2034
# Shared by the testbed's scripts (sourced, not run; the variables are theirs).
# The unprivileged job users: the first runs the tests' jobs (and builds the
# site's image); the second plays another user for the privacy and trust
# tests; the third has never run Podman. Every one runs the site's image.
TESTBED_USER="${DLSUB_TESTBED_USER:-dltest}"
TESTBED_USER2="${DLSUB_TESTBED_USER2:-dltest2}"
TESTBED_USER3="${DLSUB_TESTBED_USER3:-dltest3}"
# The site's read-only image store (containers/site-image-store.sh): root's, read by every user's Podman as
# an additional image store. One path every host sees (the machine's disk), as a shared filesystem would be.
SITE_IMAGE_STORE=/var/lib/dlsub-images
TESTBED_NODES="cpu1 cpu2 gpu1 gpu2"
DLSUB_PREFIX="${DLSUB_PREFIX:-/opt/dlsub}"
# What the testbed is brought up for: "test" (make test, make testbed, make install: everything, with the
# browser for the dashboard's tests, the linters and the training frameworks' packages) or "demo" (make demo:
# what a job through dlsub needs, so that a fresh machine shows one sooner). A later make test adds the rest.
TESTBED_FOR="${DLSUB_TESTBED_FOR:-test}"
# The agent's service account (a Slurm Operator) and MariaDB's pid file.
AGENT_USER="${DLSUB_AGENT_USER:-dlsub}"
MARIADB_PIDFILE=/run/mysqld/mysqld.pid  # written by mariadbd itself, as user mysql

# Which Slurm the testbed runs (`make testbed SLURM=24.11`): 22.05 is this
# machine's Debian 12 packages; newer ones are Debian's own packages of a newer
# release, unpacked and made runnable here by slurm-tree.sh.
SLURM_VERSIONS="22.05 24.11 26.05"
SLURM_VERSION="${DLSUB_SLURM:-24.11}"
SLURM_TREES=/var/lib/dlsub-testbed/slurm
# What is up now (written by up.sh): switching versions stops the old one first.
SLURM_UP_FILE=/run/dlsub-testbed/slurm-version
# The Slurm clients of a newer tree, on every user's PATH ahead of /usr/bin.
SLURM_CLIENT_LINKS=/usr/local/bin
SLURM_CLIENTS="sacct sacctmgr salloc sattach sbatch sbcast scancel scontrol scrontab sdiag sinfo sprio squeue sreport srun sshare sstat strigger"
PATH="$SLURM_CLIENT_LINKS:$PATH"

# The Debian release whose packages carry that Slurm.
slurm_suite() {
    case "$1" in
        22.05) echo bookworm ;;
        24.11) echo trixie ;;
        26.05) echo sid ;;
        *) die "Slurm $1 is not one the testbed runs: choose one of $SLURM_VERSIONS (make testbed SLURM=24.11)" ;;
    esac
}
slurm_suite "$SLURM_VERSION" >/dev/null
# Where that version's daemons are (slurmctld, slurmd, slurmstepd, slurmdbd).
if [ "$SLURM_VERSION" = 22.05 ]; then
    SLURM_SBIN=/usr/sbin
else
    SLURM_SBIN="$SLURM_TREES/$SLURM_VERSION/bin"
fi
# Each version keeps its own state (no version reads a newer one's).
SLURM_SPOOL="/var/spool/dlsub-testbed/$SLURM_VERSION"

# Each line with the time, so that a fresh machine's log (CI's) says where a testbed's minutes go.
say() { printf 'testbed: %s %s\n' "$(date +%T)" "$*" >&2; }
die() { printf 'testbed: error: %s\n' "$*" >&2; exit 1; }

# dlsub's virtualenv, made when missing: install-dlsub.sh fills it; up.sh makes it first, so that the image's
# wheel download (build-image.sh --wheels-only, with its pip) runs beside that install.
ensure_venv() {
    if [ ! -x "$DLSUB_PREFIX/venv/bin/python" ]; then
        say "creating $DLSUB_PREFIX/venv"
        /usr/bin/python3 -m venv "$DLSUB_PREFIX/venv"
    fi
}

# Steps that wait on the network and the disk more than on the CPUs (a fresh machine's downloads and
# unpacking), run at once: side_by_side starts one in the background; await_side_by_side waits for every one
# started and stops the script at the first that failed (its own message is already in the log).
side_pids=()
side_by_side() {
    "$@" &
    side_pids+=("$!")
}
await_side_by_side() {
    local pid
    for pid in "${side_pids[@]}"; do
        wait "$pid" || die "a step run side by side failed (its message is above)"
    done
    side_pids=()
}

# True when the pid file names a live process of ours.
# A pid file names our process only while that process is older than the file: a run ended without
# `make testbed-down` (a session's processes killed, the machine's state kept) leaves its pid files behind, and
# by the next run their pids may be other processes' (CI's run found slurmdbd "alive" as some other process,
# never started it, and waited for it in vain; stop_pidfile would have signalled that process).
# That age is read once, when a process is first found alive, as the wall clock tells it; from then on the
# process is known by its pid and its start (pid_record): the wall clock may be stepped while the testbed runs
# (a virtual machine restored from a snapshot sets its clock forward), and a process that started a second
# before its pid file would then look as if it had started after it. CI's run lost every host's keeper so and
# could no longer start the agent ("nsenter: reassociate to namespace 'ns/uts' failed").
pid_alive() {
    local pidfile="$1" pid
    [ -s "$pidfile" ] || return 1
    pid="$(cat "$pidfile")"
    [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null && ! zombie "$pid" || return 1
    # The process found before (the same pid, start and boot), else one older than the file.
    [ "$(cat "$(pid_record "$pidfile")" 2>/dev/null)" = "$pid $(started "$pid") $(boot_id)" ] && return 0
    started_before "$pid" "$pidfile" || return 1
    remember_pid "$pidfile" "$pid" 2>/dev/null || true  # unrecorded (a folder not ours), it is read so again
}

# Where pid_alive keeps each pid file's process once found (one file per pid file, named by its path).
PID_RECORDS="${DLSUB_TESTBED_PID_RECORDS:-/run/dlsub-testbed/pids}"
pid_record() {  # pidfile
    local name="${1//\//%}"
    echo "$PID_RECORDS/$name"
}

# This boot's id: a record of an earlier boot names no process of this one, whatever its pid and start.
boot_id() {
    cat /proc/sys/kernel/random/boot_id
}

# Record that a pid file names a process we started (its pid and its start), for pid_alive.
remember_pid() {  # pidfile pid
    local record
    record="$(pid_record "$1")"
    mkdir -p "$PID_RECORDS"
    printf '%s %s %s\n' "$2" "$(started "$2")" "$(boot_id)" > "$record.new"
    mv -f "$record.new" "$record"
}

# One field of /proc/PID/stat, counted from its state (field 3) on: the name before it, in parentheses, may
# hold spaces. Fails where the process is gone.
proc_stat_field() {  # pid n
    local stat
    stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
    awk -v n="$2" '{ print $n }' <<<"${stat##*) }"
}

# A killed daemon stays a zombie until its parent (init, for a daemon) reaps it, and kill -0 still finds it.
zombie() {  # pid
    [ "$(proc_stat_field "$1" 1)" = Z ]
}

# A process's start, in clock ticks since the machine booted (0 where it is gone).
started() {  # pid
    proc_stat_field "$1" 20 || echo 0
}

# Whether a process started no later than a file was last written (to the second: /proc/stat's boot time is
# whole seconds). A daemon writes its pid file after it starts; a process that took the pid over after the
# daemon died started after.
started_before() {  # pid file
    local ticks_per_s boot written
    ticks_per_s="$(getconf CLK_TCK)"
    boot="$(awk '$1 == "btime" { print $2 }' /proc/stat)"
    written="$(stat -c %Y "$2")" || return 1
    [ "$(started "$1")" -le "$(( (written - boot + 1) * ticks_per_s ))" ]
}

# Stop daemons by their pid files (only processes we started), all at once, waiting for them.
stop_pidfile() {  # pidfile...
    local pidfile pids=()
    for pidfile in "$@"; do
        pid_alive "$pidfile" && pids+=("$(cat "$pidfile")")
    done
    [ ${#pids[@]} -eq 0 ] || stop_pid "${pids[@]}"
    for pidfile in "$@"; do
        rm -f "$pidfile" "$(pid_record "$pidfile")"
    done
}

# Stop processes we started: TERM to each at once, then KILL to any still there after 10 s. At once, since a
# Slurm daemon takes 2-4 s to end after its TERM (one after the other, the 4 slurmd, 2 slurmctld and slurmdbd of
# a version switch took 17 s).
stop_pid() {  # pid...
    local pid left=("$@") alive
    kill "$@" 2>/dev/null || true
    for _ in $(seq 1 50); do
        alive=()
        for pid in "${left[@]}"; do
            if kill -0 "$pid" 2>/dev/null; then alive+=("$pid"); fi
        done
        [ ${#alive[@]} -gt 0 ] || return 0
        left=("${alive[@]}")
        sleep 0.2
    done
    kill -9 "${left[@]}" 2>/dev/null || true
}

# One of etc/testbed's Slurm configuration files, for the version that comes up:
# its state directory, its accounting database, and (a newer tree) its plugins.
render_slurm_conf() {  # file
    local database=slurm_acct_db
    [ "$SLURM_VERSION" = 22.05 ] || database="slurm_acct_db_${SLURM_VERSION/./_}"
    sed -e "s|@SPOOL@|$SLURM_SPOOL|g" -e "s|@DATABASE@|$database|g" "$1"
    # (Not in gres.conf or cgroup.conf, which take no PluginDir.)
    if [ "$SLURM_VERSION" != 22.05 ] && [[ "$(basename "$1")" != @(gres|cgroup).conf ]]; then
        printf '# The plugins of the Slurm %s tree (testbed/slurm-tree.sh).\nPluginDir=%s\n' \
            "$SLURM_VERSION" "$(cat "$SLURM_TREES/$SLURM_VERSION/plugindir")"
    fi
}

# A node's slurmd, on its own host (testbed/hosts.sh).
start_slurmd() {  # node
    on_host "$1" "$SLURM_SBIN/slurmd" -N "$1" -d "$SLURM_SBIN/slurmstepd"
}

# Slurm's clients, as a user of the cluster runs them: on the login host.
slurm_cli() {
    on_host "$LOGIN_HOST" "$@"
}

# Where a head's slurmctld keeps its pid (etc/testbed/slurm.conf's /run/slurm, that host's own: testbed/hosts.sh).
slurmctld_pidfile() {  # head
    echo "$HOSTS_DIR/$1/run-slurm/slurmctld.pid"
}

# A head's slurmctld, primary or backup (which one it is, Slurm's configuration says: the host's name).
start_slurmctld() {  # head
    on_host "$1" "$SLURM_SBIN/slurmctld"
}

# The pid of the slurmctld that listens on the testbed's port on a head (etc/testbed/slurm.conf), if any.
# Its pid file is not enough: from 23.11 on, slurmctld re-executes itself under a new pid on
# `scontrol reconfigure` (which up.sh runs), and the pid file may still name the old one; a
# slurmctld left so blocks the next version's from binding the port.
slurmctld_on_port() {  # head
    local pid
    host_is_up "$1" || return 0
    pid="$(on_host "$1" ss -Hltnp 'sport = :6817' 2>/dev/null | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2)"
    [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = slurmctld ] && echo "$pid"
    return 0
}

# True when the process runs this version's Slurm: a tree's binaries lie under $SLURM_TREES/V/
# (testbed/slurm-tree.sh), 22.05's are the machine's own.
runs_this_slurm() {  # pid
    local exe
    exe="$(readlink "/proc/$1/exe" 2>/dev/null)" || return 1
    if [ "$SLURM_VERSION" = 22.05 ]; then
        [[ "$exe" != "$SLURM_TREES"/* ]]
    else
        [[ "$exe" == "$SLURM_TREES/$SLURM_VERSION"/* ]]
    fi
}

stop_slurm() {
    local node slurmds=()
    for node in $TESTBED_NODES; do
        slurmds+=("/run/dlsub-testbed/slurmd-$node.pid")
    done
    # The backup first, with the slurmds: stopped after the primary, it would take control in the meantime.
    stop_pidfile "${slurmds[@]}" "$(slurmctld_pidfile "$HEAD_HOST2")"
    stop_slurmctld_on_port "$HEAD_HOST2"
    stop_pidfile "$(slurmctld_pidfile "$HEAD_HOST")"
    stop_slurmctld_on_port "$HEAD_HOST"
}

# A slurmctld its pid file does not name (another version's, one a killed run left) that holds the port.
stop_slurmctld_on_port() {  # head
    local pid
    pid="$(slurmctld_on_port "$1")"
    if [ -n "$pid" ]; then
        stop_pid "$pid"
    fi
}

# Every daemon the testbed runs, known by its pid and start from now on (pid_alive records each one it finds
# alive), so that a step of the wall clock while the testbed runs leaves them stoppable by their pid files.
remember_daemons() {
    local pidfile host
    for pidfile in /run/munge/munged.pid "$MARIADB_PIDFILE" /run/dlsub-testbed/slurmdbd.pid "$LDAP_PIDFILE" \
            /run/dlsub/agent.pid "$(slurmctld_pidfile "$HEAD_HOST")" "$(slurmctld_pidfile "$HEAD_HOST2")"; do
        pid_alive "$pidfile" || true
    done
    for host in $TESTBED_NODES; do
        pid_alive "/run/dlsub-testbed/slurmd-$host.pid" || true
    done
    for host in $TESTBED_HOSTS; do
        pid_alive "$HOSTS_DIR/$host/run-nslcd/nslcd.pid" || true
    done
}

# Wait until the primary slurmctld answers (it loads its state first).
wait_for_primary() {
    for _ in $(seq 1 100); do
        slurm_cli scontrol ping 2>/dev/null | grep -q "primary.* UP" && return 0
        sleep 0.2
    done
    die "slurmctld on $HEAD_HOST did not answer: see $HOSTS_DIR/$HEAD_HOST/log-slurm/slurmctld.log"
}

# Wait until every node has registered and none is down or invalid.
wait_for_nodes() {
    local states
    for _ in $(seq 1 60); do
        # sinfo fails while slurmctld restarts (24.11 on re-executes itself on reconfigure): try again.
        states="$(slurm_cli sinfo -h -N -o '%N %t' 2>/dev/null | sort -u)" || states=""
        if [ -n "$states" ] && ! grep -Eq ' (unk|down|inval|drain|drng|fail|no_respond)' <<<"$states" \
           && [ "$(wc -l <<<"$states")" -ge 4 ]; then
            return 0
        fi
        # A node that was down before a restart stays down until resumed.
        if grep -Eq ' (down|drain)' <<<"$states"; then
            slurm_cli scontrol update nodename="$(awk '/ (down|drain)/{print $1}' <<<"$states" | paste -sd,)" state=resume 2>/dev/null || true
        fi
        sleep 1
    done
    die "nodes did not come up: $states (see /var/log/dlsub-testbed/)"
}

# shellcheck source=testbed/hosts.sh
. "$(dirname "${BASH_SOURCE[0]}")/hosts.sh"
# shellcheck source=testbed/ldap.sh
. "$(dirname "${BASH_SOURCE[0]}")/ldap.sh"
# shellcheck source=testbed/nethome.sh
. "$(dirname "${BASH_SOURCE[0]}")/nethome.sh"
