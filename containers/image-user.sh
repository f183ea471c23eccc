# Sourced by the image recipes (build-image.sh, build-horovod-image.sh): run Podman as USER, the account that
# builds (Podman storage is per user), in USER's own storage or, with DLSUB_IMAGE_STORE_CONF, in the store it
# names. Needs $user set; defines as_user and $home.
# shellcheck shell=bash
# shellcheck disable=SC2154  # $user: set by the script that sources this
: "${user:?image-user.sh needs the variable user}"
uid="$(id -u "$user")"
home="$(getent passwd "$user" | cut -d: -f6)"
# DLSUB_IMAGE_STORE_CONF: a storage.conf naming a store on the shared filesystem that every node reads as an
# additional image store (a site's way, and the testbed's: testbed/up.sh). Podman keeps that store's state
# apart from the user's own (its own runtime directory), so the two never share a lock or a database.
runtime="/run/user/$uid"
store_env=()
if [ -n "${DLSUB_IMAGE_STORE_CONF:-}" ]; then
    runtime="/run/user/$uid/dlsub-image-store"
    store_env=(CONTAINERS_STORAGE_CONF="$DLSUB_IMAGE_STORE_CONF")
fi
as_user() {
    (cd "$home" && runuser -u "$user" -- env HOME="$home" XDG_RUNTIME_DIR="$runtime" "${store_env[@]}" "$@")
}
install -d -m 700 -o "$user" -g "$user" "/run/user/$uid" "$runtime"
