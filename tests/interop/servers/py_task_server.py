"""A legacy (2025-11-25) MCP server on the official Python SDK (mcp==1.30.0) whose tools must run
as tasks, using the SDK's experimental tasks support (low-level `Server.experimental.enable_tasks()`,
`ctx.experimental.run_task()`, `ServerTaskContext.elicit()`).

Tools (all `execution: {"taskSupport": "required"}`):
- `task_ask` (no args): elicits a name ("Who approves?", form {name: string}) and returns
  "Approved by <name>". As the 2025-11-25 design has it, the SDK queues the `elicitation/create`
  (with `_meta["io.modelcontextprotocol/related-task"]`) and delivers it only on the SSE stream of
  a `tasks/result` request for the task; the answer is POSTed as an ordinary JSON-RPC response.
- `task_slow` (`ms`: int): sleeps `ms`, returns "slept <ms>".
- `task_fail` (no args): the task fails ("the disk is full"); `tasks/result` then answers with no
  content, and `tasks/get` says `failed` with that message.
Calling either without `params.task` gives JSON-RPC error -32601.

Binds 127.0.0.1:0 and prints `READY <port>` once listening (Streamable HTTP at `/mcp`); with
`--stdio` it speaks on stdin/stdout instead.

Three deviations from the stock SDK wiring, all to keep the fixture usable, not to change the
protocol:
- The SDK's `call_tool` decorator turns any exception, including the McpError raised by
  `validate_task_mode`, into a `CallToolResult` with `isError: true`; the spec wants -32601. So
  the task-mode check runs in a wrapper around the registered handler, where McpError becomes a
  JSON-RPC error.
- `TaskSupport` keeps one task group in a single field that every session's `Server.run()`
  overwrites and clears on exit, so with several sessions a task can land in (and outlive, or be
  refused by) another session's group. Here one process-wide task group holds all task work.
- `tasks/cancel` only marks the task cancelled in the store; the work keeps running, and when it
  ends `run_task` tries to complete the (terminal) task, which raises inside the task group. Each
  task's work here watches the store and stops when its task turns terminal or disappears (ttl).
"""

import contextlib
import sys
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import mcp.types as types
from mcp.server.experimental.task_context import ServerTaskContext
from mcp.server.lowlevel import Server
from mcp.shared.experimental.tasks.helpers import is_terminal

from serve import serve

# `Server.experimental` is deprecated in 1.30 (tasks left the spec after 2025-11-25); we want it.
warnings.filterwarnings("ignore", message="The experimental tasks API is deprecated")

server = Server("py-task-server", instructions="Python legacy task test server")
support = server.experimental.enable_tasks()

REQUIRED = types.ToolExecution(taskSupport=types.TASK_REQUIRED)
TOOLS = {
    t.name: t
    for t in [
        types.Tool(
            name="task_ask",
            description="As a task: elicits who approves, then reports it.",
            inputSchema={"type": "object", "properties": {}},
            execution=REQUIRED,
        ),
        types.Tool(
            name="task_slow",
            description="As a task: sleeps `ms` milliseconds.",
            inputSchema={"type": "object", "properties": {"ms": {"type": "integer"}}, "required": ["ms"]},
            execution=REQUIRED,
        ),
        types.Tool(
            name="task_fail",
            description="As a task: fails.",
            inputSchema={"type": "object", "properties": {}},
            execution=REQUIRED,
        ),
    ]
}


def text(s: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=s)])


async def ask(task: ServerTaskContext) -> types.CallToolResult:
    r = await task.elicit(
        message="Who approves?",
        requestedSchema={"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    )
    if r.action == "accept" and r.content:
        return text(f"Approved by {r.content.get('name')}")
    return text(f"Not approved ({r.action})")


def slow(ms: int) -> Callable[[ServerTaskContext], Awaitable[types.CallToolResult]]:
    async def work(task: ServerTaskContext) -> types.CallToolResult:
        await anyio.sleep(ms / 1000)
        return text(f"slept {ms}")

    return work


async def fail(task: ServerTaskContext) -> types.CallToolResult:
    raise RuntimeError("the disk is full")


def stoppable(work: Callable[[ServerTaskContext], Awaitable[types.CallToolResult]]):
    """Runs `work`, stopping it once the store says its task is terminal (cancelled) or gone."""

    async def run(task: ServerTaskContext) -> types.CallToolResult:
        result: types.CallToolResult | None = None
        error: Exception | None = None
        stopped = False
        async with anyio.create_task_group() as tg:

            async def watch() -> None:
                while True:
                    await anyio.sleep(0.05)
                    now = await support.store.get_task(task.task_id)
                    if now is None or is_terminal(now.status):
                        # run_task completes the task unless its cached copy is terminal.
                        cached = now or task.task.model_copy(update={"status": types.TASK_STATUS_CANCELLED})
                        task._ctx._task = cached  # pyright: ignore[reportPrivateUsage]
                        print(f"STOPPED {task.task_id} {cached.status}", file=sys.stderr, flush=True)
                        nonlocal stopped
                        stopped = True
                        tg.cancel_scope.cancel()
                        return

            async def do() -> None:
                nonlocal result, error
                try:
                    result = await work(task)
                except Exception as e:  # re-raised below, unwrapped, so the task fails with its message
                    error = e
                finally:
                    tg.cancel_scope.cancel()

            tg.start_soon(watch)
            tg.start_soon(do)
        if error is not None and not stopped:
            raise error
        return result or text("stopped")

    return run


@server.list_tools()
async def list_tools() -> list[types.Tool]:
    return list(TOOLS.values())


@server.call_tool()
async def call_tool(name: str, arguments: dict[str, Any]) -> types.CallToolResult | types.CreateTaskResult:
    ctx = server.request_context
    if name == "task_ask":
        return await ctx.experimental.run_task(stoppable(ask))
    if name == "task_fail":
        return await ctx.experimental.run_task(stoppable(fail))
    if name == "task_slow":
        return await ctx.experimental.run_task(stoppable(slow(int(arguments["ms"]))))
    return types.CallToolResult(content=[types.TextContent(type="text", text=f"Unknown tool: {name}")], isError=True)


_sdk_call_tool = server.request_handlers[types.CallToolRequest]


async def call_tool_checked(req: types.CallToolRequest) -> types.ServerResult:
    tool = TOOLS.get(req.params.name)
    if tool is not None:
        # Raises McpError(-32601) when `task` is missing, which _handle_request sends as an error.
        server.request_context.experimental.validate_for_tool(tool)
    return await _sdk_call_tool(req)


server.request_handlers[types.CallToolRequest] = call_tool_checked

# One task group for all task work, set by whoever runs the server (see the module docstring).
support.run = lambda: contextlib.nullcontext()  # type: ignore[method-assign]


@contextlib.asynccontextmanager
async def task_group() -> AsyncIterator[None]:
    async with anyio.create_task_group() as tg:
        support._task_group = tg  # pyright: ignore[reportPrivateUsage]
        try:
            yield
        finally:
            tg.cancel_scope.cancel()


def http_app(port: int):
    from mcp.server.fastmcp.server import StreamableHTTPASGIApp
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from mcp.server.transport_security import TransportSecuritySettings
    from starlette.applications import Starlette
    from starlette.routing import Route

    manager = StreamableHTTPSessionManager(
        app=server,
        # What FastMCP sets up for a server on 127.0.0.1.
        security_settings=TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
            allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
        ),
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with task_group(), manager.run():
            yield

    return Starlette(routes=[Route("/mcp", endpoint=StreamableHTTPASGIApp(manager))], lifespan=lifespan)


async def run_stdio() -> None:
    from mcp.server.stdio import stdio_server

    async with task_group(), stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    if "--stdio" in sys.argv[1:]:
        anyio.run(run_stdio)
    else:
        serve(http_app)
