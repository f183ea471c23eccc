#!/usr/bin/env bash
# The site's read-only image store: one copy of each site image per node (or one on a shared path every node
# mounts), owned by root, named in the nodes' storage.conf as an additional image store, so that every user's
# rootless Podman runs the site's images with nothing in their own storage (containers-storage.conf(5),
# additionalimagestores; NERSC's podman-hpc shares images the same way).
#
#   site-image-store.sh [--store DIR] add ARCHIVE      load an image archive (podman save) into the store
#   site-image-store.sh [--store DIR] list             the store's images: ID, names, created
#   site-image-store.sh [--store DIR] save IMAGE ARCHIVE  write one of them to an archive (for another node's store)
#   site-image-store.sh [--store DIR] tag IMAGE_ID NAME  give NAME to that version (a rollback: new jobs get it)
#   site-image-store.sh [--store DIR] remove IMAGE_ID  remove one version (first check `dlsub doctor --user U`'s
#                                                      "site images": a queued or running job may still run it)
#
# Run as root. Root only stores and reads images here (`podman load`, `images`, `rmi`), it never starts a
# container; images are built elsewhere, by an unprivileged account (containers/build-image.sh) or pulled,
# and brought here as an archive. A new version of a tag is added beside the old one: the tag moves to it,
# the old one stays, by ID, for the jobs that were submitted with it (dlsub records the image's ID at submit,
# so a requeue or a move runs the same image), until removed.
#
# Users' Podman reads the store through fuse-overlayfs (mount_program in storage.conf): its lower layers
# belong to root, which a rootless user cannot map, and Podman's native rootless overlay would copy and chown
# the whole image into every user's own storage first; fuse-overlayfs shows them as they are, no copy.
set -euo pipefail
store="${DLSUB_SITE_IMAGE_STORE:-/var/lib/dlsub-images}"
if [ "${1:-}" = "--store" ]; then
    store="${2:?--store needs a directory}"
    shift 2
fi
action="${1:-}"
say() { printf 'site-image-store: %s %s\n' "$(date +%T)" "$*" >&2; }
die() { say "error: $*"; exit 2; }
[ "$(id -u)" -eq 0 ] || die "run as root (the store is root's, read-only to everyone else)"
case "$store" in /*) ;; *) die "the store must be an absolute path, not $store" ;; esac
# Its own run root and storage.conf: nothing shared with root's default storage, whatever the host's
# /etc/containers/storage.conf says (a site's names the users' settings: mount_program, rootless paths).
runroot="/run/dlsub-site-images/$(printf '%s' "$store" | sha256sum | cut -c1-12)"
install -d -m 700 "$runroot"
printf '[storage]\ndriver = "overlay"\ngraphroot = "%s"\nrunroot = "%s"\n' "$store" "$runroot" >"$runroot/storage.conf"
store_podman() {
    CONTAINERS_STORAGE_CONF="$runroot/storage.conf" podman --root "$store" --runroot "$runroot" \
        --storage-driver overlay "$@"
}

# What every user must be able to read for Podman to use the store (read-only: directories 755, the
# store's records 644), and no more: the layers' own files keep the modes the image gave them.
publish() {
    local d
    chmod 755 "$store"
    for d in overlay overlay-images overlay-layers; do
        [ -d "$store/$d" ] && chmod 755 "$store/$d"
    done
    [ -d "$store/overlay/l" ] && chmod 755 "$store/overlay/l"
    find "$store/overlay" -mindepth 1 -maxdepth 1 -type d -exec chmod 755 {} +
    find "$store/overlay" -mindepth 2 -maxdepth 2 -type f \( -name link -o -name lower \) -exec chmod 644 {} +
    find "$store/overlay-images" "$store/overlay-layers" -exec chmod a+rX {} +
}

case "$action" in
    add)
        archive="${2:?usage: site-image-store.sh add ARCHIVE}"
        [ -r "$archive" ] || die "no image archive at $archive (make one with: podman save -o FILE IMAGE)"
        install -d -m 755 "$store"
        say "loading $archive into $store"
        store_podman load -q -i "$archive" >&2
        publish
        store_podman images --format '{{.ID}} {{.Repository}}:{{.Tag}}' >&2
        ;;
    list)
        store_podman images --format '{{.ID}}  {{.Repository}}:{{.Tag}}  {{.CreatedSince}}'
        ;;
    save)
        store_podman save -q -o "${3:?usage: site-image-store.sh save IMAGE ARCHIVE}" "${2:?usage: site-image-store.sh save IMAGE ARCHIVE}"
        ;;
    tag)
        id="${2:?usage: site-image-store.sh tag IMAGE_ID NAME}" name="${3:?usage: site-image-store.sh tag IMAGE_ID NAME}"
        [[ "$id" =~ ^[0-9a-f]{12,64}$ ]] || die "$id is not an image ID (12 to 64 hex digits; see: list)"
        store_podman tag "$id" "$name"
        publish
        ;;
    remove)
        id="${2:?usage: site-image-store.sh remove IMAGE_ID}"
        [[ "$id" =~ ^[0-9a-f]{12,64}$ ]] || die "$id is not an image ID (12 to 64 hex digits; see: list)"
        store_podman rmi "$id"
        publish
        ;;
    *)
        die "usage: site-image-store.sh [--store DIR] add ARCHIVE | list | tag IMAGE_ID NAME | remove IMAGE_ID"
        ;;
esac
