"""Who asks over TCP: a munge credential decoded by ``unmunge``, as Slurm's daemons learn a caller's uid.

A client on another login host sends its request as the payload of a
credential ``munge`` made (:func:`dlsub.job.agent_client.munge_credential`).
``unmunge`` here asks the local munged to verify it: the shared key proves
that a munged of the cluster encoded it for that uid, its time-to-live that
it is fresh, and munged's replay cache that nobody used it before. What it
prints (``unmunge --numeric``: ``KEY: value`` lines, a blank line, then the
payload) gives the uid and the request; its exit status is munge's error
code (``munge_enum(3)``), which :data:`REFUSALS` turns into what the client
is told. The credential reaches ``unmunge`` on its standard input only,
never a shell or its command line.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

#: munge's decoder (Debian's munge package, on every Slurm host); found on PATH.
UNMUNGE = "unmunge"
#: The longest credential read (a request is ~100 bytes; munge adds well under 1 KiB around it).
MAX_CREDENTIAL = 16 * 1024
#: How long unmunge may take (munged answers in milliseconds).
UNMUNGE_TIMEOUT_S = 5.0

#: munge_decode's error codes (munge.h, ``munge_err_t``) and what the client is told.
REFUSALS = {
    6: "the agent's host cannot reach its munged (the admin must start munged there)",
    7: "munged on the agent's host did not answer in time; try again",
    8: "not a valid munge credential",
    9: "not a valid munge credential (or one of a munge version the agent's munged does not know)",
    10: "not a valid munge credential (or one of a cipher the agent's munged does not know)",
    11: "not a valid munge credential (or one of a MAC the agent's munged does not know)",
    12: "not a valid munge credential (or one of a compression the agent's munged does not know)",
    13: "the credential is from another munge realm",
    14: "not a valid munge credential: it was not made with this cluster's munge key",
    15: "the credential has expired (is this host's clock behind the agent's host? check NTP)",
    16: "the credential was made in the future (is this host's clock ahead of the agent's host? check NTP)",
    17: "the credential was already used (replayed): every request needs a fresh one",
    18: "the credential is restricted to another user than the agent's account",
}


class MungeRefused(Exception):
    """The credential does not prove who asks; the message is for the client."""


@dataclass(frozen=True)
class MungeCaller:
    """What a verified credential says: who made it, where, and the request it carries."""

    uid: int
    gid: int
    host: str
    payload: bytes


def verify(credential: bytes, *, timeout_s: float = UNMUNGE_TIMEOUT_S, max_payload: int = 4096) -> MungeCaller:
    """The caller a credential proves, or MungeRefused saying why not."""
    credential = credential.strip()
    if not credential.startswith(b"MUNGE:"):
        raise MungeRefused("expected a munge credential (one line starting MUNGE:, as `munge` prints)")
    if len(credential) > MAX_CREDENTIAL:
        raise MungeRefused(f"credential larger than {MAX_CREDENTIAL} bytes")
    argv = [UNMUNGE, "--numeric", "--keys", "STATUS,ENCODE_HOST,UID,GID,LENGTH"]
    try:
        done = subprocess.run(argv, input=credential + b"\n", capture_output=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        raise MungeRefused("the agent's host has no `unmunge` (the admin must install munge there)") from None
    except subprocess.TimeoutExpired:
        raise MungeRefused("munged on the agent's host did not answer in time; try again") from None
    if done.returncode != 0:
        reason = REFUSALS.get(done.returncode, f"munge refused the credential (error {done.returncode})")
        raise MungeRefused(reason)
    head, blank, payload = done.stdout.partition(b"\n\n")
    meta: dict[str, str] = {}
    for line in head.decode(errors="replace").splitlines():
        key, colon, value = line.partition(":")
        if colon:
            meta[key.strip().upper()] = value.strip()
    try:
        uid, gid = int(meta["UID"]), int(meta["GID"])
    except (KeyError, ValueError):
        raise MungeRefused("unmunge said nothing usable about who made the credential") from None
    if not blank or meta.get("STATUS", "0").split()[0] != "0":
        raise MungeRefused("unmunge did not vouch for the credential")
    if len(payload) > max_payload:
        raise MungeRefused(f"request larger than {max_payload} bytes")
    return MungeCaller(uid, gid, meta.get("ENCODE_HOST", "?"), payload)
