"""A legacy Streamable HTTP client on the official Python SDK (mcp==1.30.0: `streamable_http_client`
and `ClientSession`), driven by a list of operations, answering the server's requests through its
own callbacks. Prints one JSON line of results at the end.

Usage: python py_legacy_matrix_client.py URL '<ops JSON>' ['<options JSON>']  (or `run(argv, io)`
under driven.py)
options: {"version": "2025-06-18"}  the protocolVersion its initialize asks for (default: the SDK's)
ops (each result is that op's dict, or {"error": "..."} when it raised):
  {"op":"listTools"}                              → {"tools": [names]}
  {"op":"callTool","name":..,"arguments":{..}}    → {"text": first text content, "isError": bool}
  {"op":"progress","name":..,"arguments":{..}}    → {"text", "progress": [values], "totals": [..]}
  {"op":"cancel","tag":..,"afterMs":N}            → calls wait_forever(tag), gives up after N ms and
       sends notifications/cancelled for it (mcp 1.x never sends one itself), → {"gaveUp": bool, ...}
  {"op":"heldCall","name":..,"arguments":{..}}    → like callTool, but the first elicitation it
       causes prints `HELD {"session": ...}` and waits for a line on stdin before it is answered
  {"op":"concurrent","ops":[..]}                  → {"results": [...]}: the ops run at once, on
       this one session
  {"op":"wait"}                                   → prints `WAITING {"session": ...}`, waits for a
       line on stdin
Every call has a 20 s read timeout, so a call the server never answers shows as an error.
The output line: {"protocol", "session", "server", "results", "counts", "http": [[method, status]…],
"closed": true} (the client's close sends DELETE; its status is the last "http" entry), or with
"error" when the session itself failed.
"""

import asyncio
import json
from datetime import timedelta

import httpx
import mcp.types as types
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

import driven

CALL_TIMEOUT = timedelta(seconds=20)
OVERALL_TIMEOUT_S = 55


class Callbacks:
    """The client's answers to server requests, counted; an elicitation can be held (see heldCall)."""

    def __init__(self, io):
        self.io = io
        self.counts = {"elicitation": 0, "sampling": 0, "roots": 0}
        self.hold_next_elicitation = False
        self.session_id = lambda: None

    async def elicit(self, context, params):
        self.counts["elicitation"] += 1
        if self.hold_next_elicitation:
            self.hold_next_elicitation = False
            await self.io.stop("HELD", {"session": self.session_id()})
        return types.ElicitResult(action="accept", content={"name": "Linus"})

    async def sample(self, context, params):
        self.counts["sampling"] += 1
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text="py-legacy-sampled"),
            model="py-legacy-model",
        )

    async def roots(self, context):
        self.counts["roots"] += 1
        return types.ListRootsResult(roots=[types.Root(uri="file:///py-legacy/root", name="py-legacy")])


class PinnedSession(ClientSession):
    """A ClientSession whose initialize asks for `version` (ClientSession.initialize asks for
    types.LATEST_PROTOCOL_VERSION: this is how a 1.x client pins an older one, per session)."""

    def __init__(self, *args, version=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.version = version

    async def send_request(self, request, *args, **kwargs):
        if self.version and isinstance(request.root, types.InitializeRequest):
            request.root.params.protocolVersion = self.version
        return await super().send_request(request, *args, **kwargs)


def text_of(result):
    texts = [c.text for c in result.content if isinstance(c, types.TextContent)]
    return {"text": texts[0] if texts else None, "isError": bool(result.isError)}


async def run_op(s, callbacks, op):
    kind = op["op"]
    if kind == "listTools":
        return {"tools": [t.name for t in (await s.list_tools()).tools]}
    if kind == "callTool":
        return text_of(await s.call_tool(op["name"], op.get("arguments", {}), read_timeout_seconds=CALL_TIMEOUT))
    if kind == "progress":
        seen = []

        async def on_progress(progress, total, message):
            seen.append((progress, total))

        r = await s.call_tool(op["name"], op.get("arguments", {}), read_timeout_seconds=CALL_TIMEOUT,
                              progress_callback=on_progress)
        return {**text_of(r), "progress": [p for p, _ in seen], "totals": [t for _, t in seen]}
    if kind == "cancel":
        # ClientSession numbers its requests itself; the call below takes the next number.
        request_id = s._request_id
        try:
            r = await s.call_tool("wait_forever", {"tag": op["tag"]},
                                  read_timeout_seconds=timedelta(milliseconds=op["afterMs"]))
            return {"gaveUp": False, **text_of(r)}
        except Exception as e:  # the SDK's timeout is an McpError
            await s.send_notification(types.ClientNotification(types.CancelledNotification(
                params=types.CancelledNotificationParams(requestId=request_id, reason="the client gave up"))))
            return {"gaveUp": True, "requestId": request_id, "message": str(e)}
    if kind == "heldCall":
        callbacks.hold_next_elicitation = True
        return text_of(await s.call_tool(op["name"], op.get("arguments", {}), read_timeout_seconds=CALL_TIMEOUT))
    if kind == "concurrent":
        return {"results": list(await asyncio.gather(*[run_guarded(s, callbacks, sub) for sub in op["ops"]]))}
    if kind == "wait":
        await callbacks.io.stop("WAITING", {"session": callbacks.session_id()})
        return {}
    raise ValueError(f"unknown op {kind}")


async def run_guarded(s, callbacks, op):
    try:
        return await run_op(s, callbacks, op)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


async def session(url, ops, options, io):
    http_log = []

    async def record(response):
        http_log.append([response.request.method, response.status_code])

    callbacks = Callbacks(io)
    out = {"results": [], "counts": callbacks.counts, "http": http_log}
    http = httpx.AsyncClient(timeout=httpx.Timeout(30, read=300), event_hooks={"response": [record]})
    try:
        async with http, streamable_http_client(url, http_client=http) as (read, write, session_id):
            callbacks.session_id = session_id
            async with PinnedSession(
                read, write, version=options.get("version"),
                elicitation_callback=callbacks.elicit,
                sampling_callback=callbacks.sample,
                list_roots_callback=callbacks.roots,
            ) as s:
                init = await s.initialize()
                out.update(protocol=init.protocolVersion, session=session_id(), server=init.serverInfo.name)
                for op in ops:
                    out["results"].append(await run_guarded(s, callbacks, op))
        out["closed"] = True
    except BaseException as e:  # an ExceptionGroup from the transport's task group, too
        out["error"] = f"{type(e).__name__}: {e}"
    return out


async def run(argv, io):
    url, ops = argv[0], json.loads(argv[1])
    options = json.loads(argv[2]) if len(argv) > 2 else {}
    try:
        return await asyncio.wait_for(session(url, ops, options, io), OVERALL_TIMEOUT_S)
    except (asyncio.TimeoutError, TimeoutError):
        return {"error": "client timed out"}


if __name__ == "__main__":
    driven.by_hand(run)
