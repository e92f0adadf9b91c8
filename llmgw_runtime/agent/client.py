"""The agent's client of the control service: join, then report, in full or as a heartbeat
(over api.transport)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from ..api.agent import (
    Heartbeat,
    HeartbeatAnswer,
    JoinAnswer,
    JoinRequest,
    Report,
    ReportAnswer,
    report_digest,
)
from ..api.transport import RemoteError, Transport, TransportError
from ..errors import AuthError, ForbiddenError, LlmgwError

log = logging.getLogger(__name__)

JOIN_PATH = "/api/v1/agent/join"
REPORT_PATH = "/api/v1/agent/report"
HEARTBEAT_PATH = "/api/v1/agent/heartbeat"

ControlError = TransportError


class NoHeartbeats(LlmgwError):
    """The control service has no heartbeat endpoint (an older version): report in full."""


class HeartbeatRefused(LlmgwError):
    """The control service refused a heartbeat (not the credential): report in full."""


class ControlClient:
    """Joins with the join token, keeps the node credential in ``credential_path``
    (mode 0600), and reports with it; a 401 on a stored credential rejoins once, showing
    that credential (a name that has one can only be joined again with it). ``digest`` is
    that of the last full report the control service answered (its heartbeats name it)."""

    def __init__(self, control_url: str, join_token: str, node: str, credential_path: Path, *,
                 timeout_s: float = 10.0, ca_certs: str | None = None):
        self.transport = Transport(control_url, join_token, ca_file=ca_certs,
                                   timeout_s=timeout_s)
        self.base = self.transport.base
        self._join_token = join_token
        self.node = node
        self.credential_path = Path(credential_path)
        self.digest: str | None = None

    def __repr__(self) -> str:
        return f"ControlClient({self.base!r}, node={self.node!r})"

    # -- credential --------------------------------------------------------------------
    def credential(self) -> str | None:
        try:
            text = self.credential_path.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return None
        return text or None

    def _store_credential(self, credential: str) -> None:
        self.credential_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.credential_path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(credential + "\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.credential_path)

    # -- calls -------------------------------------------------------------------------
    def _call(self, path: str, token: str, body: JoinRequest | Heartbeat | bytes,
              answer: type[JoinAnswer] | type[ReportAnswer] | type[HeartbeatAnswer],
              ) -> JoinAnswer | ReportAnswer | HeartbeatAnswer:
        try:
            if isinstance(body, bytes):
                return self.transport.call("POST", path, data=body, answer=answer,
                                           token=token)
            return self.transport.call("POST", path, body, answer=answer, token=token)
        except RemoteError as exc:
            text = f"{path}: HTTP {exc.status}: {exc}"
            if exc.status == 401:
                raise AuthError(text) from None
            if exc.status == 403:
                raise ForbiddenError(text) from None
            raise LlmgwError(text) from None

    def join(self) -> str:
        """Join with the join token (and the stored credential, if any); store and return
        the node credential."""
        request = JoinRequest(node=self.node, credential=self.credential())
        answer = self._call(JOIN_PATH, self._join_token, request, JoinAnswer)
        assert isinstance(answer, JoinAnswer)
        self._store_credential(answer.credential)
        log.info("joined the control service %s as node %s", self.base, self.node)
        return answer.credential

    def report(self, payload: Report) -> ReportAnswer:
        """Post a full report; returns the parsed answer (assignments, report_interval_s)
        and keeps the digest of the body as sent (:attr:`digest`)."""
        body = json.dumps(payload.model_dump(mode="json", by_alias=True, exclude_unset=True),
                          allow_nan=False).encode()
        self.digest = None                  # unknown until answered: no heartbeat names it
        credential = self.credential()
        token = credential if credential is not None else self.join()
        try:
            answer = self._call(REPORT_PATH, token, body, ReportAnswer)
        except AuthError:
            log.warning("node credential refused by %s; joining again", self.base)
            answer = self._call(REPORT_PATH, self.join(), body, ReportAnswer)
        assert isinstance(answer, ReportAnswer)
        self.digest = report_digest(body)
        return answer

    def heartbeat(self, beat: Heartbeat) -> HeartbeatAnswer:
        """Post a heartbeat with the node's stored credential. :class:`NoHeartbeats` when
        the control service has no such endpoint; ``AuthError`` (the credential) and
        :class:`HeartbeatRefused` (any other refusal) make the caller send its full report
        (which joins again when needed)."""
        token = self.credential()
        if token is None:
            raise AuthError("no node credential yet; send the full report")
        try:
            answer = self.transport.call("POST", HEARTBEAT_PATH, beat,
                                         answer=HeartbeatAnswer, token=token)
        except RemoteError as exc:
            text = f"{HEARTBEAT_PATH}: HTTP {exc.status}: {exc}"
            if exc.status in (404, 405):
                raise NoHeartbeats(text) from None
            if exc.status == 401:
                raise AuthError(text) from None
            raise HeartbeatRefused(text) from None
        return answer
