"""`subscriptions/listen` with the official modern clients: a tool that registers a tool makes the
legacy server notify `tools/list_changed` on the session of the call (not the listen stream's own
upstream session); the listen stream must still deliver it, tagged, and the client's own listen
machinery must accept it.
"""

import asyncio
import itertools

import pytest
from mcp.client.subscriptions import ToolsListChanged

from conftest import TRANSPORTS, run_ts_client
from test_modern_clients import PyClient, text_of

# Tool names are global on the Python server: each test adds a fresh one.
_names = (f"added_{n}" for n in itertools.count())

pytestmark = pytest.mark.parametrize("stack", TRANSPORTS, indirect=True)


def test_py_client_listen_gets_the_list_change_of_a_call(stack):
    name = next(_names)

    async def go(c):
        async with c.listen(tools_list_changed=True) as sub:
            assert sub.honored.tools_list_changed
            called = await c.call_tool("add_tool", {"name": name})
            event = await asyncio.wait_for(sub.__anext__(), timeout=20)
        return called, event

    called, event = PyClient(stack["proxy"].url).run(go)
    assert text_of(called) == f"added {name}"
    assert isinstance(event, ToolsListChanged)
    if stack["kind"] == "py":
        # FastMCP keeps one tool list for all sessions: a fresh list shows the new tool.
        names = {t.name for t in PyClient(stack["proxy"].url).run(lambda c: c.list_tools()).tools}
        assert name in names


def test_ts_client_listen_gets_the_list_change_of_a_call(stack):
    name = next(_names)
    out = run_ts_client(
        stack["proxy"].url,
        [{
            "op": "listen",
            "filter": {"toolsListChanged": True},
            "call": {"name": "add_tool", "arguments": {"name": name}},
            "wait": "notifications/tools/list_changed",
        }],
    )
    assert "error" not in out, out
    r = out["results"][0]
    assert r["honored"].get("toolsListChanged") is True
    assert r["call"]["content"][0]["text"] == f"added {name}"
    assert r["event"]["method"] == "notifications/tools/list_changed"
