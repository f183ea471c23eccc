# shellcheck shell=bash
# The testbed's hosts (sourced by common.sh): every Slurm node, the head (slurmctld, slurmdbd) and the login
# host (users, the agent) is a host of its own on this machine, as on a cluster:
#   - a network namespace with one address on the testbed's own bridge (TESTBED_NET.0/24, which nothing else
#     on this machine uses; the bridge sits in a namespace of its own, dlsub-fabric, so the machine's own
#     interfaces and routes are untouched and no packet of the testbed can leave it);
#   - a UTS namespace: its own hostname (cpu1, gpu2, head, login1);
#   - a mount namespace for what is node-local on a real cluster: /tmp, /run/user (the login host keeps the
#     machine's: it is where developers, CI and the users' sessions work), the container graph roots
#     (/var/lib/dlsub-local), /etc/hosts (every host resolves every other, as a site's DNS would), the
#     directory's NSS settings and nslcd (testbed/ldap.sh), and on a
#     GPU node its own /dev (its GPUs as /dev/nvidia0-3, numbers of its own) and a CDI spec for them in
#     /var/run/cdi; Slurm's run and log directories (/run/slurm, /var/log/slurm: a controller's pid file and log
#     are its host's, and the two heads name the same paths). Everything else (/home, the job directories,
#     /etc/slurm, /opt/dlsub, munge's socket) is the shared filesystem.
# The namespaces are kept in files (ip netns's /run/netns/dlsub-H, and NS_DIR/H.uts, H.mnt), entered with
# nsenter (never `ip netns exec`, which remounts /sys and so hides the cgroup hierarchies Slurm needs).
# Everything runs in one pid namespace: a test can still see every process of a job from any host.

TESTBED_NET=10.213.0
# The head runs slurmctld and slurmdbd; a second head a backup slurmctld (Slurm's own failover: SlurmctldHost
# twice, one state directory both read, etc/testbed/slurm.conf), which takes over when the first stops answering.
HEAD_HOST="head"
HEAD_HOST2="head2"
# The login host the agent runs on, and a second one (sites have several: users there reach the agent over
# the network, authenticated by munge).
LOGIN_HOST=login1
LOGIN_HOST2=login2
TESTBED_HOSTS="$HEAD_HOST $HEAD_HOST2 $LOGIN_HOST $LOGIN_HOST2 $TESTBED_NODES"
HOSTS_DIR=/var/lib/dlsub-testbed/hosts
NS_DIR=/run/dlsub-testbed/ns
FABRIC_NS=dlsub-fabric
# The node-local disk of each host, bound per host (a user's container graph root lies under it).
NODE_LOCAL=/var/lib/dlsub-local
# NVIDIA's major: no driver here, so opening a fake GPU fails with ENXIO where the job's device cgroup allows
# it and EPERM where it denies it. Each GPU node's GPUs have minors of their own (gpu1 0-3, gpu2 4-7).
GPU_MAJOR=195

host_addr() {  # host
    case "$1" in
        head) echo "$TESTBED_NET.2" ;;
        head2) echo "$TESTBED_NET.3" ;;
        login1) echo "$TESTBED_NET.10" ;;
        login2) echo "$TESTBED_NET.11" ;;
        cpu1) echo "$TESTBED_NET.21" ;;
        cpu2) echo "$TESTBED_NET.22" ;;
        gpu1) echo "$TESTBED_NET.31" ;;
        gpu2) echo "$TESTBED_NET.32" ;;
        *) die "no such testbed host: $1 (one of $TESTBED_HOSTS)" ;;
    esac
}

gpu_first_minor() {  # node
    case "$1" in
        gpu1) echo 0 ;;
        gpu2) echo 4 ;;
        *) echo "" ;;
    esac
}

# Run a command on a testbed host (as root; runuser for a user), in the caller's directory where the host sees
# it (the shared filesystem), else in /. From any host: through the host's keeper process once it runs (a
# host's mount namespace does not see the namespace files of hosts made after it), else through those files.
on_host() {  # host command...
    local host="$1" keeper namespaces
    shift
    keeper="$(host_keeper_pid "$host")"
    if [ -n "$keeper" ]; then
        namespaces=(-t "$keeper" --net --uts --mount)
    else
        # Where the namespace files are not visible (in a host made before them they are the empty files under
        # the bind mounts), nsenter would say only "reassociate to namespace 'ns/uts' failed".
        [ "$(stat -f -c %T "$NS_DIR/$host.uts" 2>/dev/null)" = nsfs ] \
            || die "host $host cannot be entered from here: its keeper (/run/dlsub-testbed/host-$host.pid) is not running, and its namespace files are not visible here; make testbed starts it again"
        namespaces=(--net="/run/netns/dlsub-$host" --uts="$NS_DIR/$host.uts" --mount="$NS_DIR/$host.mnt")
    fi
    # shellcheck disable=SC2016  # expanded by that sh
    nsenter "${namespaces[@]}" -- sh -c 'cd "$0" 2>/dev/null || cd /; exec "$@"' "$PWD" "$@"
}

# The pid of a host's keeper (host_keeper below), if it runs.
host_keeper_pid() {  # host
    local pidfile="/run/dlsub-testbed/host-$1.pid" pid
    [ -s "$pidfile" ] || return 0
    pid="$(cat "$pidfile")"
    # A sleep that took a dead keeper's pid over would have this run commands on the machine (pid_alive).
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = sleep ] && pid_alive "$pidfile" && echo "$pid"
    return 0
}

host_is_up() {  # host
    [ -e "/run/netns/dlsub-$1" ] && [ "$(on_host "$1" hostname 2>/dev/null)" = "$1" ]
}

# Every host's name, for its address and for that address as IPv6 shows an IPv4 peer (::ffff:a.b.c.d: what
# c10d's TCPStore looks up for a client on a dual-stack socket). The hosts have no DNS: a name not here fails.
hosts_file() {
    local host
    printf '127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n::ffff:127.0.0.1 localhost\n'
    for host in $TESTBED_HOSTS; do
        printf '%s %s\n::ffff:%s %s\n' "$(host_addr "$host")" "$host" "$(host_addr "$host")" "$host"
    done
}

# The bridge, in a namespace of its own.
fabric_up() {
    [ -e "/run/netns/$FABRIC_NS" ] || ip netns add "$FABRIC_NS"
    ip -n "$FABRIC_NS" link show br0 >/dev/null 2>&1 || ip -n "$FABRIC_NS" link add br0 type bridge
    ip -n "$FABRIC_NS" link set lo up
    ip -n "$FABRIC_NS" link set br0 up
}

# One host: its network namespace on the bridge, then its UTS and mount namespaces, set up from inside.
host_up() {  # host
    local host="$1" dir="$HOSTS_DIR/$1"
    host_is_up "$host" && return 0
    say "making host $host ($(host_addr "$host"))"
    host_down "$host"
    ip netns add "dlsub-$host"
    ip -n "$FABRIC_NS" link add "p-$host" type veth peer name eth0 netns "dlsub-$host"
    ip -n "$FABRIC_NS" link set "p-$host" master br0 up
    ip -n "dlsub-$host" addr add "$(host_addr "$host")/24" dev eth0
    ip -n "dlsub-$host" link set eth0 up
    ip -n "dlsub-$host" link set lo up
    install -d -m 1777 "$dir/tmp"
    install -d -m 755 "$dir/run-user" "$dir/run-dlsub" "$dir/var-lib-dlsub" "$dir/local" "$dir/cdi" "$dir/dev" \
        "$dir/run-slurm"
    install -d -m 755 -o slurm -g slurm "$dir/log-slurm"
    install -d -m 755 "$dir/run-nslcd"
    getent passwd nslcd >/dev/null && chown nslcd:nslcd "$dir/run-nslcd"
    [ -d "$HOSTS_DIR/etc-containers" ] || cp -a /etc/containers "$HOSTS_DIR/etc-containers"
    touch "$NS_DIR/$host.uts" "$NS_DIR/$host.mnt"
    nsenter --net="/run/netns/dlsub-$host" -- unshare --uts="$NS_DIR/$host.uts" --mount="$NS_DIR/$host.mnt" \
        --propagation private bash "$here/hosts.sh" setup "$host" "$dir"
}

# Inside the host's new namespaces (private mounts: nothing here reaches the machine's own).
host_setup() {  # host dir
    local host="$1" dir="$2" minor i
    hostname "$host"
    mount --bind "$HOSTS_DIR/hosts" /etc/hosts
    # The login host keeps the machine's own /tmp and /run/user: it is where a developer or CI works (a
    # checkout in /tmp stays reachable there), and where the users' login sessions are.
    if [ "$host" != "$LOGIN_HOST" ]; then
        mount --bind "$dir/tmp" /tmp
        mount --bind "$dir/run-user" /run/user
    fi
    # The agent's run directory (its Unix socket, /run/dlsub) and its state (/var/lib/dlsub: its database and
    # lock, the service account's home) are the agent host's own: elsewhere they are empty.
    if [ "$host" != "$LOGIN_HOST" ]; then
        mount --bind "$dir/run-dlsub" /run/dlsub
        mount --bind "$dir/var-lib-dlsub" /var/lib/dlsub
    fi
    mount --bind "$dir/local" "$NODE_LOCAL"
    mount --bind "$dir/run-slurm" /run/slurm
    mount --bind "$dir/log-slurm" /var/log/slurm
    # The site's Podman settings (testbed/up.sh, site_containers): node-local graph roots, the site's image
    # store. Within the hosts only: the machine's own /etc/containers stays as it is.
    mount --bind "$HOSTS_DIR/etc-containers" /etc/containers
    # The site's directory (testbed/ldap.sh): users from the files, then LDAP through this host's own nslcd.
    mount --bind "$HOSTS_DIR/nsswitch.conf" /etc/nsswitch.conf
    mount --bind "$HOSTS_DIR/nslcd.conf" /etc/nslcd.conf
    mount --bind "$dir/run-nslcd" /run/nslcd
    minor="$(gpu_first_minor "$host")"
    if [ -n "$minor" ]; then
        # A /dev of its own: the machine's device nodes copied (same numbers), its pseudo-terminals, shared
        # memory and queues the machine's, and its GPUs.
        mount -t tmpfs -o mode=755,nosuid "dev-$host" "$dir/dev"
        cp -a /dev/. "$dir/dev/" 2>/dev/null || true
        for i in pts shm mqueue hugepages; do
            [ -d "/dev/$i" ] && mountpoint -q "/dev/$i" && mount --rbind "/dev/$i" "$dir/dev/$i"
        done
        for i in 0 1 2 3; do
            rm -f "$dir/dev/nvidia$i"
            mknod -m 666 "$dir/dev/nvidia$i" c "$GPU_MAJOR" "$((minor + i))"
        done
        mount --move "$dir/dev" /dev
        cdi_spec > "$dir/cdi/nvidia.yaml"
        mount --bind "$dir/cdi" /var/run/cdi
    fi
    # Shared within the host (its own peer group): what is mounted here later reaches the mount namespaces
    # rootless Podman makes below it (Podman warns when / is not shared).
    mount --make-rshared /
}

# A CDI spec for a GPU node's fake GPUs, as `nvidia-ctk cdi generate` names them by default
# (nvidia.com/gpu=<index>, and =all); their device nodes are the node's /dev/nvidiaN.
cdi_spec() {
    local i
    printf 'cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n'
    for i in 0 1 2 3; do
        printf -- '- name: "%s"\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia%s\n' "$i" "$i"
    done
    printf -- '- name: all\n  containerEdits:\n    deviceNodes:\n'
    for i in 0 1 2 3; do
        printf -- '    - path: /dev/nvidia%s\n' "$i"
    done
}

# A process that lives on each host for as long as the testbed is up, so that a process on another host can
# enter it (nsenter -t PID): the namespace files above are bound after the hosts' mount namespaces were made,
# and a mount namespace never sees a newer one's file. testbed/livebed.py's on_host uses it.
host_keeper() {  # host
    local pidfile="/run/dlsub-testbed/host-$1.pid"
    [ -n "$(host_keeper_pid "$1")" ] && return 0
    # exec all the way down, so that $! is the sleep itself, on the host.
    (exec nsenter --net="/run/netns/dlsub-$1" --uts="$NS_DIR/$1.uts" --mount="$NS_DIR/$1.mnt" -- \
        setsid sleep infinity </dev/null >/dev/null 2>&1) &
    echo "$!" > "$pidfile"
    remember_pid "$pidfile" "$!"
}

hosts_up() {
    local host
    mkdir -p "$NS_DIR" "$HOSTS_DIR" "$NODE_LOCAL" /var/run/cdi /run/dlsub /var/lib/dlsub /run/slurm /var/log/slurm \
        /run/nslcd
    touch /etc/nslcd.conf  # a mount point (Debian's nslcd ships one; a machine without it gets an empty file)
    ldap_host_files
    # Namespace files are bind mounts, which need a private mount under them (as ip netns does for /run/netns).
    if ! mountpoint -q "$NS_DIR"; then
        mount --bind "$NS_DIR" "$NS_DIR"
        mount --make-private "$NS_DIR"
    fi
    hosts_file > "$HOSTS_DIR/hosts.new"
    mv -f "$HOSTS_DIR/hosts.new" "$HOSTS_DIR/hosts"
    chmod 644 "$HOSTS_DIR/hosts"
    fabric_up
    # Hosts made by another version of this file are made again, their daemons stopped first (a host's
    # mounts are set once, when it is made).
    if ! hosts_current; then
        say "the testbed's hosts changed (testbed/hosts.sh): making them again"
        "$here/agent.sh" stop
        "$here/agent.sh" stop "$LOGIN_HOST2"
        stop_slurm
        # slurmdbd too: it runs on the head, whose network goes (MariaDB is the machine's own).
        stop_pidfile /run/dlsub-testbed/slurmdbd.pid
        ldap_down  # slapd and each host's nslcd: their hosts' networks go
        for host in $TESTBED_HOSTS; do
            stop_pidfile "/run/dlsub-testbed/host-$host.pid"
            host_down "$host"
        done
    fi
    for host in $TESTBED_HOSTS; do
        host_up "$host"
        host_keeper "$host"
        hosts_signature > "$NS_DIR/$host.made"
    done
}

# What the hosts are made by: this file.
hosts_signature() {
    sha256sum "$here/hosts.sh" | cut -d' ' -f1
}

# True when every host that exists was made by this version of this file.
hosts_current() {
    local host
    for host in $TESTBED_HOSTS; do
        if [ -e "/run/netns/dlsub-$host" ] && [ "$(cat "$NS_DIR/$host.made" 2>/dev/null)" != "$(hosts_signature)" ]; then
            return 1
        fi
    done
    return 0
}

host_down() {  # host
    local host="$1" f
    rm -f "$NS_DIR/$host.made"
    for f in "$NS_DIR/$host.uts" "$NS_DIR/$host.mnt"; do
        if [ -e "$f" ]; then
            umount "$f" 2>/dev/null || true
            rm -f "$f"
        fi
    done
    ip -n "$FABRIC_NS" link del "p-$host" 2>/dev/null || true
    [ -e "/run/netns/dlsub-$host" ] && ip netns del "dlsub-$host"
    return 0
}

hosts_down() {
    local host
    for host in $TESTBED_HOSTS; do
        stop_pidfile "/run/dlsub-testbed/host-$host.pid"
        host_down "$host"
    done
    [ -e "/run/netns/$FABRIC_NS" ] && ip netns del "$FABRIC_NS"
    if mountpoint -q "$NS_DIR"; then
        umount "$NS_DIR" 2>/dev/null || true
    fi
    return 0
}

# `bash hosts.sh setup HOST DIR`: run by host_up inside the new namespaces.
# (common.sh sources this file again: the guard keeps that from running the setup twice.)
if [ -z "${DLSUB_HOST_SETUP:-}" ] && [ "${BASH_SOURCE[0]}" = "$0" ] && [ "${1:-}" = setup ]; then
    DLSUB_HOST_SETUP=1
    set -euo pipefail
    here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
    # shellcheck source=testbed/common.sh
    . "$here/common.sh"
    host_setup "$2" "$3"
fi
