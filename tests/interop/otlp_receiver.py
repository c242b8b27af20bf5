"""A real OTLP/HTTP trace receiver for the tests: what an OpenTelemetry collector's `otlphttp`
receiver does for traces, reduced to keeping the spans.

It listens on 127.0.0.1:0 in a thread of the test process, accepts `POST /v1/traces` bodies of
`application/x-protobuf` (plain or `Content-Encoding: gzip`), decodes them with the official
`opentelemetry-proto` messages (`ExportTraceServiceRequest`), answers 200 with an empty
`ExportTraceServiceResponse`, and keeps every span as a plain `Span`. Anything else is refused
(404, 405, 415, 400) and kept in `refused`, so a test can say what the exporter got wrong. Tests
wait for a span on a condition variable, bounded, never by sleeping.
"""

import gzip
import http.server
import threading
import time
from dataclasses import dataclass, field

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span as SpanProto
from opentelemetry.proto.trace.v1.trace_pb2 import Status

WAIT_S = 30
DUMP_LAST = 8  # spans shown when a wait fails
PROTOBUF = "application/x-protobuf"
# Attributes the tracing → OpenTelemetry bridge adds to every span (timings, source location).
BOOKKEEPING = {"busy_ns", "idle_ns", "target"}
KINDS = {v: k.removeprefix("SPAN_KIND_") for k, v in SpanProto.SpanKind.items()}


@dataclass
class Span:
    """One received span, ids as lowercase hex (parent "" for a root)."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: str
    attributes: dict
    links: list  # [(trace_id, span_id)]
    events: list  # [event name]
    service_name: str
    resource: dict = field(repr=False)
    scope: str = ""
    status: str = ""
    start_ns: int = 0
    end_ns: int = 0
    event_attributes: list = field(default_factory=list, repr=False)  # [(event name, {attributes})]

    def event(self, name):
        """The attributes of the first event `name` (None when there is none)."""
        return next((attrs for n, attrs in self.event_attributes if n == name), None)

    def brief(self, every_attribute=False):
        """One line: name, kind, ids, attributes (but the bookkeeping of tracing-opentelemetry,
        unless `every_attribute`), links and events."""
        parent = self.parent_span_id or "-"
        shown = {k: v for k, v in self.attributes.items()
                 if every_attribute or not (k in BOOKKEEPING or k.startswith(("code.", "thread.")))}
        attrs = " ".join(f"{k}={v}" for k, v in sorted(shown.items()))
        if len(shown) < len(self.attributes):
            attrs += f" (+{len(self.attributes) - len(shown)} bookkeeping)"
        links = ",".join(f"{t[:8]}…/{s}" for t, s in self.links)
        events = ",".join(self.events)
        return (f"{self.kind:<8} {self.name!r} trace={self.trace_id} span={self.span_id} parent={parent}"
                f" [{attrs}]" + (f" links=[{links}]" if links else "") + (f" events=[{events}]" if events else ""))


def value_of(any_value):
    """An `AnyValue` as the Python value it holds."""
    kind = any_value.WhichOneof("value")
    if kind is None:
        return None
    v = getattr(any_value, kind)
    if kind == "array_value":
        return [value_of(x) for x in v.values]
    if kind == "kvlist_value":
        return {kv.key: value_of(kv.value) for kv in v.values}
    if kind == "bytes_value":
        return bytes(v)
    return v


def attributes_of(key_values):
    return {kv.key: value_of(kv.value) for kv in key_values}


def spans_of(request):
    """The spans of a decoded `ExportTraceServiceRequest`."""
    out = []
    for rs in request.resource_spans:
        resource = attributes_of(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(Span(
                    trace_id=s.trace_id.hex(),
                    span_id=s.span_id.hex(),
                    parent_span_id=s.parent_span_id.hex(),
                    name=s.name,
                    kind=KINDS.get(s.kind, str(s.kind)),
                    attributes=attributes_of(s.attributes),
                    links=[(l.trace_id.hex(), l.span_id.hex()) for l in s.links],
                    events=[e.name for e in s.events],
                    service_name=resource.get("service.name", ""),
                    resource=resource,
                    scope=ss.scope.name,
                    status=Status.StatusCode.Name(s.status.code).removeprefix("STATUS_CODE_"),
                    start_ns=s.start_time_unix_nano,
                    end_ns=s.end_time_unix_nano,
                    event_attributes=[(e.name, attributes_of(e.attributes)) for e in s.events],
                ))
    return out


class OtlpReceiver:
    """`with OtlpReceiver() as rx:` — `rx.endpoint` is the base URL to give an OTLP exporter
    (traces go to `rx.endpoint + "/v1/traces"`); `rx.spans()` is every span so far."""

    def __init__(self):
        self.cond = threading.Condition()
        self._spans = []
        self.exports = 0  # accepted export requests
        self.refused = []  # (method, path, content-type, content-encoding, status, why)
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self._body()
                ctype = (self.headers.get("content-type") or "").split(";")[0].strip().lower()
                encoding = (self.headers.get("content-encoding") or "identity").strip().lower()
                if self.path.split("?")[0] != "/v1/traces":
                    return self._refuse(404, "not /v1/traces", ctype, encoding)
                if ctype != PROTOBUF:
                    return self._refuse(415, "not protobuf", ctype, encoding)
                try:
                    if encoding == "gzip":
                        body = gzip.decompress(body)
                    elif encoding != "identity":
                        return self._refuse(415, "unknown content-encoding", ctype, encoding)
                    request = ExportTraceServiceRequest.FromString(body)
                except Exception as e:  # noqa: BLE001 (a bad body is the exporter's fault, report it)
                    return self._refuse(400, f"undecodable: {e}", ctype, encoding)
                got = spans_of(request)
                with receiver.cond:
                    receiver._spans.extend(got)
                    receiver.exports += 1
                    receiver.cond.notify_all()
                self._answer(200, ExportTraceServiceResponse().SerializeToString())

            def _body(self):
                if "chunked" in (self.headers.get("transfer-encoding") or "").lower():
                    chunks = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass  # trailers, up to the blank line
                            return b"".join(chunks)
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()  # the CRLF after the chunk
                return self.rfile.read(int(self.headers.get("content-length") or 0))

            def do_GET(self):
                self._refuse(405, "GET", "", "")

            def _refuse(self, status, why, ctype, encoding):
                with receiver.cond:
                    receiver.refused.append((self.command, self.path, ctype, encoding, status, why))
                    receiver.cond.notify_all()
                self._answer(status, why.encode())

            def _answer(self, status, body):
                self.send_response(status)
                self.send_header("content-type", PROTOBUF if status == 200 else "text/plain")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="otlp-receiver", daemon=True)
        self.thread.start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def spans(self, pred=lambda s: True):
        with self.cond:
            return [s for s in self._spans if pred(s)]

    def wait_for(self, pred, count=1, timeout=WAIT_S):
        """Waits (at most `timeout` s) until `count` received spans match `pred`; returns them all
        (in arrival order). Fails with a dump of what did arrive."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                found = [s for s in self._spans if pred(s)]
                if len(found) >= count:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"{len(found)} of {count} awaited spans within {timeout}s; the receiver has "
                        f"{len(self._spans)} spans, the last {min(len(self._spans), DUMP_LAST)}:\n"
                        + "\n".join(s.brief() for s in self._spans[-DUMP_LAST:])
                        + (f"\nrefused: {self.refused}" if self.refused else ""))
                self.cond.wait(left)

    def wait_one(self, pred, timeout=WAIT_S):
        return self.wait_for(pred, 1, timeout)[0]

    def dump(self, pred=lambda s: True):
        return "\n".join(s.brief() for s in self.spans(pred)) or "(no spans)"
