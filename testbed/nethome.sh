# shellcheck shell=bash
# The directory user's home on a network file system with root squashed (sourced by common.sh; issue 50).
# This kernel has no NFS (no client, no server, no modules), so the home is served the way it allows, over the
# testbed's network through FUSE:
#   - the head is the file server: its sshd (on its testbed address only; keys of the testbed's own, root's
#     sftp only, chrooted to /home) serves the home from its disk (the machine's /home/<user>);
#   - every other host mounts it where the user's home is, as a site's automounter does a home (auto.home):
#     sshfs as root (idmap=none: the head's owners kept; default_permissions: the kernel checks mode bits), and
#     over it testbed/rootsquash.py, which makes each request as its caller and root's as nobody, as an NFS
#     server's root_squash does. The user's home is 0700: no other user, and not root, reads in it.
#   - A cut link hangs it, and byte-range locks are each host's own (sftp has none), as over sshfs at a site;
#     dlsub's job store there uses SQLite's dot-file locking and a rollback journal (job/user_store.py).
# The machine itself (up.sh, CI's root) sees the head's disk: it is the file server's admin.
NETHOME_USERS="${DLSUB_TESTBED_NETHOME_USERS:-$TESTBED_LDAP_USER}"
SSHD_DIR=/var/lib/dlsub-testbed/sshd
NETHOME_RAW=/run/dlsub-testbed/nethome-raw  # where each host's sshfs mounts, root's alone (per host)
NETHOME_LOG=/var/log/dlsub-testbed/nethome.log
# The layer, copied where every host sees it (a checkout under /tmp is the login host's alone).
NETHOME_SOURCE="$(dirname "${BASH_SOURCE[0]}")/rootsquash.py"
NETHOME_LAYER="$SSHD_DIR/rootsquash.py"

nethome_hosts() {
    echo "$HEAD_HOST2 $LOGIN_HOST $LOGIN_HOST2 $TESTBED_NODES"
}

sshd_conf() {
    cat <<EOF
ListenAddress $(host_addr "$HEAD_HOST"):22
HostKey $SSHD_DIR/host_ed25519_key
PidFile $SSHD_DIR/sshd.pid
AuthorizedKeysFile $SSHD_DIR/authorized_keys
AllowUsers root
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
AllowTcpForwarding no
AllowAgentForwarding no
X11Forwarding no
PermitTTY no
Subsystem sftp internal-sftp
ForceCommand internal-sftp
ChrootDirectory /home
EOF
}

# The head's sshd, and the keys of the testbed's own that the other hosts' root logs in with.
nethome_server() {
    install -d -m 700 "$SSHD_DIR"
    [ -f "$SSHD_DIR/host_ed25519_key" ] || ssh-keygen -q -t ed25519 -N "" -C "dlsub testbed head" -f "$SSHD_DIR/host_ed25519_key"
    [ -f "$SSHD_DIR/client_ed25519_key" ] || ssh-keygen -q -t ed25519 -N "" -C "dlsub testbed hosts' root" -f "$SSHD_DIR/client_ed25519_key"
    install -m 600 "$SSHD_DIR/client_ed25519_key.pub" "$SSHD_DIR/authorized_keys"
    install -m 755 "$NETHOME_SOURCE" "$NETHOME_LAYER"
    printf '%s,%s %s\n' "$HEAD_HOST" "$(host_addr "$HEAD_HOST")" "$(cut -d' ' -f1-2 "$SSHD_DIR/host_ed25519_key.pub")" \
        | install -m 644 /dev/stdin "$SSHD_DIR/known_hosts"
    sshd_conf | install -m 600 /dev/stdin "$SSHD_DIR/sshd_config"
    install -d -m 755 /run/sshd  # sshd's privilege separation directory
    if ! pid_alive "$SSHD_DIR/sshd.pid"; then
        say "starting the file server's sshd on $HEAD_HOST"
        on_host "$HEAD_HOST" /usr/sbin/sshd -f "$SSHD_DIR/sshd_config" -E "$NETHOME_LOG"
        for _ in $(seq 1 50); do
            pid_alive "$SSHD_DIR/sshd.pid" && break
            sleep 0.1
        done
        pid_alive "$SSHD_DIR/sshd.pid" || die "the head's sshd did not start: see $NETHOME_LOG"
    fi
}

# Until a command succeeds, for 20 s at most.
wait_until() {  # what command...
    local what="$1"
    shift
    for _ in $(seq 1 100); do
        "$@" && return 0
        sleep 0.2
    done
    die "$what: not there after 20 s; see $NETHOME_LOG"
}

raw_mounted() {  # host path
    [ "$(on_host "$1" findmnt -n -o FSTYPE --mountpoint "$2" 2>/dev/null)" = fuse.sshfs ]
}

nethome_mounted() {  # host user
    raw_mounted "$1" "$NETHOME_RAW/$2" && raw_mounted "$1" "/home/$2"
}

# One host's mount of one user's home: sshfs below, the root-squashing layer on the home's path.
nethome_mount() {  # host user
    local host="$1" name="$2" state="$HOSTS_DIR/$1" raw="$NETHOME_RAW/$2"
    nethome_mounted "$host" "$name" && pid_alive "$state/nethome-$name-sshfs.pid" \
        && pid_alive "$state/nethome-$name-squash.pid" && return 0
    nethome_unmount "$host" "$name"
    say "mounting $name's home on $host from $HEAD_HOST (sshfs, root squashed)"
    install -d -m 755 "$NETHOME_RAW"
    on_host "$host" install -d -m 700 "$raw"
    # shellcheck disable=SC2016  # expanded by that sh
    on_host "$host" sh -c 'echo $$ > "$0"; exec "$@"' "$state/nethome-$name-sshfs.pid" \
        sshfs -f -o "ssh_command=ssh -F /dev/null" \
        -o "IdentityFile=$SSHD_DIR/client_ed25519_key,UserKnownHostsFile=$SSHD_DIR/known_hosts" \
        -o StrictHostKeyChecking=yes,BatchMode=yes,ServerAliveInterval=15,ServerAliveCountMax=4 \
        -o idmap=none,default_permissions,direct_io,dir_cache=no,attr_timeout=0,entry_timeout=0,negative_timeout=0 \
        "root@$HEAD_HOST:/$name" "$raw" </dev/null >>"$NETHOME_LOG" 2>&1 &
    wait_until "sshfs of $name's home on $host" raw_mounted "$host" "$raw"
    on_host "$host" setsid /usr/bin/python3 "$NETHOME_LAYER" "$raw" "/home/$name" "$state/nethome-$name-squash.pid" \
        </dev/null >>"$NETHOME_LOG" 2>&1 &
    wait_until "the root-squashed home of $name on $host" nethome_mounted "$host" "$name"
    if ! pid_alive "$state/nethome-$name-sshfs.pid" || ! pid_alive "$state/nethome-$name-squash.pid"; then
        die "$name's home on $host: a daemon of its mount is gone; see $NETHOME_LOG"
    fi
}

# Stop one host's daemons of one user's home (by pid file: nothing entered on the host, which may be gone).
nethome_stop() {  # host user
    stop_pidfile "$HOSTS_DIR/$1/nethome-$2-squash.pid"
    stop_pidfile "$HOSTS_DIR/$1/nethome-$2-sshfs.pid"
}

nethome_unmount() {  # host user
    nethome_stop "$1" "$2"
    # What a daemon killed without unmounting left ("Transport endpoint is not connected").
    on_host "$1" umount -l "/home/$2" 2>/dev/null || true
    on_host "$1" umount -l "$NETHOME_RAW/$2" 2>/dev/null || true
}

nethome_up() {
    local host name
    nethome_server
    for name in $NETHOME_USERS; do
        for host in $(nethome_hosts); do
            nethome_mount "$host" "$name"
        done
    done
}

nethome_down() {
    local host name
    for name in $NETHOME_USERS; do
        for host in $(nethome_hosts); do
            nethome_stop "$host" "$name"
        done
    done
    stop_pidfile "$SSHD_DIR/sshd.pid"
}
