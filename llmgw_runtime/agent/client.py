"""The agent's HTTP client of the control service: join, then report."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import urllib3

from ..errors import AuthError, ForbiddenError, LlmgwError

log = logging.getLogger(__name__)

JOIN_PATH = "/api/v1/agent/join"
REPORT_PATH = "/api/v1/agent/report"


class ControlError(LlmgwError):
    """The control service could not be reached or answered with an error."""

    status = 502
    reason = "control_unavailable"


class ControlClient:
    """Joins with the join token, keeps the node credential in ``credential_path``
    (mode 0600), and reports with it; a 401 on a stored credential rejoins once."""

    def __init__(self, control_url: str, join_token: str, node: str, credential_path: Path, *,
                 timeout_s: float = 10.0, ca_certs: str | None = None):
        self.base = control_url.rstrip("/")
        self._join_token = join_token
        self.node = node
        self.credential_path = Path(credential_path)
        kwargs: dict[str, Any] = {"retries": False,
                                  "timeout": urllib3.Timeout(total=timeout_s)}
        if ca_certs:
            kwargs["ca_certs"] = ca_certs
        self._http = urllib3.PoolManager(**kwargs)

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

    # -- HTTP --------------------------------------------------------------------------
    def _post(self, path: str, token: str, body: dict[str, Any]) -> dict[str, Any]:
        url = self.base + path
        try:
            resp = self._http.request(
                "POST", url, body=json.dumps(body).encode("utf-8"),
                headers={"Content-Type": "application/json",
                         "Authorization": f"Bearer {token}"})
        except urllib3.exceptions.HTTPError as exc:
            raise ControlError(f"control service unreachable at {self.base}: {exc}") from None
        try:
            data = json.loads(resp.data.decode("utf-8")) if resp.data else {}
        except ValueError:
            data = {}
        if resp.status >= 400:
            err = data.get("error") if isinstance(data, dict) else None
            message = (err.get("message") if isinstance(err, dict) else None) or \
                resp.data[:200].decode("utf-8", errors="replace")
            text = f"{path}: HTTP {resp.status}: {message}"
            if resp.status == 401:
                raise AuthError(text)
            if resp.status == 403:
                raise ForbiddenError(text)
            raise ControlError(text)
        if not isinstance(data, dict):
            raise ControlError(f"{path}: the answer is not a JSON object")
        return data

    def join(self) -> str:
        """Join with the join token; store and return the node credential."""
        data = self._post(JOIN_PATH, self._join_token, {"node": self.node})
        credential = data.get("credential")
        if not isinstance(credential, str) or not credential:
            raise ControlError(f"{JOIN_PATH}: the answer has no credential")
        self._store_credential(credential)
        log.info("joined the control service %s as node %s", self.base, self.node)
        return credential

    def report(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Post a report; returns the answer (assignments, report_interval_s)."""
        credential = self.credential()
        if credential is None:
            return self._post(REPORT_PATH, self.join(), payload)
        try:
            return self._post(REPORT_PATH, credential, payload)
        except AuthError:
            log.warning("node credential refused by %s; joining again", self.base)
            return self._post(REPORT_PATH, self.join(), payload)
