"""The agent's client of the control service: join, then report (over api.transport)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from ..api.agent import JoinAnswer, JoinRequest, Report, ReportAnswer
from ..api.transport import RemoteError, Transport, TransportError
from ..errors import AuthError, ForbiddenError, LlmgwError

log = logging.getLogger(__name__)

JOIN_PATH = "/api/v1/agent/join"
REPORT_PATH = "/api/v1/agent/report"

ControlError = TransportError


class ControlClient:
    """Joins with the join token, keeps the node credential in ``credential_path``
    (mode 0600), and reports with it; a 401 on a stored credential rejoins once, showing
    that credential (a name that has one can only be joined again with it)."""

    def __init__(self, control_url: str, join_token: str, node: str, credential_path: Path, *,
                 timeout_s: float = 10.0, ca_certs: str | None = None):
        self.transport = Transport(control_url, join_token, ca_file=ca_certs,
                                   timeout_s=timeout_s)
        self.base = self.transport.base
        self._join_token = join_token
        self.node = node
        self.credential_path = Path(credential_path)

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
    def _call(self, path: str, token: str, body: JoinRequest | Report,
              answer: type[JoinAnswer] | type[ReportAnswer]) -> JoinAnswer | ReportAnswer:
        try:
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
        """Post a report; returns the parsed answer (assignments, report_interval_s)."""
        credential = self.credential()
        token = credential if credential is not None else self.join()
        try:
            answer = self._call(REPORT_PATH, token, payload, ReportAnswer)
        except AuthError:
            log.warning("node credential refused by %s; joining again", self.base)
            answer = self._call(REPORT_PATH, self.join(), payload, ReportAnswer)
        assert isinstance(answer, ReportAnswer)
        return answer
