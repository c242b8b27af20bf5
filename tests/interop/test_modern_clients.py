"""Modern clients (official SDKs, pinned to 2026-07-28, no legacy fallback) in front of the proxy,
legacy servers (official SDKs) behind it, on each legacy transport: Streamable HTTP, HTTP+SSE
(detected from the /sse URL alone) and stdio (the proxy runs the server as its child). The clients complete MRTR rounds through their own
auto-retry loops; every assertion checks that the values the client callbacks returned reached the
upstream tool and came back in the final result.
"""

import asyncio

import pytest
from mcp import Client
from mcp.types import (
    CreateMessageResult,
    ElicitResult,
    ListRootsResult,
    Root,
    TextContent,
)

from conftest import TRANSPORTS, run_ts_client

ALL_CAPS = {"elicitation": {"form": {}}, "sampling": {}, "roots": {}}


class PyClient:
    """mcp==2.3.0 Client with callbacks that return fixed values and count their calls."""

    def __init__(self, url, elicitation=True, sampling=True, roots=True, mode="2026-07-28"):
        self.url = url
        self.mode = mode
        self.counts = {"elicitation": 0, "sampling": 0, "roots": 0}
        self.kwargs = {}
        if elicitation:
            self.kwargs["elicitation_callback"] = self._elicit
        if sampling:
            self.kwargs["sampling_callback"] = self._sample
        if roots:
            self.kwargs["list_roots_callback"] = self._roots

    async def _elicit(self, ctx, params):
        self.counts["elicitation"] += 1
        return ElicitResult(action="accept", content={"name": "Ada"})

    async def _sample(self, ctx, params):
        self.counts["sampling"] += 1
        return CreateMessageResult(role="assistant", content=TextContent(type="text", text="py-sampled"), model="py-model")

    async def _roots(self, ctx):
        self.counts["roots"] += 1
        return ListRootsResult(roots=[Root(uri="file:///py/root", name="py")])

    def run(self, fn):
        async def go():
            async with Client(self.url, mode=self.mode, **self.kwargs) as c:
                return await asyncio.wait_for(fn(c), timeout=60)

        return asyncio.run(go())


def text_of(result):
    return result.content[0].text


def ts_text(result):
    return result["content"][0]["text"]


pytestmark = pytest.mark.parametrize("stack", TRANSPORTS, indirect=True)


# --- discovery and plain traffic -------------------------------------------------------------


def test_py_discover_lists_2026_and_upstream_capabilities(stack):
    raw = PyClient(stack["proxy"].url).run(lambda c: c.session.send_discover("2026-07-28"))
    assert "2026-07-28" in raw["supportedVersions"]
    assert raw["resultType"] == "complete"
    assert "tools" in raw["capabilities"]
    assert raw["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == f"{stack['impl']}-legacy-server"
    assert raw["cacheScope"] == "private" and raw["ttlMs"] == 0


def test_py_auto_mode_negotiates_modern_not_legacy(stack):
    version = PyClient(stack["proxy"].url, mode="auto").run(lambda c: asyncio.sleep(0, c.protocol_version))
    assert version == "2026-07-28"


def test_ts_discover_pinned(stack):
    out = run_ts_client(stack["proxy"].url, [{"op": "discover"}])
    assert "error" not in out, out
    assert out["results"][0]["version"] == "2026-07-28"
    assert out["results"][0]["server"]["name"] == f"{stack['impl']}-legacy-server"


def test_tools_list_both_clients(stack):
    names = PyClient(stack["proxy"].url).run(lambda c: c.list_tools())
    assert {"echo", "ask_name", "everything"} <= {t.name for t in names.tools}
    out = run_ts_client(stack["proxy"].url, [{"op": "listTools"}])
    assert {"echo", "ask_name"} <= {t["name"] for t in out["results"][0]["tools"]}
    assert out["results"][0]["cacheScope"] == "private"


def test_plain_call_both_clients(stack):
    r = PyClient(stack["proxy"].url).run(lambda c: c.call_tool("echo", {"text": "plain"}))
    assert text_of(r) == "plain"
    out = run_ts_client(stack["proxy"].url, [{"op": "callTool", "name": "echo", "arguments": {"text": "plain-ts"}}])
    assert ts_text(out["results"][0]) == "plain-ts"


def test_call_with_progress_both_clients(stack):
    seen = []

    async def go(c):
        async def on_progress(progress, total, message):
            seen.append(progress)

        return await c.call_tool("progress", {"steps": 3}, progress_callback=on_progress)

    r = PyClient(stack["proxy"].url).run(go)
    assert text_of(r) == "done after 3 steps"
    assert seen == [1, 2, 3]
    out = run_ts_client(stack["proxy"].url, [{"op": "progress", "name": "progress", "arguments": {"steps": 2}}])
    assert [p["progress"] for p in out["results"][0]["progress"]] == [1, 2]


def test_plain_prompt_and_resource(stack):
    async def go(c):
        return await c.get_prompt("plain_prompt", {"topic": "otters"}), await c.read_resource("data://motd")

    p, r = PyClient(stack["proxy"].url).run(go)
    assert "otters" in p.messages[0].content.text
    assert r.contents[0].text == "Have a nice day"


# --- MRTR rounds -------------------------------------------------------------------------------


def test_elicit_once(stack):
    client = PyClient(stack["proxy"].url)
    assert text_of(client.run(lambda c: c.call_tool("ask_name", {}))) == "Hello, Ada!"
    assert client.counts["elicitation"] == 1
    out = run_ts_client(stack["proxy"].url, [{"op": "callTool", "name": "ask_name"}])
    assert ts_text(out["results"][0]) == "Hello, Grace!"
    assert out["counts"]["elicitation"] == 1


class DecliningClient(PyClient):
    async def _elicit(self, ctx, params):
        self.counts["elicitation"] += 1
        return ElicitResult(action="decline")


def test_a_declined_elicitation_reaches_the_tool(stack):
    client = DecliningClient(stack["proxy"].url)
    assert text_of(client.run(lambda c: c.call_tool("ask_name", {}))) == "Hello, <decline>!"
    assert client.counts["elicitation"] == 1


def test_sample(stack):
    client = PyClient(stack["proxy"].url)
    assert text_of(client.run(lambda c: c.call_tool("summarize", {"text": "long"}))) == "Summary: py-sampled"
    out = run_ts_client(stack["proxy"].url, [{"op": "callTool", "name": "summarize", "arguments": {"text": "long"}}])
    assert ts_text(out["results"][0]) == "Summary: ts-sampled"


def test_list_roots(stack):
    client = PyClient(stack["proxy"].url)
    assert text_of(client.run(lambda c: c.call_tool("list_roots", {}))) == "Roots: file:///py/root"
    out = run_ts_client(stack["proxy"].url, [{"op": "callTool", "name": "list_roots"}])
    assert ts_text(out["results"][0]) == "Roots: file:///ts/root"


def test_concurrent_elicit_sample_roots_is_one_round_with_three_keys(stack):
    proxy = stack["proxy"]
    before = proxy.metrics()
    client = PyClient(proxy.url)
    r = client.run(lambda c: c.call_tool("everything", {}))
    assert text_of(r) == "name=Ada sample=py-sampled roots=file:///py/root"
    after = proxy.metrics()
    assert after["mrtr_rounds_total"] - before["mrtr_rounds_total"] == 1
    assert after["mrtr_input_requests_total"] - before["mrtr_input_requests_total"] == 3
    out = run_ts_client(proxy.url, [{"op": "callTool", "name": "everything"}])
    assert ts_text(out["results"][0]) == "name=Grace sample=ts-sampled roots=file:///ts/root"


def test_concurrent_calls_from_one_client_each_get_their_own_rounds(stack):
    # Several calls in flight at once, each asking on its call stream or (Python roots) the GET
    # stream: every request must be attributed to its own call.
    async def go(c):
        return await asyncio.gather(
            c.call_tool("list_roots", {}),
            c.call_tool("ask_name", {}),
            c.call_tool("summarize", {"text": "a"}),
            c.call_tool("list_roots", {}),
            c.call_tool("twice", {}),
        )

    client = PyClient(stack["proxy"].url)
    results = [text_of(r) for r in client.run(go)]
    assert results == [
        "Roots: file:///py/root",
        "Hello, Ada!",
        "Summary: py-sampled",
        "Roots: file:///py/root",
        "Ada and Ada",
    ]
    assert client.counts == {"elicitation": 3, "sampling": 1, "roots": 2}


def test_elicit_twice_is_two_rounds(stack):
    proxy = stack["proxy"]
    before = proxy.metrics()
    client = PyClient(proxy.url)
    assert text_of(client.run(lambda c: c.call_tool("twice", {}))) == "Ada and Ada"
    assert client.counts["elicitation"] == 2
    assert proxy.metrics()["mrtr_rounds_total"] - before["mrtr_rounds_total"] == 2
    out = run_ts_client(proxy.url, [{"op": "callTool", "name": "twice"}])
    assert ts_text(out["results"][0]) == "Grace and Grace"


def test_adaptive_follows_declared_capabilities(stack):
    with_elicitation = PyClient(stack["proxy"].url)
    assert text_of(with_elicitation.run(lambda c: c.call_tool("adaptive", {}))) == "elicited Ada"
    sampling_only = PyClient(stack["proxy"].url, elicitation=False, roots=False)
    assert text_of(sampling_only.run(lambda c: c.call_tool("adaptive", {}))) == "sampled py-sampled"
    assert sampling_only.counts == {"elicitation": 0, "sampling": 1, "roots": 0}
    out = run_ts_client(stack["proxy"].url, [{"op": "callTool", "name": "adaptive"}], {"sampling": {}})
    assert ts_text(out["results"][0]) == "sampled ts-sampled"


def test_prompt_that_elicits(stack):
    p = PyClient(stack["proxy"].url).run(lambda c: c.get_prompt("greeting", {}))
    assert p.messages[0].content.text == "Please greet Ada."
    out = run_ts_client(stack["proxy"].url, [{"op": "getPrompt", "name": "greeting"}])
    assert out["results"][0]["messages"][0]["content"]["text"] == "Please greet Grace."


def test_resource_read_that_elicits(stack):
    r = PyClient(stack["proxy"].url).run(lambda c: c.read_resource("data://secret/x"))
    assert r.contents[0].text == "secret of x for Ada"
    out = run_ts_client(stack["proxy"].url, [{"op": "readResource", "uri": "data://secret/y"}])
    assert out["results"][0]["contents"][0]["text"] == "secret of y for Grace"
