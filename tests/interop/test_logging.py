"""Request-scoped log messages (deprecated, still functional in 2026-07-28): relayed only when the
request opted in with `io.modelcontextprotocol/logLevel`, and only at or above that level. The real
Python server logs at debug, info and warning during one call."""

import asyncio

import pytest
from mcp import Client

from test_modern_clients import text_of

pytestmark = pytest.mark.parametrize("stack", ["py", "py-sse", "py-stdio"], indirect=True)


def run_chatty(url, **kwargs):
    got = []

    async def on_log(params):
        got.append((params.level, params.data))

    async def go():
        async with Client(url, mode="2026-07-28", logging_callback=on_log, **kwargs) as c:
            return await asyncio.wait_for(c.call_tool("chatty", {}), timeout=60)

    return asyncio.run(go()), got


def test_messages_at_or_above_the_requested_level_are_relayed(stack):
    r, got = run_chatty(stack["proxy"].url, log_level="info")
    assert text_of(r) == "said three things"
    assert got == [("info", "info line"), ("warning", "warning line")]


def test_no_messages_without_a_log_level(stack):
    r, got = run_chatty(stack["proxy"].url)
    assert text_of(r) == "said three things"
    assert got == []
