"""The TypeScript SDK server asking for input *not* tied to the call (no relatedRequestId): the SDK
sends it on the session's GET stream. Behind the proxy that must still become an input_required
round, both when the upstream answers POSTs with SSE and when it runs in JSON-response mode
(enableJsonResponse), where the call's response headers only come once the tool is done.
"""

import pytest

from conftest import run_ts_client
from test_modern_clients import PyClient, text_of, ts_text


@pytest.mark.parametrize("stack", ["ts", "ts-json"], indirect=True)
def test_standalone_elicitation_on_the_get_stream_is_a_round(stack):
    client = PyClient(stack["proxy"].url)
    r = client.run(lambda c: c.call_tool("ask_name_standalone", {}))
    assert text_of(r) == "Hello, Ada!"
    assert client.counts["elicitation"] == 1
    out = run_ts_client(stack["proxy"].url, [{"op": "callTool", "name": "ask_name_standalone"}])
    assert ts_text(out["results"][0]) == "Hello, Grace!"
    assert out["counts"]["elicitation"] == 1


@pytest.mark.parametrize("stack", ["ts-json"], indirect=True)
def test_json_mode_upstream_serves_plain_traffic(stack):
    client = PyClient(stack["proxy"].url)
    assert text_of(client.run(lambda c: c.call_tool("echo", {"text": "json"}))) == "json"
    names = {t.name for t in client.run(lambda c: c.list_tools()).tools}
    assert "ask_name_standalone" in names
    out = run_ts_client(stack["proxy"].url, [{"op": "callTool", "name": "echo", "arguments": {"text": "json-ts"}}])
    assert ts_text(out["results"][0]) == "json-ts"
