#!/bin/sh
# dlsub TaskEpilog: Slurm runs it as the job's owner after each task ends.
# The batch script stops its own container on every exit path it can trap;
# this catches what it cannot (SIGKILL after KillWait, a killed slurmstepd),
# so a cancelled job never leaves a container behind.
[ -n "${SLURM_JOB_ID:-}" ] || exit 0
command -v podman >/dev/null 2>&1 || exit 0
if [ -z "${XDG_RUNTIME_DIR:-}" ] || [ ! -w "${XDG_RUNTIME_DIR}" ]; then
    XDG_RUNTIME_DIR="/run/user/$(id -u)"
    if [ ! -w "$XDG_RUNTIME_DIR" ]; then
        XDG_RUNTIME_DIR="/tmp/dlsub-xdg-$(id -u)"
        [ -e "$XDG_RUNTIME_DIR" ] || [ -L "$XDG_RUNTIME_DIR" ] || exit 0  # no Podman ran here from a job
        # Another user may have made it first: use it only if it is ours and private.
        if [ -L "$XDG_RUNTIME_DIR" ] || [ ! -d "$XDG_RUNTIME_DIR" ] \
            || [ "$(stat -c '%u %a' "$XDG_RUNTIME_DIR")" != "$(id -u) 700" ]; then
            echo "dlsub: taskepilog: $XDG_RUNTIME_DIR is not a directory of yours with mode 700; not running podman there" >&2
            exit 0
        fi
    fi
    export XDG_RUNTIME_DIR
fi
[ -d "$XDG_RUNTIME_DIR" ] || exit 0
ids=$(podman ps -aq --filter "label=dlsub.slurm_job_id=${SLURM_JOB_ID}" 2>/dev/null)
[ -n "$ids" ] || exit 0
echo "dlsub: taskepilog: removing containers of Slurm job ${SLURM_JOB_ID}: $ids" >&2
# Under proctrack/cgroup Slurm has already killed the container's processes and its conmon with the step:
# Podman still records the container as running, fails to stop it ("could not be stopped: timed out
# waiting for file .../exits/ID") and marks it exited; the second rm then removes it.
# shellcheck disable=SC2086  # ids are podman's hex ids, one per word
podman rm -f -t 5 $ids >/dev/null 2>&1 || podman rm -f -t 0 $ids >/dev/null 2>&1 || true
exit 0
