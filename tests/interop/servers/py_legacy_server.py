"""A legacy (2025-11-25) MCP server on the official Python SDK (mcp==1.30.0, FastMCP).

Its tools ask for input mid-call the way deployed servers do: elicitation and sampling inline on
the call's SSE stream, roots/list on the session's GET stream. Binds 127.0.0.1:0 and prints
`READY <port>` once listening. With `--record`, it also prints one `REC {json}` line per HTTP
request it answers (method, JSON-RPC kind and method or answered action, status, session id), so
that tests can assert what reached the upstream and that the upstream acknowledged it. With
`--sse` it serves the HTTP+SSE transport instead (GET `/sse`), and with `--stdio` it speaks on
stdin/stdout. With `--call-log PATH` (or `MRTR_TEST_CALL_LOG=PATH`; a stdio child of the proxy
gets a clean environment, so it needs the flag), it appends one JSON line to PATH for each
tools/call it runs, before running it: the tool, its arguments, and, when an HTTP request carried
the call (Streamable HTTP, or the POST of HTTP+SSE), that request's `Authorization` and
`x-mcp-subject` headers (null when absent); so tests can read what the upstream ran, and with
which credentials, on every transport.
"""

import asyncio
import json
import os
import sys

from mcp.server.fastmcp import Context, FastMCP
from mcp.shared.exceptions import UrlElicitationRequiredError
from mcp.types import ElicitRequestURLParams, SamplingMessage, TextContent, ToolAnnotations
from pydantic import BaseModel

from serve import serve

# Where each tools/call run is written (`--call-log`, or the environment); None: nowhere.
CALL_LOG = os.environ.get("MRTR_TEST_CALL_LOG") or None


class RecordingFastMCP(FastMCP):
    """FastMCP, writing each tools/call it runs to CALL_LOG first (when set)."""

    async def call_tool(self, name, arguments):
        if CALL_LOG:
            record_call(CALL_LOG, name, arguments, self.get_context().request_context.request)
        return await super().call_tool(name, arguments)


def record_call(path, name, arguments, request):
    """Appends the call's line, in one write (several stdio children may share the file)."""
    headers = request.headers if request is not None else {}
    line = {"tool": name, "arguments": arguments, "pid": os.getpid(), "http": request is not None,
            "authorization": headers.get("authorization"), "subject": headers.get("x-mcp-subject")}
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


mcp = RecordingFastMCP("py-legacy-server", instructions="Python legacy test server")


class Name(BaseModel):
    name: str


async def ask_for_name(ctx: Context, message: str) -> str:
    r = await ctx.elicit(message, schema=Name)
    return r.data.name if r.action == "accept" else f"<{r.action}>"


async def sample(ctx: Context, text: str) -> str:
    r = await ctx.session.create_message(
        messages=[SamplingMessage(role="user", content=TextContent(type="text", text=f"Summarize: {text}"))],
        max_tokens=100,
        related_request_id=ctx.request_id,
    )
    return r.content.text if isinstance(r.content, TextContent) else str(r.content)


async def roots(ctx: Context) -> str:
    r = await ctx.session.list_roots()
    return ", ".join(str(x.uri) for x in r.roots)


@mcp.tool()
async def echo(text: str) -> str:
    """Echoes text."""
    return text


@mcp.tool()
async def add_tool(name: str, ctx: Context) -> str:
    """Registers a new tool and notifies the change (on the calling session only, as FastMCP does)."""

    async def added() -> str:
        return f"I am {name}"

    mcp.add_tool(added, name=name, description="Added at run time")
    await ctx.session.send_tool_list_changed()
    return f"added {name}"


@mcp.tool()
async def url_sign_in(ctx: Context) -> str:
    """Sends the user to a URL (URL-mode elicitation inline), then reports completion."""
    r = await ctx.elicit_url("Please sign in", url="https://example.com/sign-in", elicitation_id="sign-in-1")
    if r.action == "accept":
        await ctx.session.send_elicit_complete("sign-in-1")
    return f"sign-in: {r.action}"


_authorized: set[str] = set()


@mcp.tool()
async def needs_authorization(account: str) -> str:
    """Fails with -32042 (URL elicitation required) until asked a second time for the account."""
    if account not in _authorized:
        _authorized.add(account)
        raise UrlElicitationRequiredError([
            ElicitRequestURLParams(
                mode="url",
                message=f"Authorize access to {account}",
                url=f"https://example.com/authorize?account={account}",
                elicitationId=f"auth-{account}",
            )
        ])
    return f"authorized {account}"


_cancelled: dict[str, asyncio.Event] = {}


def _cancel_event(tag: str) -> asyncio.Event:
    return _cancelled.setdefault(tag, asyncio.Event())


@mcp.tool()
async def wait_forever(tag: str) -> str:
    """Never finishes on its own; records being cancelled (notifications/cancelled) under `tag`."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        _cancel_event(tag).set()
        # On stderr, which a proxy running this server over stdio logs (the next call would
        # reach another child, which cannot know).
        print(f"CANCELLED {tag}", file=sys.stderr, flush=True)
        raise
    return "woke up"


@mcp.tool()
async def was_cancelled(tag: str) -> str:
    """Waits (at most 20 s) for `wait_forever(tag)` to be cancelled; says whether it was."""
    try:
        await asyncio.wait_for(_cancel_event(tag).wait(), timeout=20)
        return "cancelled"
    except asyncio.TimeoutError:
        return "not cancelled"


@mcp.tool()
async def chatty(ctx: Context) -> str:
    """Logs one message at each of debug, info and warning on the call's stream."""
    await ctx.debug("debug line")
    await ctx.info("info line")
    await ctx.warning("warning line")
    return "said three things"


@mcp.tool()
async def progress(steps: int, ctx: Context) -> str:
    """Reports progress."""
    for i in range(1, steps + 1):
        await ctx.report_progress(i, steps)
    return f"done after {steps} steps"


@mcp.tool()
async def ask_name(ctx: Context) -> str:
    """Elicits a name once."""
    return f"Hello, {await ask_for_name(ctx, 'What is your name?')}!"


@mcp.tool()
async def summarize(text: str, ctx: Context) -> str:
    """Samples a summary."""
    return f"Summary: {await sample(ctx, text)}"


@mcp.tool()
async def list_roots(ctx: Context) -> str:
    """Lists the client's roots (Python sends roots/list on the GET stream)."""
    return f"Roots: {await roots(ctx)}"


@mcp.tool()
async def everything(ctx: Context) -> str:
    """Elicits, samples and lists roots concurrently."""
    n, s, r = await asyncio.gather(ask_for_name(ctx, "Name?"), sample(ctx, "everything"), roots(ctx))
    return f"name={n} sample={s} roots={r}"


@mcp.tool()
async def twice(ctx: Context) -> str:
    """Elicits twice in sequence."""
    a = await ask_for_name(ctx, "First name?")
    b = await ask_for_name(ctx, "Second name?")
    return f"{a} and {b}"


@mcp.tool(annotations=ToolAnnotations(readOnlyHint=True))
async def twice_read_only(ctx: Context) -> str:
    """Elicits twice in sequence; annotated read-only, so the proxy may replay it."""
    a = await ask_for_name(ctx, "First name?")
    b = await ask_for_name(ctx, "Second name?")
    return f"{a} and {b}, read-only"


@mcp.tool()
async def adaptive(ctx: Context) -> str:
    """Elicits when the client declared elicitation, samples otherwise."""
    caps = ctx.session.client_params.capabilities if ctx.session.client_params else None
    if caps is not None and caps.elicitation is not None:
        return f"elicited {await ask_for_name(ctx, 'Name?')}"
    return f"sampled {await sample(ctx, 'adaptive')}"


@mcp.tool()
async def slow_ask(delay_ms: int, ctx: Context) -> str:
    """Works `delay_ms`, reports progress with a message, elicits a name, works again, greets."""
    await asyncio.sleep(delay_ms / 1000)
    await ctx.report_progress(1, 2, "Asking for a name")
    name = await ask_for_name(ctx, "What is your name?")
    await asyncio.sleep(delay_ms / 1000)
    return f"Hello, {name}!"


@mcp.tool()
async def slow_twice(delay_ms: int, ctx: Context) -> str:
    """Works `delay_ms` before each of two elicitations in sequence."""
    await asyncio.sleep(delay_ms / 1000)
    a = await ask_for_name(ctx, "First name?")
    await asyncio.sleep(delay_ms / 1000)
    b = await ask_for_name(ctx, "Second name?")
    return f"{a} and {b}"


@mcp.tool()
async def slow_everything(delay_ms: int, ctx: Context) -> str:
    """Works `delay_ms`, then elicits and samples concurrently."""
    await asyncio.sleep(delay_ms / 1000)
    n, s = await asyncio.gather(ask_for_name(ctx, "Name?"), sample(ctx, "everything"))
    return f"name={n} sample={s}"


@mcp.tool()
async def ask_then_slow(delay_ms: int, ctx: Context) -> str:
    """Elicits at once, then works `delay_ms` and elicits again."""
    a = await ask_for_name(ctx, "First name?")
    await asyncio.sleep(delay_ms / 1000)
    b = await ask_for_name(ctx, "Second name?")
    return f"{a} and {b}"


@mcp.prompt()
async def greeting(ctx: Context) -> str:
    """Asks who to greet."""
    return f"Please greet {await ask_for_name(ctx, 'Who should be greeted?')}."


@mcp.prompt()
def plain_prompt(topic: str) -> str:
    """A prompt that needs no input."""
    return f"Tell me about {topic}."


@mcp.resource("data://motd")
def motd() -> str:
    """A plain resource."""
    return "Have a nice day"


@mcp.resource("data://secret/{who}")
async def secret(who: str, ctx: Context) -> str:
    """A resource whose read elicits."""
    return f"secret of {who} for {await ask_for_name(ctx, 'Who is asking?')}"


class Recorder:
    """ASGI middleware printing a `REC` line when each POST or DELETE is answered."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in ("POST", "DELETE"):
            return await self.app(scope, receive, send)
        body = bytearray()
        headers = {k.decode().lower(): v.decode() for k, v in scope.get("headers", [])}

        async def rx():
            msg = await receive()
            if msg["type"] == "http.request":
                body.extend(msg.get("body", b""))
            return msg

        async def tx(msg):
            if msg["type"] == "http.response.start":
                out = {k.decode().lower(): v.decode() for k, v in msg.get("headers", [])}
                rec = {"http": scope["method"], "status": msg["status"],
                       "session": headers.get("mcp-session-id") or out.get("mcp-session-id")}
                rec.update(describe(bytes(body)))
                print("REC " + json.dumps(rec), flush=True)
            await send(msg)

        await self.app(scope, rx, tx)


def describe(body):
    try:
        m = json.loads(body) if body else None
    except ValueError:
        return {"kind": "unparsable"}
    if not isinstance(m, dict):
        return {}
    if "method" in m:
        return {"kind": "request" if "id" in m else "notification", "method": m["method"]}
    result = m.get("result")
    action = result.get("action") if isinstance(result, dict) else None
    return {"kind": "response", "id": m.get("id"), "action": action, "error": "error" in m}


if __name__ == "__main__":
    args = sys.argv[1:]
    record = "--record" in args
    if "--call-log" in args:
        CALL_LOG = args[args.index("--call-log") + 1]
    if "--stdio" in args:
        # One process is one session, on stdin/stdout; nothing to bind.
        mcp.run(transport="stdio")
    elif "--sse" in args:
        # The deprecated HTTP+SSE transport: GET /sse, POST /messages/?session_id=...
        serve(lambda port: mcp.sse_app())
    else:
        serve(lambda port: Recorder(mcp.streamable_http_app()) if record else mcp.streamable_http_app())
