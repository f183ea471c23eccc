#!/usr/bin/env bash
# A newer Slurm than this machine's Debian ships, from Debian's own packages,
# runnable on this host without a chroot or container:
#   slurm-tree.sh VERSION      24.11 (Debian 13, trixie) or 26.05 (Debian unstable, sid)
#
# 1. debootstrap a minimal root file system of that Debian release under
#    /var/lib/dlsub-testbed/slurm/VERSION/root and apt-get Slurm into it;
# 2. point every Slurm binary and plugin at that tree's own loader and
#    libraries (patchelf: interpreter and RPATH), so that they run here as
#    ordinary programs: the daemons fork and exec the jobs' shells, podman and
#    python from this host, exactly as the distribution's 22.05 does;
# 3. name them as Slurm expects (slurmctld, not slurmctld-wlm: Slurm decides
#    what it is by the name it runs under) in VERSION/bin.
# Idempotent: a tree that is built (VERSION/.built) is left alone.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/common.sh"

version="${1:?usage: slurm-tree.sh VERSION}"
suite="$(slurm_suite "$version")"
[ "$suite" != bookworm ] || die "Slurm $version is this machine's own: nothing to build"
tree="$SLURM_TREES/$version"
root="$tree/root"
[ -s "$tree/.built" ] && exit 0

say "building Slurm $version from Debian $suite in $tree (debootstrap, apt-get, patchelf)"
command -v patchelf >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq patchelf >/dev/null; }
rm -rf "$tree"
mkdir -p "$tree"
debootstrap --variant=minbase "$suite" "$root" >"$tree/debootstrap.log" 2>&1 \
    || die "debootstrap $suite failed: see $tree/debootstrap.log"
# Packages' maintainer scripts must not start daemons in the tree.
printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d"
chmod 755 "$root/usr/sbin/policy-rc.d"
mount -t proc proc "$root/proc"
trap 'umount "$root/proc" 2>/dev/null || true' EXIT
# The registry's copy of a rolling suite (sid) may carry a Release file past its
# Valid-Until date; its packages are still the ones wanted.
chroot "$root" /usr/bin/env DEBIAN_FRONTEND=noninteractive sh -c \
    'apt-get -o Acquire::Check-Valid-Until=false update -qq && apt-get install -y -qq --no-install-recommends slurmctld slurmd slurmdbd slurm-client slurm-wlm-basic-plugins slurm-wlm-mysql-plugin' \
    >"$tree/apt.log" 2>&1 || die "apt-get in the $suite tree failed: see $tree/apt.log"
umount "$root/proc"
trap - EXIT

libs="$root/usr/lib/x86_64-linux-gnu"
rpath="$libs/slurm-wlm:$libs"
loader="$libs/ld-linux-x86-64.so.2"
mkdir -p "$tree/bin"
# The packages' own file lists name the programs; alternatives' links are skipped.
while read -r path; do
    file="$root$path"
    if [ ! -f "$file" ] || [ -L "$file" ]; then continue; fi
    head -c 4 "$file" | grep -q ELF || continue
    patchelf --set-interpreter "$loader" --force-rpath --set-rpath "$rpath" "$file"
    name="$(basename "$path")"
    ln -sfn "$file" "$tree/bin/${name%-wlm}"
done < <(chroot "$root" dpkg -L slurm-client slurmctld slurmd slurmdbd | grep -E '^/usr/s?bin/')
for lib in "$libs"/slurm-wlm/*.so; do
    patchelf --force-rpath --set-rpath "$rpath" "$lib"
done
# A plugin from another tree (or this host's 22.05) must never be picked up.
printf '%s\n' "$libs/slurm-wlm" > "$tree/plugindir"
"$tree/bin/slurmctld" -V | awk '{print $2}' > "$tree/.built"
say "Slurm $(cat "$tree/.built") built in $tree"
