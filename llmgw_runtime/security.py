"""Tokens: generated with a prefix that says what they are, stored only as SHA-256 hashes.

Tokens are 256-bit random strings, so a plain SHA-256 is a sound way to store them (no
password stretching needed); comparison is constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

PREFIXES = {"admin": "llmgw-admin-", "api_key": "sk-llmgw-", "join": "llmgw-join-",
            "router": "llmgw-router-", "node": "llmgw-node-"}


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
