"""Web console logins: an admin token buys a server-side session in the store; the browser
holds only a random session id in an HttpOnly, SameSite=Strict cookie; every form that
changes something carries the session's CSRF token and must come from this site.

Sessions live in the store (``store/sessions.py``), so they work across gunicorn workers
and control instances; the store keeps the SHA-256 of the session id, never the id.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar
from urllib.parse import urlencode, urlsplit

from flask import Response, current_app, g, redirect, request

from .. import throttle
from ..errors import ForbiddenError
from ..security import hash_token
from ..store import accounts, sessions
from .web import clock, store

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

COOKIE = "llmgw_console"
PATH = "/console"
HOME = PATH + "/"


class CsrfError(ForbiddenError):
    reason = "csrf_failed"


def lifetime_s() -> float:
    return float(current_app.config["LLMGW"].console_session_s)


def session_id() -> str:
    return request.cookies.get(COOKIE, "")


def safe_next(target: str | None) -> str:
    """Where to go after login: a console path on this site, nothing else (no open
    redirect to another host). Anything odd (a control character such as a newline, which
    no Location header may carry; a URL that does not parse) goes to the console's home."""
    if not target or any(ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f for c in target):
        return HOME
    try:
        parts = urlsplit(target)
    except ValueError:                       # e.g. "//[" (a broken IPv6 host)
        return HOME
    if parts.scheme or parts.netloc or "\\" in target or target.startswith("//") \
            or not (parts.path == PATH or parts.path.startswith(HOME)):
        return HOME
    return target


def login_url(target: str | None = None, **flags: str) -> str:
    args = {k: v for k, v in flags.items() if v}
    nxt = safe_next(target)
    if nxt != HOME:
        args["next"] = nxt
    return PATH + "/login" + ("?" + urlencode(args) if args else "")


def current() -> sessions.Session | None:
    """The live session of this request's cookie, if any."""
    raw = session_id()
    if not raw:
        return None
    with store().begin() as conn:
        return sessions.get(conn, raw, clock())


def login_required(view: F) -> F:
    """Pages need a live session; without one, the login page (which says why) and back
    here afterwards. Sets ``g.console_user`` and ``g.console_csrf``."""

    @wraps(view)
    def inner(*args: Any, **kwargs: Any) -> Any:
        found = current()
        if found is None:
            target = request.full_path.rstrip("?") if request.method == "GET" else HOME
            return redirect(login_url(target, ended="1" if session_id() else ""), 303)
        g.console_user, g.console_csrf = found.account, found.csrf
        return view(*args, **kwargs)

    return inner  # type: ignore[return-value]


def check_origin() -> None:
    """Defence in depth behind SameSite=Strict and the CSRF token: a form sent from
    another site (Origin, else Referer, naming another host) is refused."""
    origin = request.headers.get("Origin")
    source = origin if origin is not None else request.headers.get("Referer")
    if not source:
        return
    host = "null" if source == "null" else urlsplit(source).netloc
    if host.lower() != request.host.lower():
        raise CsrfError(f"this form was sent from {source!r}, not from this console "
                        f"({request.host}); open the console at {request.host_url}console/ "
                        "and use its buttons")


def check_csrf() -> None:
    """The form's ``csrf`` field must equal the session's token (and come from here)."""
    check_origin()
    sent = request.form.get("csrf", "")
    if not sent:
        raise CsrfError("the form's security token (csrf) is missing; reload the page and "
                        "press the button again")
    if not hmac.compare_digest(sent.encode(), g.console_csrf.encode()):
        raise CsrfError("the form's security token (csrf) does not match your session; "
                        "it may be from an old page or another login: reload the page and "
                        "press the button again")


# Where an operator finds the admin token (the login page and its refusal say it).
WHERE_THE_TOKEN_IS = (
    "`make up` and `llmgw up` keep it in .llmgw/secrets/admin-token of the directory they "
    "ran in (cat .llmgw/secrets/admin-token; LLMGW_STATE_DIR/secrets/ when that is set); "
    "otherwise it is LLMGW_ADMIN_TOKEN of the control service, or the one `llmgw server` "
    "showed when it first started")


def admin_of(token: str) -> tuple[str | None, str]:
    """The admin account this token belongs to, or None and what to tell the user. The
    token itself is never logged."""
    if not token.strip():
        return None, "enter the admin token"
    with store().begin() as conn:
        account = accounts.account_by_hash(conn, hash_token(token.strip()))
    if account is None:
        return None, ("that token matches no account of this control service; use the "
                      f"admin token: {WHERE_THE_TOKEN_IS}")
    if account.kind != "admin":
        return None, (f"that is a {account.kind} token; the console needs an admin token")
    return str(account.name), ""


def start_session(resp: Response, token: str) -> Response | None:
    """Store a new session for the admin whose token this is (dropping expired ones) and
    set its cookie; None if the token no longer matches an admin (rotated meanwhile)."""
    with store().begin() as conn:
        now = clock()
        sessions.prune(conn, now)
        made = sessions.create_for_token(conn, hash_token(token.strip()), now, lifetime_s())
    if made is None:
        return None
    raw, session = made
    resp.set_cookie(COOKIE, raw, max_age=int(lifetime_s()), path=PATH,
                    secure=request.is_secure, httponly=True, samesite="Strict")
    log.info("console login: %s from %s", session.account, request.remote_addr)
    return resp


def address() -> str:
    """The client address logins are counted by: the TCP peer (X-Forwarded-For is not
    trusted: a client could name any address in it)."""
    return request.remote_addr or "-"


def _counted() -> str:
    """The throttle's key of this login: its address and the kind of token typed in."""
    return throttle.key(address(), request.form.get("token", ""))


def login_wait() -> float:
    """Seconds this address must wait before it may try to log in again (0: now). The
    console shares the bearer-token check's throttle: both guess admin tokens."""
    return throttle.of(current_app.extensions).wait_s(_counted(), clock())


def login_failed() -> float:
    """Count a failed login from this address; the refusal it earns now (0: none)."""
    refused_s = throttle.of(current_app.extensions).failed(_counted(), clock())
    if refused_s:
        log.warning("repeated failed console logins from %s; refusing it for %.0f s",
                    address(), refused_s)
    return refused_s


def login_succeeded() -> None:
    throttle.of(current_app.extensions).succeeded(_counted())


def end_session(resp: Response) -> Response:
    raw = session_id()
    if raw:
        with store().begin() as conn:
            sessions.delete(conn, raw)
    resp.delete_cookie(COOKIE, path=PATH, secure=request.is_secure, httponly=True,
                       samesite="Strict")
    return resp
