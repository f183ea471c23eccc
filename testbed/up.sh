#!/usr/bin/env bash
# Bring up the dlsub local testbed on this machine, as root, idempotently:
# munge, slurmctld and its backup, and four slurmd (cpu1-2, gpu1-2 with 4 fake GPUs each),
# the unprivileged job user, its rootless Podman, the default training image,
# and dlsub installed system-wide. A second run only restarts what is down
# and rebuilds only what changed. What each step stands for on a site: docs/admin-guide.md.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
# shellcheck source=testbed/common.sh
. "$here/common.sh"

[ "$(id -u)" -eq 0 ] || die "run as root (it installs packages and starts Slurm daemons): sudo make testbed"

# ---------------------------------------------------------------- packages
# acl: job directories grant the agent's account read access (setfacl); iproute2's ss finds the slurmctld on
# its port; npm fetches htmx from the npm registry when dlsub is installed (nodejs may ship npm itself).
packages=(slurm-wlm slurm-client slurmdbd mariadb-server munge podman runc uidmap slirp4netns fuse-overlayfs
          debootstrap python3 python3-venv ca-certificates procps iproute2 acl)
command -v npm >/dev/null || packages+=(npm)
# For the tests only: `make lint` runs shellcheck, the unit tests run job_submit.lua under lua5.1 as slurmctld
# would, and the dashboard's browser tests drive Debian's Chromium (Playwright downloads no browser here).
[ "$TESTBED_FOR" = demo ] || packages+=(shellcheck lua5.1 chromium)
# The site's directory (testbed/ldap.sh): slapd, its clients, and NSS through nslcd. Not for the demo, whose
# user is a local one.
[ "$TESTBED_FOR" = demo ] || packages+=(slapd ldap-utils nslcd libnss-ldapd)
# Its home on a network file system with root squashed (testbed/nethome.sh): the head's sshd, each host's sshfs
# and the root-squashing layer over it (Debian's fusepy, on libfuse 2).
[ "$TESTBED_FOR" = demo ] || packages+=(openssh-server sshfs python3-fusepy)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    # slapd without Debian's own database (testbed/ldap.sh runs one of its own), and libnss-ldapd without
    # touching the machine's /etc/nsswitch.conf (only the hosts' asks LDAP).
    printf '%s\n' "slapd slapd/no_configuration boolean true" "libnss-ldapd libnss-ldapd/nsswitch multiselect" \
        | debconf-set-selections
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# ---------------------------------------------------------------- the Slurm version
# A newer Slurm comes from a newer Debian release's packages (slurm-tree.sh, built below beside dlsub's install);
# its clients go on every user's PATH. 22.05's are this machine's own.
for c in $SLURM_CLIENTS; do
    link="$SLURM_CLIENT_LINKS/$c"
    if [ "$SLURM_VERSION" = 22.05 ]; then
        # Only links of ours go (a site's own /usr/local/bin/squeue stays).
        [ -L "$link" ] && [[ "$(readlink "$link")" == "$SLURM_TREES"/* ]] && rm -f "$link"
    else
        ln -sfn "$SLURM_SBIN/$c" "$link"
    fi
done
hash -r
# Switching versions: the one that is up stops first (each keeps its own state).
if [ -s "$SLURM_UP_FILE" ] && [ "$(cat "$SLURM_UP_FILE")" != "$SLURM_VERSION" ]; then
    say "switching from Slurm $(cat "$SLURM_UP_FILE") to $SLURM_VERSION"
    "$here/agent.sh" stop
    stop_slurm
    stop_pidfile /run/dlsub-testbed/slurmdbd.pid
    rm -f "$SLURM_UP_FILE"
fi

# ---------------------------------------------------------------- munge
if [ ! -s /etc/munge/munge.key ]; then
    say "creating munge key"
    mungekey -c
    chown munge:munge /etc/munge/munge.key
    chmod 400 /etc/munge/munge.key
fi
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge
if ! pid_alive /run/munge/munged.pid; then
    say "starting munged"
    runuser -u munge -- /usr/sbin/munged --force  # --force: a stale socket from a killed munged must not block it
fi
munge -n | unmunge >/dev/null || die "munge does not work: see /var/log/munge/munged.log"

# ---------------------------------------------------------------- the hosts
# Every node, the head and the login host a host of its own (testbed/hosts.sh).
hosts_up

# ---------------------------------------------------------------- /dev/fuse
# Rootless Podman mounts each container's overlay with fuse-overlayfs (this kernel has no rootless overlay), which
# opens /dev/fuse as the user. Debian gives it mode 0666 (udev's 50-udev-default.rules: KERNEL=="fuse",
# MODE="0666"); a machine without udev can leave the kernel's 0600, and then no user's container starts
# ("fuse: failed to open /dev/fuse: Permission denied"). Set as a Debian host has it, on the machine and in each
# GPU node's /dev of its own (copied from the machine's when the host was made; doctor: "FUSE device").
for host in "" $TESTBED_HOSTS; do
    run=(); [ -z "$host" ] || run=(on_host "$host")
    if "${run[@]}" test -c /dev/fuse && [ "$("${run[@]}" stat -c %a /dev/fuse)" != 666 ]; then
        say "/dev/fuse${host:+ on $host} is mode $("${run[@]}" stat -c %a /dev/fuse): making it 0666, as Debian's udev rule does"
        "${run[@]}" chmod 0666 /dev/fuse
    fi
done

# ---------------------------------------------------------------- the job users
# Three unprivileged users, set up alike: the second plays "another user" in the privacy and trust tests, the
# third one who has never used Podman. Each gets its own subordinate id range, a runtime directory on the
# login hosts, a directory on each host's node-local disk and the site's storage.conf (what a site's account
# provisioning, or a Slurm Prolog, makes): nothing else. Their Podman is the site's (site_containers below):
# its graph root on that node-local directory (never the shared home, where rootless storage does not work
# on NFS), and every image from the site's read-only store; no user has an image or storage of their own.
# A user of the directory (first-subid "directory") is made there, with a home as the site's provisioning (or
# pam_mkhomedir) would make it, and its ranges from the admin guide's script; its name resolves on the hosts
# only, so every lookup below asks the login host.
job_user() {  # name first-subid|directory
    local name="$1" first="$2" uid gid home host
    if [ "$first" = directory ]; then
        ldap_user "$name" "$TESTBED_LDAP_UID"
        install -d -m 700 -o "$TESTBED_LDAP_UID" -g "$TESTBED_LDAP_UID" "/home/$name"
        on_host "$LOGIN_HOST" bash "$repo/etc/subid-ranges.sh" "$name"
    elif ! id "$name" >/dev/null 2>&1; then
        say "creating user $name"
        useradd -m -s /bin/bash "$name"
    fi
    uid="$(on_host "$LOGIN_HOST" id -u "$name")"
    gid="$(on_host "$LOGIN_HOST" id -g "$name")"
    if [ "$first" != directory ]; then
        grep -q "^$name:" /etc/subuid || usermod --add-subuids "$first-$((first + 65535))" "$name"
        grep -q "^$name:" /etc/subgid || usermod --add-subgids "$first-$((first + 65535))" "$name"
    fi
    home="$(on_host "$LOGIN_HOST" getent passwd "$name" | cut -d: -f6)"
    # What an earlier testbed gave each user (its own image store in the home, Podman files of their own):
    # gone. What the site's provisioning gives: its storage.conf, as the user's (Podman 4.3, Debian 12's,
    # reads only the graph root and driver from /etc/containers/storage.conf for a rootless user, not the
    # image stores or the mount program: docs/admin-guide.md, "The training image on every node").
    rm -f "$home/.config/containers/image-store.conf" "$home/.config/containers/containers.conf"
    rm -rf "$home/.local/share/dlsub-images"
    install -d -m 755 -o "$uid" -g "$gid" "$home/.config" "$home/.config/containers"
    install -m 644 -o "$uid" -g "$gid" "$HOSTS_DIR/etc-containers/storage.conf" \
        "$home/.config/containers/storage.conf"
    for host in $TESTBED_HOSTS; do
        install -d -m 700 -o "$uid" -g "$gid" "$HOSTS_DIR/$host/local/$name"
    done
    # Its folder on the shared scratch file system, as a site makes /scratch/$USER (policy.toml's [site]
    # job_directories puts job directories there for a home without POSIX ACLs: testbed/nethome.sh).
    install -d -m 755 /scratch
    install -d -m 700 -o "$uid" -g "$gid" "/scratch/$name"
    # What logind would make on a login node: the user's runtime directory. A compute node has none for a
    # Slurm job: the batch script falls back to a private directory in the node's /tmp.
    for host in "$LOGIN_HOST" "$LOGIN_HOST2"; do
        on_host "$host" install -d -m 700 -o "$uid" -g "$gid" "/run/user/$uid"
    done
    reset_stale_podman "$name" "$LOGIN_HOST" "/run/user/$uid"
    # On the nodes, where its jobs' runtime directory is the batch script's fallback in the node's /tmp.
    for host in $TESTBED_NODES; do
        [ -d "$HOSTS_DIR/$host/tmp/dlsub-xdg-$uid" ] && reset_stale_podman "$name" "$host" "/tmp/dlsub-xdg-$uid"
    done
    return 0
}
# A pause process killed with the run that made it (a session's end, without make testbed-down) leaves its pid
# file in a runtime directory that, on a real host, the reboot or logind would have emptied; Podman 4.3 then fails
# every command ("cannot re-exec process to join the existing user namespace", where its "alive" file is gone
# too). What the reboot would do: the runtime directory's Podman files go. Only a process of that user's is its
# pause process: the pid may be another's by now.
clear_dead_pause() {  # name host runtime-dir
    local name="$1" host="$2" runtime="$3" pause
    pause="$(on_host "$host" cat "$runtime/libpod/tmp/pause.pid" 2>/dev/null || true)"
    [[ "$pause" =~ ^[0-9]+$ ]] && [ "$(stat -c %U "/proc/$pause" 2>/dev/null)" != "$name" ] || return 0
    say "$name's Podman pause process on $host ($runtime) is gone: clearing its runtime files, as a reboot would"
    on_host "$host" rm -rf "$runtime/libpod" "$runtime/containers"
}
# A pause process that died with the machine (or was ended with the processes of a finished run) leaves its
# pid file in the runtime directory (no logind here clears it), and Podman then refuses every command until
# the user resets it.
reset_stale_podman() {  # name host runtime-dir
    local name="$1" host="$2" runtime="$3" home podman_says pause
    home="$(on_host "$host" getent passwd "$name" | cut -d: -f6)"
    # Rootless Podman joins the user's pause process, wherever it was made: one made on another host (or on
    # this machine before its hosts existed) would show this host that one's mounts (its graph root).
    # One made before this host's site settings were mounted (an earlier testbed's host of the same name)
    # would not see them: Podman joins it and finds no /etc/containers/storage.conf. One made before this host
    # was (its keeper is younger: the host was made again) keeps the old host's mounts, where NSS no longer
    # reaches the host's nslcd: a directory user's Podman then fails ("lookup userid ...: no such file").
    clear_dead_pause "$name" "$host" "$runtime"
    pause="$(on_host "$host" cat "$runtime/libpod/tmp/pause.pid" 2>/dev/null || true)"
    if [[ "$pause" =~ ^[0-9]+$ ]] \
            && { [ "$(nsenter -t "$pause" --uts hostname 2>/dev/null)" != "$host" ] \
                 || ! nsenter -t "$pause" --mount cmp -s /etc/containers/storage.conf \
                      "$HOSTS_DIR/etc-containers/storage.conf" \
                 || [ "$(started "$pause")" -lt "$(started "$(host_keeper_pid "$host")")" ]; }; then
        say "ending $name's Podman pause process $pause, made outside $host, before it or before its site settings"
        kill "$pause"
        on_host "$host" rm -f "$runtime/libpod/tmp/pause.pid"
    fi
    if ! podman_says="$(on_host "$host" runuser -u "$name" -- env -C "$home" HOME="$home" XDG_RUNTIME_DIR="$runtime" \
            podman info 2>&1 >/dev/null)" && [[ "$podman_says" == *"podman system migrate"* ]]; then
        say "resetting $name's stale Podman pause process on $host (podman system migrate)"
        on_host "$host" runuser -u "$name" -- env -C "$home" HOME="$home" XDG_RUNTIME_DIR="$runtime" \
            podman system migrate
    fi
}
# The site's Podman settings, the same on every host (testbed/hosts.sh mounts them on /etc/containers):
# docs/admin-guide.md, "The training image on every node".
site_containers() {
    local dir="$HOSTS_DIR/etc-containers"
    install -d -m 755 "$dir"
    install -m 644 "$repo/etc/testbed/containers.conf" "$dir/containers.conf"
    sed "s|@NODE_LOCAL@|$NODE_LOCAL|; s|@SITE_IMAGE_STORE@|$SITE_IMAGE_STORE|" "$repo/etc/testbed/storage.conf" \
        | install -m 644 /dev/stdin "$dir/storage.conf"
}
site_containers
job_user "$TESTBED_USER" 200000
job_user "$TESTBED_USER2" 300000
job_user "$TESTBED_USER3" 400000
if [ "$TESTBED_FOR" != demo ]; then
    ldap_up
    job_user "$TESTBED_LDAP_USER" directory
    nethome_up
fi

# The agent's service account: unprivileged, made a Slurm Operator below.
if ! id "$AGENT_USER" >/dev/null 2>&1; then
    say "creating service account $AGENT_USER"
    useradd -r -m -d /var/lib/dlsub -s /usr/sbin/nologin "$AGENT_USER"
fi
# Its home and state on the other hosts: their own (testbed/hosts.sh), as on a site.
for host in $TESTBED_HOSTS; do
    [ "$host" = "$LOGIN_HOST" ] || install -d -m 700 -o "$AGENT_USER" -g "$AGENT_USER" "$HOSTS_DIR/$host/var-lib-dlsub"
done

# ---------------------------------------------------------------- the image
# The site's image, as an admin brings it: built by an unprivileged account (the testbed user) on the login
# host, in a build store on that host's local disk, saved as an archive, and loaded by root into the site's
# read-only store that every host reads (containers/site-image-store.sh). The login host has no route out
# (its namespace reaches only the testbed's hosts): its wheels and base system are downloaded on the machine
# first.
site_image() {
    local build_conf="$HOSTS_DIR/build-storage.conf"
    "$repo/containers/build-image.sh" --wheels-only "$TESTBED_USER"
    # The build store's own runtime directory (containers/image-user.sh), after a killed run as the users' own.
    clear_dead_pause "$TESTBED_USER" "$LOGIN_HOST" "/run/user/$(id -u "$TESTBED_USER")/dlsub-image-store"
    printf '[storage]\ndriver = "overlay"\nrootless_storage_path = "%s/%s/image-build"\n' "$NODE_LOCAL" \
        "$TESTBED_USER" | install -m 644 /dev/stdin "$build_conf"
    on_host "$LOGIN_HOST" env DLSUB_IMAGE_STORE_CONF="$build_conf" "$repo/containers/build-image.sh" "$TESTBED_USER"
    on_host "$LOGIN_HOST" env DLSUB_IMAGE_STORE_CONF="$build_conf" DLSUB_SITE_IMAGE_STORE="$SITE_IMAGE_STORE" \
        "$repo/containers/build-image.sh" --publish "$TESTBED_USER"
}

# ---------------------------------------------------------------- dlsub, system-wide
# Installed under /opt (readable by every user) because CI's clone may sit
# where the job user cannot enter. Beside it, the two other downloads of a fresh machine: this Slurm's tree
# and the image's wheels and base system (below: the login host that builds it has no route out). All three
# start once the hosts are made: the hosts' mount namespaces are private, and a debootstrap's /proc mounted
# while one is made would stay in it.
# The image is the longest of them (its wheels and base system, then its build and its publication in the site
# store): it goes on while Slurm and the agent start, and is awaited only before the checks that need it.
[ "$SLURM_VERSION" = 22.05 ] || side_by_side "$here/slurm-tree.sh" "$SLURM_VERSION"
ensure_venv
side_by_side "$here/install-dlsub.sh"
site_image &
image_pid=$!
await_side_by_side

# ---------------------------------------------------------------- Slurm
mkdir -p /etc/slurm /etc/dlsub /run/dlsub-testbed /var/log/dlsub-testbed "$SLURM_SPOOL/slurmctld"
chown slurm:slurm "$SLURM_SPOOL/slurmctld" /var/log/dlsub-testbed
# Fake GPUs: each GPU node's own /dev/nvidia0-3 (testbed/hosts.sh), named in gres.conf as a site names them.
install -m 755 "$repo/etc/slurm/taskepilog.sh" /etc/dlsub/taskepilog
install -m 644 "$repo/etc/testbed/policy.toml" /etc/dlsub/policy.toml
# The submit record (AdminComment) the agent trusts; slurmctld reloads the
# script when it changes, and must find it before it starts with JobSubmitPlugins=lua.
cmp -s "$repo/slurm_plugins/job_submit.lua" /etc/slurm/job_submit.lua \
    || install -m 644 "$repo/slurm_plugins/job_submit.lua" /etc/slurm/job_submit.lua
changed=0
for f in slurm.conf gres.conf cgroup.conf; do
    if ! render_slurm_conf "$repo/etc/testbed/$f" | cmp -s - "/etc/slurm/$f"; then
        render_slurm_conf "$repo/etc/testbed/$f" | install -m 644 /dev/stdin "/etc/slurm/$f"
        changed=1
    fi
done
if [ "$changed" -eq 1 ]; then
    say "Slurm configuration changed: restarting the daemons"
    stop_slurm
fi
# A slurmctld of another version still on the port (a switch cut short): stop it and its nodes.
for head in "$HEAD_HOST" "$HEAD_HOST2"; do
    ctld="$(slurmctld_on_port "$head")"
    if [ -n "$ctld" ] && ! runs_this_slurm "$ctld"; then
        say "a slurmctld of another Slurm holds the port on $head: stopping it"
        stop_slurm
    fi
done
# Accounting: MariaDB, then slurmdbd, before slurmctld (which registers with it).
"$here/accounting.sh"
# The primary, then the backup once the primary answers: a backup that finds no primary takes control.
for head in "$HEAD_HOST" "$HEAD_HOST2"; do
    if ! pid_alive "$(slurmctld_pidfile "$head")" && [ -z "$(slurmctld_on_port "$head")" ]; then
        say "starting slurmctld $SLURM_VERSION on $head"
        start_slurmctld "$head"
    fi
    [ "$head" = "$HEAD_HOST2" ] || wait_for_primary
done
for node in $TESTBED_NODES; do
    if ! pid_alive "/run/dlsub-testbed/slurmd-$node.pid"; then
        say "starting slurmd $node"
        start_slurmd "$node"
    fi
done
echo "$SLURM_VERSION" > "$SLURM_UP_FILE"
wait_for_nodes
"$here/accounting.sh" associations
# slurmctld from 23.11 on re-executes itself on `scontrol reconfigure`: its nodes register again.
wait_for_nodes

# ---------------------------------------------------------------- the agent
# Restarted every time: dlsub was just reinstalled and its policy may have changed.
"$here/agent.sh" restart

# ---------------------------------------------------------------- the image, awaited
wait "$image_pid" || die "building or publishing the training image failed (its message is above)"

# The site check an admin would run, on the login host and on every compute node (there: the node's CDI
# spec, its Podman, storage and image): nothing may block dlsub here. All hosts at once (one after another
# took 8 s of each of CI's three testbed starts); a host's report is shown only where it found a problem.
doctor_on() {  # host
    local report
    if ! report="$(on_host "$1" "$DLSUB_PREFIX/venv/bin/dlsub" doctor --user "$TESTBED_USER" 2>&1)"; then
        printf '%s\ndlsub doctor found a problem on %s (above)\n' "$report" "$1" >&2
        return 1
    fi
}
for node in "$LOGIN_HOST" $TESTBED_NODES; do
    side_by_side doctor_on "$node"
done
await_side_by_side

remember_daemons
say "testbed is up on Slurm $(slurm_cli scontrol --version | awk '{print $2}'): $(slurm_cli sinfo -h -o '%P %a %D %t' | tr '\n' ';')"
say "log in to its login host with: sudo bash testbed/on.sh (or: bash testbed/on.sh NODE)"
