"""The proxy's logs, at debug and as JSON, while a real client completes a round through it with a
credential and a user answer: the answer, the credential and the requestState never appear; the
request span carries its method, outcome and round."""

import asyncio
import json

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import ElicitResult

from conftest import Proxy, start_py_upstream
from test_modern_clients import text_of

ANSWER = "Zelda-7731"
CREDENTIAL = "Bearer log-secret-9911"


def call_with_credential(url):
    async def elicit(ctx, params):
        return ElicitResult(action="accept", content={"name": ANSWER})

    async def go():
        async with httpx2.AsyncClient(headers={"Authorization": CREDENTIAL}) as http:
            transport = streamable_http_client(url, http_client=http)
            async with Client(transport, mode="2026-07-28", elicitation_callback=elicit) as c:
                return await asyncio.wait_for(c.call_tool("ask_name", {}), timeout=60)

    return asyncio.run(go())


def test_debug_logs_carry_the_request_span_but_no_answer_credential_or_token(tmp_path):
    cfg = tmp_path / "proxy.toml"
    cfg.write_text('[log]\nformat = "json"\n[state]\ngather_window = "250ms"\n')
    up, url = start_py_upstream()
    proxy = Proxy(url, config=cfg, log="debug,hyper=info,h2=info,hyper_util=info")
    try:
        r = call_with_credential(proxy.url)
        assert text_of(r) == f"Hello, {ANSWER}!"
        proxy.proc.p.terminate()
        proxy.proc.p.wait(30)
        out = proxy.proc.output()
        for secret in (ANSWER, "log-secret-9911", "eyJ"):
            assert secret not in out, f"{secret} in the logs:\n{out}"
        spans = [json.loads(l)["span"] for l in out.splitlines() if l.startswith("{") and '"span"' in l]
        rounds = [s for s in spans if s.get("rpc.method") == "tools/call" and s.get("outcome") == "input_required"]
        assert rounds and rounds[0]["round"] == 1, out
        assert any(s.get("outcome") == "complete" and s.get("rpc.method") == "tools/call" for s in spans), out
    finally:
        proxy.kill()
        up.kill()
