"""munge credentials across login hosts: who asks the agent over TCP, and its answer sealed for them alone.

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

The agent's answer goes back the same way (:func:`seal`): the payload of a credential the agent's account
makes, restricted to the asker's uid (``munge --restrict-uid``), so that munge encrypts it with the cluster's
key, only a process of that uid can decode it, and the client knows by its uid that the agent made it
(:func:`verify` on the client's side). Both ends are the agent's own modules below the daemon and the user
side, which share this one.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

#: munge's decoder and encoder (Debian's munge package, on every Slurm host); found on PATH.
UNMUNGE = "unmunge"
MUNGE = "munge"
#: The largest payload munged takes (it refused 2 MB with "Exceeded maximum memory allocation", took 1 MB):
#: an answer is compressed (``--zip zlib``) and sealed up to this.
MAX_SEALED_PAYLOAD = 1_000_000
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


def verify(credential: bytes, *, timeout_s: float = UNMUNGE_TIMEOUT_S, max_payload: int = 4096,
           max_credential: int = MAX_CREDENTIAL) -> MungeCaller:
    """The caller a credential proves, or MungeRefused saying why not."""
    credential = credential.strip()
    if not credential.startswith(b"MUNGE:"):
        raise MungeRefused("expected a munge credential (one line starting MUNGE:, as `munge` prints)")
    if len(credential) > max_credential:
        raise MungeRefused(f"credential larger than {max_credential} bytes")
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


def seal(payload: bytes, for_uid: int, *, timeout_s: float = UNMUNGE_TIMEOUT_S) -> bytes:
    """``payload`` as one credential line only ``for_uid`` can decode, vouching for this process's uid; zlib
    compressed. MungeRefused (its reason) when munge cannot make it or the payload is too large."""
    if len(payload) > MAX_SEALED_PAYLOAD:
        raise MungeRefused(f"the answer is larger than {MAX_SEALED_PAYLOAD} bytes, more than munge seals")
    argv = [MUNGE, "--restrict-uid", str(int(for_uid)), "--zip", "zlib"]
    try:
        made = subprocess.run(argv, input=payload, capture_output=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        raise MungeRefused("the agent's host has no `munge` (the admin must install munge there)") from None
    except subprocess.TimeoutExpired:
        raise MungeRefused("munged on the agent's host did not answer in time; try again") from None
    credential = made.stdout.strip()
    if made.returncode != 0 or not credential.startswith(b"MUNGE:"):
        said = made.stderr.decode(errors="replace").strip().splitlines()
        raise MungeRefused(f"the agent's munge could not seal its answer ({said[-1] if said else made.returncode})")
    return credential
