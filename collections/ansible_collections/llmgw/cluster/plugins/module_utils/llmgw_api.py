# Copyright: llmgw maintainers
"""A small client for the llmgw control service's admin API, shared by the collection's
module and inventory plugin. Only ansible.module_utils.urls (no requests)."""

from __future__ import annotations

import json
import ssl
from urllib.error import HTTPError, URLError
from urllib.parse import quote

from ansible.module_utils.common.text.converters import to_native, to_text
from ansible.module_utils.urls import ConnectionError, SSLValidationError, open_url

# Connection options, the same in the module and the inventory plugin (environment
# fallbacks are declared by each: env_fallback in the module, `env:` in the plugin docs).
ENV_CONTROL_URL = "LLMGW_CONTROL_URL"
ENV_ADMIN_TOKEN = "LLMGW_ADMIN_TOKEN"
ENV_CA_FILE = "LLMGW_CA_FILE"


class LlmgwApiError(Exception):
    """An answer other than 2xx, or no answer at all (status None)."""

    def __init__(self, message, status=None, reason=None, details=None, url=None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.reason = reason
        self.details = list(details or [])
        self.url = url

    def describe(self):
        """The message with every detail, for a failure line an operator reads."""
        if not self.details:
            return self.message
        return self.message + ": " + "; ".join(to_text(d) for d in self.details)

    def as_result(self):
        return {"status": self.status, "reason": self.reason, "details": self.details,
                "url": self.url}


class LlmgwClient:
    """Admin-token requests to one control service; JSON in, JSON out."""

    def __init__(self, control_url, token, ca_path=None, validate_certs=True, timeout=30):
        if not control_url:
            raise LlmgwApiError(f"control_url is not set; give it or set {ENV_CONTROL_URL}")
        if not token:
            raise LlmgwApiError("token is not set; give the admin token (llmgw-admin-...) or "
                                f"set {ENV_ADMIN_TOKEN}")
        self.base = control_url.rstrip("/")
        self.token = token
        self.ca_path = ca_path or None
        self.validate_certs = validate_certs
        self.timeout = timeout

    def request(self, method, path, body=None):
        """The decoded JSON answer; LlmgwApiError on any failure."""
        url = self.base + path
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        try:
            resp = open_url(url, data=data, headers=headers, method=method,
                            validate_certs=self.validate_certs, ca_path=self.ca_path,
                            timeout=self.timeout, follow_redirects="none",
                            use_proxy=True, http_agent="llmgw.cluster")
            raw = resp.read()
        except HTTPError as exc:
            raise self._http_error(exc, method, url) from None
        except (URLError, ConnectionError, OSError) as exc:
            why = getattr(exc, "reason", exc)
            if isinstance(exc, SSLValidationError) or isinstance(why, ssl.SSLCertVerificationError):
                raise LlmgwApiError(f"cannot verify the TLS certificate of {url}: "
                                    f"{to_native(why)}; give ca_path (the cluster CA) or, "
                                    "for a test only, validate_certs: false", url=url) from None
            raise LlmgwApiError(f"cannot reach the control service at {url}: {to_native(why)}",
                                url=url) from None
        if not raw:
            return {}
        try:
            return json.loads(to_text(raw))
        except ValueError:
            raise LlmgwApiError(f"{method} {url} answered something that is not JSON: "
                                f"{to_text(raw)[:200]}", url=url) from None

    @staticmethod
    def _http_error(exc, method, url):
        try:
            raw = exc.read()
        except Exception:  # noqa: BLE001 - the body is optional; the status is enough
            raw = b""
        error = {}
        try:
            error = json.loads(to_text(raw)).get("error") or {}
        except (ValueError, AttributeError):
            pass
        if not isinstance(error, dict):
            error = {"message": to_text(error)}
        message = error.get("message") or f"{method} {url} answered HTTP {exc.code}"
        return LlmgwApiError(to_text(message), status=exc.code, reason=error.get("reason"),
                             details=error.get("details") or [], url=url)

    # ------------------------------------------------------------------ admin API

    def get_model(self, name):
        """The model as the API shows it, or None when it is not in the catalog."""
        try:
            return self.request("GET", "/api/v1/models/" + quote(name, safe="/"))
        except LlmgwApiError as exc:
            if exc.status == 404:
                return None
            raise

    def put_catalog(self, models):
        """Upsert these models (no prune: other models stay)."""
        return self.request("PUT", "/api/v1/catalog", {"models": models})

    def delete_model(self, name):
        return self.request("DELETE", "/api/v1/models/" + quote(name, safe="/"))

    def nodes(self):
        return self.request("GET", "/api/v1/nodes").get("nodes", [])
