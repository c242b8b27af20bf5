"""A 2024-11-05 HTTP+SSE client on the official Python SDK (mcp==1.30.0: `sse_client` and
`ClientSession`), driven by a list of operations, answering the server's requests through its own
callbacks. Prints one JSON line of results at the end.

Usage: python py_sse_client.py SSE_URL '<ops JSON>'  (or `run(argv, io)` under driven.py)
ops (each result is that op's dict, or {"error": "..."} when it raised):
  {"op":"ping"}                                   → {}
  {"op":"listTools"}                              → {"tools": [names]}
  {"op":"callTool","name":..,"arguments":{..}}    → {"text": first text content, "isError": bool}
  {"op":"progress","name":..,"arguments":{..}}    → {"text", "isError", "progress": [values], "totals": [..]}
  {"op":"cancel","tag":..,"afterMs":N}            → calls wait_forever(tag), gives up after N ms and
       sends notifications/cancelled for it by hand (mcp 1.x sends none on a timeout)
       → {"gaveUp": bool, "requestId": id}
  {"op":"heldCall","name":..,"arguments":{..}}    → like callTool, but the first elicitation it causes
       prints `HELD {"session": ...}` and waits for a line on stdin before it is answered
  {"op":"wait"}                                   → prints `WAITING {"session": ...}`, waits for a
       line on stdin
Every call has a 20 s read timeout, so a call nobody answers shows as an error.
The output line: {"protocol", "server", "session" (the endpoint's sessionId), "endpoint" (the POST
URL's path and query), "results", "counts", "http": [[method, status, path]…], "closed": true} —
"closed" once the client left `sse_client` (which closes the stream), or "error" when the session
itself failed.
"""

import asyncio
import json
from datetime import timedelta

import mcp.types as types
from mcp import ClientSession
from mcp.client.sse import sse_client
from mcp.shared._httpx_utils import create_mcp_http_client

import driven

CALL_TIMEOUT = timedelta(seconds=20)
OVERALL_TIMEOUT_S = 55


class Callbacks:
    """The client's answers to server requests, counted; an elicitation can be held (heldCall)."""

    def __init__(self, io):
        self.io = io
        self.counts = {"elicitation": 0, "sampling": 0, "roots": 0}
        self.hold_next_elicitation = False
        self.session = None

    async def elicit(self, context, params):
        self.counts["elicitation"] += 1
        if self.hold_next_elicitation:
            self.hold_next_elicitation = False
            await self.io.stop("HELD", {"session": self.session})
        return types.ElicitResult(action="accept", content={"name": "Barbara"})

    async def sample(self, context, params):
        self.counts["sampling"] += 1
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text="py-sse-sampled"),
            model="py-sse-model",
        )

    async def roots(self, context):
        self.counts["roots"] += 1
        return types.ListRootsResult(roots=[types.Root(uri="file:///py-sse/root", name="py-sse")])


def text_of(result):
    texts = [c.text for c in result.content if isinstance(c, types.TextContent)]
    return {"text": texts[0] if texts else None, "isError": bool(result.isError)}


async def run_op(s, callbacks, op):
    kind = op["op"]
    args = op.get("arguments", {})
    if kind == "ping":
        await s.send_ping()
        return {}
    if kind == "listTools":
        return {"tools": [t.name for t in (await s.list_tools()).tools]}
    if kind == "callTool":
        return text_of(await s.call_tool(op["name"], args, read_timeout_seconds=CALL_TIMEOUT))
    if kind == "progress":
        seen = []

        async def on_progress(progress, total, message):
            seen.append((progress, total))

        r = await s.call_tool(op["name"], args, read_timeout_seconds=CALL_TIMEOUT, progress_callback=on_progress)
        return {**text_of(r), "progress": [p for p, _ in seen], "totals": [t for _, t in seen]}
    if kind == "cancel":
        # The session numbers its requests from 0; the call below takes the next number.
        request_id = s._request_id
        try:
            r = await s.call_tool("wait_forever", {"tag": op["tag"]},
                                  read_timeout_seconds=timedelta(milliseconds=op["afterMs"]))
            return {"gaveUp": False, **text_of(r)}
        except Exception:  # the SDK reports its timeout as an McpError
            await s.send_notification(types.ClientNotification(types.CancelledNotification(
                params=types.CancelledNotificationParams(requestId=request_id, reason="the py SSE client gave up"))))
            return {"gaveUp": True, "requestId": request_id}
    if kind == "heldCall":
        callbacks.hold_next_elicitation = True
        return text_of(await s.call_tool(op["name"], args, read_timeout_seconds=CALL_TIMEOUT))
    if kind == "wait":
        await callbacks.io.stop("WAITING", {"session": callbacks.session})
        return {}
    raise ValueError(f"unknown op {kind}")


class HttpLog:
    """Every HTTP exchange of the client ([method, status, path]); `settled` waits until each
    request sent has been answered (a POST still in flight when the client closes is cut off)."""

    def __init__(self):
        self.entries = []
        self.first_post = None
        self.in_flight = 0
        self.changed = asyncio.Condition()

    async def sent(self, request):
        async with self.changed:
            self.in_flight += 1

    async def answered(self, response):
        method, path = response.request.method, response.request.url.raw_path.decode()
        self.entries.append([method, response.status_code, path])
        if method == "POST" and self.first_post is None:
            self.first_post = path
        async with self.changed:
            self.in_flight -= 1
            self.changed.notify_all()

    async def settled(self):
        async with self.changed:
            await asyncio.wait_for(self.changed.wait_for(lambda: self.in_flight == 0), 10)


async def session(url, ops, io):
    http_log = HttpLog()
    callbacks = Callbacks(io)
    out = {"results": [], "counts": callbacks.counts, "http": http_log.entries}

    def recording_client(headers=None, timeout=None, auth=None):
        client = create_mcp_http_client(headers=headers, timeout=timeout, auth=auth)
        client.event_hooks["request"].append(http_log.sent)
        client.event_hooks["response"].append(http_log.answered)
        return client

    def session_created(session_id):
        callbacks.session = session_id

    try:
        async with sse_client(url, httpx_client_factory=recording_client,
                              on_session_created=session_created) as (read, write):
            async with ClientSession(
                read, write,
                elicitation_callback=callbacks.elicit,
                sampling_callback=callbacks.sample,
                list_roots_callback=callbacks.roots,
            ) as s:
                init = await s.initialize()
                out.update(protocol=init.protocolVersion, server=init.serverInfo.name, session=callbacks.session)
                for op in ops:
                    try:
                        out["results"].append(await run_op(s, callbacks, op))
                    except Exception as e:
                        out["results"].append({"error": f"{type(e).__name__}: {e}"})
                await http_log.settled()
                out["endpoint"] = http_log.first_post
        out["closed"] = True
    except BaseException as e:  # an ExceptionGroup from the transport's task group, too
        out["error"] = f"{type(e).__name__}: {e}"
    return out


async def run(argv, io):
    url, ops = argv[0], json.loads(argv[1])
    try:
        return await asyncio.wait_for(session(url, ops, io), OVERALL_TIMEOUT_S)
    except (asyncio.TimeoutError, TimeoutError):
        return {"error": "client timed out"}


if __name__ == "__main__":
    driven.by_hand(run)
