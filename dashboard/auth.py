"""The dashboard's token: every request must carry it, or it is refused and shows nothing.

As Jupyter does: the URL printed at start carries ``?token=``; the first
request with it gets an HttpOnly, SameSite=Strict cookie and is redirected
to the same page without the token (so it stays out of history and
referrers). ``Authorization: Bearer TOKEN`` works too (scripts, tests).
"""

from __future__ import annotations

import hmac
import os
import secrets
import stat
from pathlib import Path

#: The query parameter and the cookie's name stem.
TOKEN_PARAM = "token"
MIN_TOKEN_LENGTH = 16


class TokenFileError(ValueError):
    """The token file cannot be used; the message says how to fix it."""


def new_token() -> str:
    return secrets.token_urlsafe(32)


def cookie_name(port: int) -> str:
    # Cookies do not tell ports apart: two dashboards on one host keep their own.
    return f"dlsub_dashboard_{port}"


def matches(given: str | None, token: str) -> bool:
    return bool(given) and hmac.compare_digest(str(given).encode(), token.encode())


def read_token_file(path: Path) -> str:
    """A service's token: a file only its owner (and group) may read, holding one long token."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise TokenFileError(f"cannot open the token file {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise TokenFileError(f"{path} is not a regular file")
        if info.st_mode & 0o007:
            raise TokenFileError(f"{path} is open to every user (mode {stat.S_IMODE(info.st_mode):o}); "
                                 "make it readable by its owner and the admins' group only: chmod 640 or 440")
        text = os.read(fd, 4096).decode("utf-8", errors="replace").strip()
    finally:
        os.close(fd)
    if len(text) < MIN_TOKEN_LENGTH or any(c.isspace() for c in text):
        raise TokenFileError(f"{path} must hold one token of {MIN_TOKEN_LENGTH} or more characters and no spaces "
                             "(e.g. `python3 -c 'import secrets; print(secrets.token_urlsafe(32))'`)")
    return text
