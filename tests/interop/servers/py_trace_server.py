"""The Python legacy test server (py_legacy_server.py: mcp==1.30.0, FastMCP, the same tools) with
a record of the trace context each POST carried, for the tracing tests.

For every JSON-RPC message POSTed to it, it keeps the W3C trace context HTTP headers of the POST
(`traceparent`, `tracestate`, `baggage`) and the message's own `_meta` (`params._meta` of a request
or notification, `result._meta` of an answer), recorded as the body is read, so before the SDK acts
on it. `GET /test/seen` returns them all as JSON. One more tool, `trace_meta`, answers with the
`_meta` the SDK itself parsed for its call. Binds 127.0.0.1:0 and prints `READY <port>`;
`--sse` serves the HTTP+SSE transport instead, `--stdio` runs on stdin/stdout.
"""

import json
import sys

from mcp.server.fastmcp import Context

from py_legacy_server import mcp
from serve import serve

TRACE_HEADERS = ("traceparent", "tracestate", "baggage")


@mcp.tool()
async def trace_meta(ctx: Context) -> str:
    """Answers with its request's `_meta` as the SDK parsed it (JSON)."""
    meta = ctx.request_context.meta
    return json.dumps(meta.model_dump(by_alias=True, exclude_none=True) if meta is not None else None)


class TraceRecorder:
    """ASGI middleware: records each POSTed message with the POST's trace headers; serves the
    record at GET /test/seen."""

    def __init__(self, app):
        self.app = app
        self.seen = []

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if scope["method"] == "GET" and scope["path"] == "/test/seen":
            body = json.dumps(self.seen).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            return await send({"type": "http.response.body", "body": body})
        if scope["method"] != "POST":
            return await self.app(scope, receive, send)
        headers = {k.decode().lower(): v.decode() for k, v in scope.get("headers", [])}
        trace_headers = {k: headers[k] for k in TRACE_HEADERS if k in headers}
        body = bytearray()

        async def rx():
            msg = await receive()
            if msg["type"] == "http.request":
                body.extend(msg.get("body", b""))
                if not msg.get("more_body", False):
                    self.record(bytes(body), trace_headers, headers.get("mcp-session-id"))
            return msg

        await self.app(scope, rx, send)

    def record(self, body, trace_headers, session):
        try:
            parsed = json.loads(body)
        except ValueError:
            return
        for m in parsed if isinstance(parsed, list) else [parsed]:
            if not isinstance(m, dict):
                continue
            if "method" in m:
                params = m.get("params") if isinstance(m.get("params"), dict) else {}
                entry = {"kind": "request" if "id" in m else "notification", "method": m["method"],
                         "id": m.get("id"), "meta": params.get("_meta"),
                         "name": params.get("name")}
            else:
                result = m.get("result") if isinstance(m.get("result"), dict) else {}
                entry = {"kind": "response", "id": m.get("id"), "meta": result.get("_meta"),
                         "action": result.get("action"), "content": result.get("content")}
            entry.update(headers=trace_headers, session=session)
            self.seen.append(entry)


if __name__ == "__main__":
    if "--stdio" in sys.argv[1:]:
        # A child of the proxy on stdin/stdout: only `trace_meta` tells what came.
        mcp.run(transport="stdio")
    elif "--sse" in sys.argv[1:]:
        # The deprecated HTTP+SSE transport: the POSTs to /messages/ are recorded.
        serve(lambda port: TraceRecorder(mcp.sse_app()))
    else:
        serve(lambda port: TraceRecorder(mcp.streamable_http_app()))
