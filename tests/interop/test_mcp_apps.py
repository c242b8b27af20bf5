"""MCP Apps through the proxy (issue 38). The official example app server
(@modelcontextprotocol/server-basic-vanillajs 1.7.5: ext-apps 1.x on the legacy SDK 1.x, Streamable
HTTP on PORT) behind the proxy, for a 2026-07-28 client declaring the ui extension: the app tool's
`_meta.ui`, the `ui://` resource (byte for byte as the server answers it directly) and the call's
`structuredContent` reach it. And a legacy server that offers its app only to a client that
declared the extension (getUiCapability, tests/interop/apps/apps_legacy_server.mjs) does so through
the proxy, over Streamable HTTP and stdio: the declaration reaches its `initialize`, per request.

The peers live in tests/interop/apps/ with their own pinned package.json (tests/run.sh installs
them)."""

import json
import os
import re
import urllib.request

import pytest

from conftest import HERE, NODE, Proc, Proxy, free_port, run_ts_client, sse_messages, wait_tcp

APPS = HERE / "apps"
BASIC = APPS / "node_modules" / "@modelcontextprotocol" / "server-basic-vanillajs" / "dist"
UI = "io.modelcontextprotocol/ui"
TASKS = "io.modelcontextprotocol/tasks"
MCP_APP = "text/html;profile=mcp-app"
# What an MCP Apps host declares (the Inspector's shape), and a client that renders no app.
DECLARING = {"extensions": {UI: {"mimeTypes": [MCP_APP]}}}
PLAIN = {}
WAIT_S = 30


def post(url, body, headers):
    """POSTs `body` (a dict); the raw answer text (JSON, or the data of the SSE answer) and the
    response headers."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={
        "content-type": "application/json", "accept": "application/json, text/event-stream", **headers})
    with urllib.request.urlopen(req, timeout=WAIT_S) as r:
        ctype, raw = r.headers.get("content-type", ""), r.read().decode()
        sid = r.headers.get("mcp-session-id")
    if ctype.startswith("text/event-stream"):
        datas = [l[5:].lstrip(" ") for l in raw.replace("\r\n", "\n").split("\n") if l.startswith("data:")]
        raw = next(d for d in datas if d.strip() and json.loads(d).get("id") == body.get("id"))
    return raw, sid


def modern(proxy, rpc_id, method, params, caps):
    """A 2026-07-28 request through the proxy, as raw HTTP: its answer's raw text."""
    body = {"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": {**params, "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": caps,
        "io.modelcontextprotocol/clientInfo": {"name": "apps-test", "version": "1"}}}}
    headers = {"mcp-protocol-version": "2026-07-28", "mcp-method": method}
    target = params.get("name") or params.get("uri")
    if target:
        headers["mcp-name"] = target
    return post(proxy.url, body, headers)[0]


def direct(url, method, params, caps):
    """`method` asked of the legacy server directly, after an `initialize` declaring `caps`: the
    raw text of its answer."""
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": caps, "clientInfo": {"name": "direct", "version": "1"}}}
    headers = {"mcp-protocol-version": "2025-11-25"}
    _, sid = post(url, init, headers)
    if sid:
        headers["mcp-session-id"] = sid
    return post(url, {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, headers)[0]


def raw_member(text, key):
    """The raw JSON text of member `key` (its first occurrence) in `text`, byte for byte."""
    at = text.index(json.dumps(key) + ":") + len(json.dumps(key)) + 1
    _, end = json.JSONDecoder().raw_decode(text, at)
    return text[at:end]


@pytest.fixture(scope="module")
def basic():
    """The official example app server (its own entry point, listening on PORT; bound to
    loopback by a preload) and the proxy in front of it."""
    port = free_port()
    server = Proc([NODE, "--import", "./loopback.mjs", str(BASIC / "index.js")],
                  env={**os.environ, "PORT": str(port)}, cwd=str(APPS))
    wait_tcp(port, server)
    url = f"http://127.0.0.1:{port}/mcp"
    proxy = Proxy(url)
    yield url, proxy
    proxy.kill()
    server.kill()


def test_the_example_app_reaches_a_modern_host_as_the_server_gives_it(basic):
    url, proxy = basic
    uri = "ui://get-time/mcp-app.html"
    out = run_ts_client(proxy.url, [
        {"op": "listTools"}, {"op": "readResource", "uri": uri}, {"op": "callTool", "name": "get-time"},
    ], DECLARING)
    assert "results" in out, out
    listed, read, called = out["results"]
    [tool] = [t for t in listed["tools"] if t["name"] == "get-time"]
    assert tool["_meta"]["ui"]["resourceUri"] == uri, tool
    direct_tools = json.loads(direct(url, "tools/list", {}, DECLARING))["result"]["tools"]
    [direct_tool] = [t for t in direct_tools if t["name"] == "get-time"]
    assert tool["_meta"] == direct_tool["_meta"]
    html = (BASIC / "mcp-app.html").read_text()
    assert read["contents"][0]["text"] == html
    assert read["contents"][0]["mimeType"] == MCP_APP
    time = called["structuredContent"]["time"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z", time), called
    assert called["content"][0]["text"] == time
    # The resource byte for byte: the contents the proxy relays are the server's own text.
    through = modern(proxy, 7, "resources/read", {"uri": uri}, DECLARING)
    straight = direct(url, "resources/read", {"uri": uri}, DECLARING)
    assert raw_member(through, "contents") == raw_member(straight, "contents")
    assert json.loads(through)["result"]["resultType"] == "complete"


def apps_http():
    server = Proc([NODE, str(APPS / "apps_legacy_server.mjs")], cwd=str(APPS))
    port = server.wait_for(r"READY (\d+)").group(1)
    return server, f"http://127.0.0.1:{port}/mcp"


def apps_stdio():
    return None, [NODE, str(APPS / "apps_legacy_server.mjs"), "--stdio"]


@pytest.fixture(scope="module", params=["http", "stdio"])
def gated(request):
    """The getUiCapability-gated legacy server on each transport, behind the proxy."""
    server, upstream = {"http": apps_http, "stdio": apps_stdio}[request.param]()
    proxy = Proxy(upstream)
    yield proxy
    proxy.kill()
    if server is not None:
        server.kill()


def weather_of(out):
    listed, called = out["results"][-2:]
    [tool] = [t for t in listed["tools"] if t["name"] == "weather"]
    return tool, called


def test_the_app_is_offered_to_a_declaring_client_and_not_to_another(gated):
    ops = [{"op": "listTools"}, {"op": "callTool", "name": "weather"}]
    # Alternated, on pooled sessions: each request gets a session that declared what it did.
    for caps in [DECLARING, PLAIN, DECLARING, PLAIN]:
        out = run_ts_client(gated.url, ops, caps)
        assert "results" in out, out
        tool, called = weather_of(out)
        if caps is DECLARING:
            assert tool["_meta"]["ui"]["resourceUri"] == "ui://weather/app.html", tool
            assert called["structuredContent"] == {"city": "Lisbon", "sky": "sunny", "celsius": 21}
        else:
            assert "ui" not in (tool.get("_meta") or {}), tool
            assert "structuredContent" not in called, called
            assert called["content"][0]["text"] == "Sunny in Lisbon, 21 °C"


def test_discover_keeps_the_servers_ui_extension_beside_the_tasks_extension(gated):
    out = run_ts_client(gated.url, [{"op": "discover"}, {"op": "readResource", "uri": "ui://weather/app.html"}],
                        DECLARING)
    assert "results" in out, out
    discovered, read = out["results"]
    assert set(discovered["capabilities"]["extensions"]) == {UI, TASKS}, discovered
    assert read["contents"][0]["mimeType"] == MCP_APP
    assert read["contents"][0]["text"].startswith("<!doctype html>")
