#!/usr/bin/env bash
# Subordinate id ranges for directory users (LDAP, SSSD, AD), for rootless Podman: run as root on every host
# where users run jobs or Podman (login and compute nodes), e.g. from the host's provisioning and a daily
# timer, or a Slurm Prolog. `usermod --add-subuids` works only for users in the local /etc/passwd; a user who
# exists only in the directory gets no range, and rootless Podman then maps one id only (an image whose
# files belong to several uids fails to pull or to run).
#
# The scheme needs no shared state, so every host writes the same ranges: a user of uid U (FIRST_UID <= U <=
# LAST_UID) gets the 65,536 ids from BASE + (U - FIRST_UID) * 65536, in /etc/subuid and /etc/subgid, by name.
# The defaults give uids 10000..60000 ranges from 10^9 up (the last ends below 2^32), which no range from
# useradd's defaults (100000 up, one per local user) reaches; set them to your directory's uid range. A user who already has a line keeps it
# (Podman's storage records the ids it mapped); nothing else in the files is changed.
#
#   subid-ranges.sh [--dry-run] [USER ...]     (no USER: every user `getent passwd` lists in the range)
set -euo pipefail
FIRST_UID="${SUBID_FIRST_UID:-10000}"
LAST_UID="${SUBID_LAST_UID:-60000}"
BASE="${SUBID_BASE:-1000000000}"
COUNT=65536
# The files (other paths only for the script's own tests).
SUBUID_FILE="${SUBUID_FILE:-/etc/subuid}"
SUBGID_FILE="${SUBGID_FILE:-/etc/subgid}"
LOCK_FILE="${SUBID_LOCK_FILE:-/run/lock/dlsub-subid-ranges.lock}"
dry_run=0
if [ "${1:-}" = --dry-run ]; then
    dry_run=1
    shift
fi
if [ $((BASE + (LAST_UID - FIRST_UID + 1) * COUNT)) -gt 4294967295 ]; then
    echo "subid-ranges: uids $FIRST_UID..$LAST_UID from $BASE pass 2^32 - 1: narrow the uid range or lower" \
         "SUBID_BASE" >&2
    exit 2
fi
entries() {  # the passwd lines of the users asked for, or of every user (enumeration must be on in the directory)
    if [ $# -gt 0 ]; then
        local name
        for name in "$@"; do
            getent passwd "$name" || { echo "subid-ranges: no such user: $name" >&2; return 1; }
        done
    else
        getent passwd
    fi
}
passwd="$(entries "$@")" || exit 1
added=0
while IFS=: read -r name _ uid _; do
    if ! [[ "$uid" =~ ^[0-9]+$ ]] || [ "$uid" -lt "$FIRST_UID" ] || [ "$uid" -gt "$LAST_UID" ]; then
        continue
    fi
    first=$((BASE + (uid - FIRST_UID) * COUNT))
    for file in "$SUBUID_FILE" "$SUBGID_FILE"; do
        # By name or by uid: a line either way is the user's.
        if [ -e "$file" ] && awk -F: -v n="$name" -v u="$uid" '$1 == n || $1 == u { found = 1 } END { exit !found }' "$file"; then
            continue
        fi
        if [ "$dry_run" -eq 1 ]; then
            echo "$file: $name:$first:$COUNT"
        else
            # One line appended at once; the lock keeps two runs on one host from interleaving (not shadow's own
            # FILE.lock, which usermod takes by link(2)).
            (flock 9; printf '%s:%s:%s\n' "$name" "$first" "$COUNT" >> "$file") 9>>"$LOCK_FILE"
        fi
        added=$((added + 1))
    done
done <<< "$passwd"
echo "subid-ranges: $added line(s) $([ "$dry_run" -eq 1 ] && echo "to add" || echo added)" >&2
