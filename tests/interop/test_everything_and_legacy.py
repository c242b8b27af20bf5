"""server-everything (the reference legacy server) behind the proxy, and a legacy client (Python
mcp==1.30.0) passing straight through it."""

import asyncio
import json
import subprocess

import pytest
from mcp.client.subscriptions import ResourceUpdated

from conftest import HERE, PY_LEGACY, run_ts_client
from test_modern_clients import PyClient


@pytest.mark.parametrize("stack", ["everything"], indirect=True)
class TestServerEverything:
    def test_listen_gets_the_resource_updates_sent_to_the_calling_session(self, stack):
        # server-everything sends "your" updates to the session that called the toggle tool, for
        # the resources *that* session subscribed to: calls must borrow the listen stream's session.
        uri = "demo://resource/static/document/architecture.md"

        async def go(c):
            async with c.listen(resource_subscriptions=[uri]) as sub:
                assert uri in (sub.honored.resource_subscriptions or [])
                await c.call_tool("toggle-subscriber-updates", {})
                return await asyncio.wait_for(sub.__anext__(), timeout=20)

        event = PyClient(stack["proxy"].url).run(go)
        assert isinstance(event, ResourceUpdated)
        assert event.uri == uri

    def test_discover_and_tools(self, stack):
        raw = PyClient(stack["proxy"].url).run(lambda c: c.session.send_discover("2026-07-28"))
        assert "2026-07-28" in raw["supportedVersions"]
        tools = PyClient(stack["proxy"].url).run(lambda c: c.list_tools())
        names = {t.name for t in tools.tools}
        assert {"echo", "trigger-elicitation-request", "trigger-sampling-request"} <= names

    def test_plain_echo(self, stack):
        r = PyClient(stack["proxy"].url).run(lambda c: c.call_tool("echo", {"message": "hi"}))
        assert "hi" in r.content[0].text

    def test_progress_prompt_and_resource(self, stack):
        seen = []

        async def go(c):
            async def on_progress(progress, total, message):
                seen.append(progress)

            r = await c.call_tool("trigger-long-running-operation", {"duration": 0.3, "steps": 3}, progress_callback=on_progress)
            p = await c.get_prompt("simple-prompt", {})
            resources = await c.list_resources()
            first = resources.resources[0]
            read = await c.read_resource(first.uri)
            return r, p, first, read

        r, p, first, read = PyClient(stack["proxy"].url).run(go)
        assert "completed" in r.content[0].text.lower()
        assert seen == [1, 2, 3]
        assert p.messages and p.messages[0].content.text
        assert str(read.contents[0].uri) == str(first.uri)

    def test_elicitation_tool(self, stack):
        client = PyClient(stack["proxy"].url)
        r = client.run(lambda c: c.call_tool("trigger-elicitation-request", {}))
        assert client.counts["elicitation"] == 1
        assert "Ada" in json.dumps([c.model_dump() for c in r.content])
        out = run_ts_client(stack["proxy"].url, [{"op": "callTool", "name": "trigger-elicitation-request"}])
        assert "Grace" in json.dumps(out["results"][0]), out

    @pytest.mark.parametrize("error_path", [False, True])
    def test_url_elicitation_tool(self, stack, error_path):
        # errorPath: the server answers -32042 first (a round, then the proxy re-issues the call on
        # the same session, which the server recognises), then asks inline: two rounds in all.
        args = {"url": "https://example.com/flow", "errorPath": error_path}
        client = PyClient(stack["proxy"].url)
        r = client.run(lambda c: c.call_tool("trigger-url-elicitation", args))
        assert "completed" in r.content[0].text, r
        assert client.counts["elicitation"] == (2 if error_path else 1)
        caps = {"elicitation": {"form": {}, "url": {}}}
        out = run_ts_client(stack["proxy"].url, [{"op": "callTool", "name": "trigger-url-elicitation", "arguments": args}], caps)
        assert "completed" in json.dumps(out["results"][0]), out
        assert out["counts"]["elicitation"] == (2 if error_path else 1)

    def test_sampling_tool(self, stack):
        client = PyClient(stack["proxy"].url)
        r = client.run(lambda c: c.call_tool("trigger-sampling-request", {"prompt": "hello", "maxTokens": 10}))
        assert "py-sampled" in r.content[0].text
        out = run_ts_client(stack["proxy"].url, [{"op": "callTool", "name": "trigger-sampling-request", "arguments": {"prompt": "x"}}])
        assert "ts-sampled" in json.dumps(out["results"][0]), out


@pytest.mark.parametrize("stack", ["py", "ts"], indirect=True)
def test_legacy_client_passes_through_including_elicitation(stack):
    out = subprocess.run(
        [str(PY_LEGACY), str(HERE / "clients" / "py_legacy_client.py"), stack["proxy"].url],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["protocol"] in ("2025-11-25", "2025-06-18")
    assert "ask_name" in result["tools"]
    assert result["echo"] == "legacy-hi"
    assert result["ask_name"] == "Hello, Linus!"
    m = stack["proxy"].metrics()
    assert m.sum("mrtr_requests_total", era="legacy", outcome="relayed") > 0
    assert m.sum("mrtr_relayed_bytes_total", direction="to_client") > 0
