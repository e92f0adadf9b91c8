"""Tokens: generated with a prefix that says what they are, stored only as SHA-256 hashes.

Tokens are 256-bit random strings, so a plain SHA-256 is a sound way to store them (no
password stretching needed); comparison is constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from pathlib import Path

PREFIXES = {"admin": "llmgw-admin-", "api_key": "sk-llmgw-", "join": "llmgw-join-",
            "router": "llmgw-router-", "node": "llmgw-node-"}


# An operator-chosen token (LLMGW_ADMIN_TOKEN, LLMGW_JOIN_TOKEN, LLMGW_ROUTER_TOKEN): at
# least this long, with at least MIN_TOKEN_DISTINCT different characters. Generated ones
# (new_token) are 44 random characters after their prefix.
MIN_TOKEN_CHARS = 24
MIN_TOKEN_DISTINCT = 8
MAKE_TOKEN = ("make one with `openssl rand -hex 24`, or use the one the control service "
              "generates when its own setting is unset (shown once at its first start; "
              "`llmgw up` keeps its own in .llmgw/secrets/)")


def token_problem(setting: str, token: str) -> str | None:
    """Why ``token``, the value of ``setting``, is too weak to guard the cluster, or None
    (also when it is empty: whether it is required is the caller's rule). The message
    never shows the token."""
    if not token:
        return None
    if len(token) < MIN_TOKEN_CHARS:
        return (f"{setting} is too short ({len(token)} characters): use at least "
                f"{MIN_TOKEN_CHARS} random characters; {MAKE_TOKEN}")
    if len(set(token)) < MIN_TOKEN_DISTINCT:
        return (f"{setting} repeats too few characters ({len(set(token))} different): use "
                f"at least {MIN_TOKEN_DISTINCT} different ones, random; {MAKE_TOKEN}")
    return None


def new_token(kind: str) -> str:
    """A fresh random token whose prefix names its kind (``admin``, ``api_key`` ...)."""
    return PREFIXES[kind] + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def matches(token: str, token_hash: str) -> bool:
    return hmac.compare_digest(hash_token(token), token_hash)


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None."""
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def redact(token: str | None) -> str:
    """What may appear in a log line instead of a token."""
    if not token:
        return "<none>"
    return token[: min(len(token), 12)] + "…"


def private_dir(path: Path) -> Path:
    """Make ``path`` (and missing parents) for this user only: a new directory is 0700; an
    existing one open to others or writable by its group becomes 0700, while a group-read
    one (0750, as the Ansible roles make /var/lib/llmgw) is kept. State directories hold
    the store, tokens and logs."""
    path = Path(path).expanduser()
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    mode = path.stat().st_mode & 0o777
    if mode & 0o027:
        try:
            path.chmod(0o700)
        except PermissionError:
            logging.getLogger(__name__).warning("%s is %o and not this user's to tighten: make it 0700 (chmod 700 "
                        "%s) so only its owner reads the store, tokens and logs",
                        path, mode, path)
    return path
