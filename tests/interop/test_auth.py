"""An upstream that requires a bearer token (the Python SDK's own resource-server auth). The token
the modern client sends reaches the upstream; a refusal reaches the client as the upstream's 401
with its WWW-Authenticate challenge, and the protected-resource metadata it points to is served
through the proxy, so an OAuth-capable client can log in.
"""

import asyncio
import json
import urllib.error
import urllib.request

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import ElicitResult

pytestmark = pytest.mark.parametrize("stack", ["py-auth"], indirect=True)


def call_whoami(url, token):
    async def elicit(ctx, params):
        return ElicitResult(action="accept", content={"name": "Ada"})

    async def go():
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with httpx2.AsyncClient(headers=headers) as http:
            transport = streamable_http_client(url, http_client=http)
            async with Client(transport, mode="2026-07-28", elicitation_callback=elicit) as c:
                return await asyncio.wait_for(c.call_tool("whoami", {}), timeout=60)

    return asyncio.run(go())


def test_an_authenticated_client_completes_a_round(stack):
    r = call_whoami(stack["proxy"].url, "good-token")
    assert r.content[0].text == "hello Ada"


@pytest.mark.parametrize("token", [None, "bad-token"])
def test_a_refused_client_sees_the_upstream_401(stack, token):
    with pytest.raises(BaseException) as raised:
        call_whoami(stack["proxy"].url, token)
    assert "401" in repr(raised.value)


def test_the_challenge_and_its_metadata_come_through(stack):
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {}}}}
    req = urllib.request.Request(stack["proxy"].url, data=json.dumps(body).encode(), method="POST", headers={
        "content-type": "application/json", "accept": "application/json, text/event-stream",
        "mcp-protocol-version": "2026-07-28", "mcp-method": "tools/list"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=10)
    assert refused.value.code == 401
    challenge = refused.value.headers["www-authenticate"]
    assert "resource_metadata=" in challenge
    meta_url = stack["proxy"].base + "/.well-known/oauth-protected-resource/mcp"
    meta = json.loads(urllib.request.urlopen(meta_url, timeout=10).read())
    assert meta["authorization_servers"] == ["https://auth.example/"]
    ready = urllib.request.urlopen(stack["proxy"].base + "/readyz", timeout=10)
    assert ready.status == 200
