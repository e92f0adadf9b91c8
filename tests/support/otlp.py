"""An OTLP/HTTP receiver for tests: a threaded HTTP server on 127.0.0.1 that takes
``POST /v1/traces`` (protobuf ExportTraceServiceRequest, as the OpenTelemetry SDK's
exporter sends it), decodes it with opentelemetry-proto and keeps every span.

Also a sink for a benchmark with tracing on: ``python tests/support/otlp.py PORT`` takes
and counts spans until interrupted (LLMGW_OTEL_ENDPOINT=http://127.0.0.1:PORT)."""

from __future__ import annotations

import gzip
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass
class Span:
    service: str
    name: str
    trace_id: str          # hex, as in a traceparent
    span_id: str
    parent_id: str         # "" for a root span
    kind: int              # opentelemetry.proto.trace.v1 Span.SpanKind
    status: int            # Status.StatusCode: 0 unset, 1 ok, 2 error
    status_message: str
    attributes: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def event(self, name: str) -> dict[str, Any] | None:
        return next((attrs for n, attrs in self.events if n == name), None)


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    return None if kind is None else getattr(v, kind)


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


class Receiver:
    """Spans received, in arrival order (``spans``), and every raw body (``bodies``);
    with ``keep`` false only their number (``count``), as a benchmark's sink."""

    def __init__(self, port: int = 0, keep: bool = True) -> None:
        self.spans: list[Span] = []
        self.bodies: list[bytes] = []
        self.count = 0
        self._keep = keep
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:    # noqa: N802 (http.server's name)
                data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    data = gzip.decompress(data)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                receiver._take(data)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()

    def _take(self, data: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(data)
        if not self._keep:
            with self._lock:
                self.count += sum(len(ss.spans) for rs in request.resource_spans
                                  for ss in rs.scope_spans)
            return
        got = []
        for rs in request.resource_spans:
            service = str(_attrs(rs.resource.attributes).get("service.name", ""))
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append(Span(
                        service, s.name, s.trace_id.hex(), s.span_id.hex(),
                        s.parent_span_id.hex(), s.kind, s.status.code, s.status.message,
                        _attrs(s.attributes),
                        [(e.name, _attrs(e.attributes)) for e in s.events]))
        with self._lock:
            self.bodies.append(data)
            self.spans.extend(got)

    def wait(self, found: Callable[[list[Span]], Any], timeout_s: float = 10.0) -> Any:
        """``found(spans)`` once it is truthy; AssertionError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                spans = list(self.spans)
            result = found(spans)
            if result:
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"not received in {timeout_s} s; spans: "
                                     f"{[(s.service, s.name) for s in spans]}")
            time.sleep(0.05)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


if __name__ == "__main__":
    sink = Receiver(int(sys.argv[1]), keep=False)
    print(f"OTLP/HTTP sink at {sink.url}: counting spans (Ctrl-C stops)", flush=True)
    try:
        while True:
            time.sleep(5)
            print(f"spans received: {sink.count}", flush=True)
    except KeyboardInterrupt:
        sink.stop()
