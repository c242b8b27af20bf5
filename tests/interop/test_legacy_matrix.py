"""Legacy Streamable HTTP clients (2025-06-18 / 2025-11-25: `initialize` + `Mcp-Session-Id`) in
front of stdio and HTTP+SSE upstreams (issue 24, part 1). The clients are the official 1.x SDKs —
Python `mcp==1.30.0` (`streamable_http_client` + `ClientSession`) and TS
`@modelcontextprotocol/sdk@1.32.2` (`StreamableHTTPClientTransport` + `Client`) — driven by
clients/{py,ts}_legacy_matrix_client.*; the upstreams are the Python and TS legacy test servers,
each over stdio (the proxy's children) and HTTP+SSE.

The contract: the proxy answers `initialize` with a session id of its own; each session is an
upstream session of its own (one stdio child, or one HTTP+SSE session); the upstream's requests
reach the client (inline on the request's SSE response or on its GET stream) and its answers go
back; DELETE ends the session, after which, as for any unknown id, the proxy answers 404; an
upstream that dies ends the session the same way. Modern clients keep working on the same proxy
meanwhile.

Two client operations let a test and its clients wait on each other without sleeping: `heldCall`
stops the client inside its first elicitation callback and `wait` stops it between operations; each
says a line (`HELD` / `WAITING`, with its session id) and goes on when the test resumes it. The
clients run in this worker's client drivers (drivers.py), each with connections of its own.
"""

import json
import os
import re
import signal
import time
import urllib.error
import urllib.request

import pytest

import drivers
from conftest import UPSTREAMS, Proxy, run_ts_client
from test_modern_clients import PyClient, text_of, ts_text
from test_stdio_and_sse import children_of

CLIENTS = ["py", "ts"]
FRONTS = ["py-stdio", "ts-stdio", "py-sse", "ts-sse"]
# What each legacy client's callbacks answer.
ANSWERS = {
    "py": {"name": "Linus", "sampled": "py-legacy-sampled", "root": "file:///py-legacy/root"},
    "ts": {"name": "Ken", "sampled": "ts-legacy-sampled", "root": "file:///ts-legacy/root"},
}
CLIENT_TIMEOUT_S = 60
# A session id is visible ASCII (2025-06-18 basic/transports, "Session Management"); an unguessable
# one is longer than this.
SESSION_ID = re.compile(r"^[\x21-\x7e]{16,}$")


class Peers:
    """The test's legacy clients and the proxies whose log it shows when the test fails."""

    def __init__(self):
        self.clients = []
        self.proxies = []

    def watch(self, proxy):
        self.proxies.append((proxy, len(proxy.proc.lines)))
        return proxy

    def start(self, kind, url, ops, options=None):
        """A legacy client of the `kind` SDK, run in this worker's client driver (drivers.py)."""
        runtime, script = ("py", "py_legacy_matrix_client") if kind == "py" else ("node", "ts_legacy_matrix_client")
        client = drivers.start(runtime, script, [url, json.dumps(ops), json.dumps(options or {})],
                               f"{kind} legacy client")
        self.clients.append(client)
        return client

    def run(self, kind, url, ops, options=None):
        return self.start(kind, url, ops, options).result()

    def close(self):
        for client in self.clients:
            client.kill()
        # Printed output is shown only for a failing test: the clients' and the proxies' side.
        for client in self.clients:
            print(f"--- {client.label}\n{client.transcript()}")
        for proxy, start in self.proxies:
            print("--- proxy log from this test\n" + "\n".join(proxy.proc.lines[start:][-200:]))


@pytest.fixture
def peers():
    p = Peers()
    yield p
    p.close()


@pytest.fixture(scope="module")
def front(request):
    """(upstream kind) → that legacy server over stdio or HTTP+SSE with a proxy in front of it."""
    kind = request.param
    up, upstream = UPSTREAMS[kind]()
    proxy = Proxy(upstream, log="info")
    yield {"kind": kind, "impl": kind.split("-")[0], "proxy": proxy}
    proxy.kill()
    if up is not None:
        up.kill()


def ok(out, n=None):
    """`out`'s results (or result n), after checking that the client and those results raised nothing."""
    assert "error" not in out, out
    results = out["results"]
    for r in results if n is None else [results[n]]:
        assert "error" not in r, out
    return results if n is None else results[n]


def post_with_session(url, session_id):
    """A legacy `tools/list` POST carrying `session_id`: (status, body)."""
    body = json.dumps({"jsonrpc": "2.0", "id": 99, "method": "tools/list", "params": {}}).encode()
    req = urllib.request.Request(url, body, {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-session-id": session_id,
        "mcp-protocol-version": "2025-11-25",
    })
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read(4096).decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def live_children(proxy):
    return [pid for pid, state in children_of(proxy.proc.p.pid) if state != "Z"]


def wait_until_dead(pids, timeout=10):
    """Waits (bounded) until every pid is a zombie or gone: SIGKILL is delivered asynchronously."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                        alive.append(pid)
            except OSError:
                pass
        if not alive:
            return
        time.sleep(0.02)
    raise AssertionError(f"children {pids} survived SIGKILL")


def stdio_command(kind):
    _, command = UPSTREAMS[kind]()
    return command


both_clients = pytest.mark.parametrize("client", CLIENTS)
every_front = pytest.mark.parametrize("front", FRONTS, indirect=True)


# --- the session's life ---------------------------------------------------------------------


@every_front
@both_clients
@pytest.mark.parametrize("version", ["2025-11-25", "2025-06-18"])
def test_initialize_negotiates_the_version_asked_and_issues_a_session_id(front, client, version, peers):
    proxy = peers.watch(front["proxy"])
    # A call after it carries the negotiated version in MCP-Protocol-Version.
    out = peers.run(client, proxy.url, [{"op": "callTool", "name": "echo", "arguments": {"text": version}}],
                    {"version": version})
    assert ok(out, 0)["text"] == version
    assert out["protocol"] == version, out
    # The upstream's own initialize result came back (its serverInfo), under the proxy's session.
    assert out["server"] == f"{front['impl']}-legacy-server", out
    assert SESSION_ID.match(out["session"] or ""), out
    assert out["http"][0] == ["POST", 200], out


@every_front
@both_clients
def test_tools_list_and_a_plain_call(front, client, peers):
    proxy = peers.watch(front["proxy"])
    tools, echo = ok(peers.run(client, proxy.url, [
        {"op": "listTools"},
        {"op": "callTool", "name": "echo", "arguments": {"text": f"plain-{client}"}},
    ]))
    assert {"echo", "progress", "ask_name", "summarize", "list_roots", "wait_forever"} <= set(tools["tools"])
    assert echo == {"text": f"plain-{client}", "isError": False}


@every_front
@both_clients
def test_progress_reaches_the_clients_progress_callback(front, client, peers):
    proxy = peers.watch(front["proxy"])
    r = ok(peers.run(client, proxy.url, [{"op": "progress", "name": "progress", "arguments": {"steps": 3}}]), 0)
    assert r["text"] == "done after 3 steps"
    assert r["progress"] == [1, 2, 3] and r["totals"] == [3, 3, 3], r


@every_front
@both_clients
def test_an_elicitation_is_answered_by_the_clients_callback(front, client, peers):
    proxy = peers.watch(front["proxy"])
    out = peers.run(client, proxy.url, [{"op": "callTool", "name": "ask_name"}])
    assert ok(out, 0)["text"] == f"Hello, {ANSWERS[client]['name']}!"
    assert out["counts"] == {"elicitation": 1, "sampling": 0, "roots": 0}, out


@every_front
@both_clients
def test_a_sampling_request_is_answered_by_the_clients_callback(front, client, peers):
    proxy = peers.watch(front["proxy"])
    out = peers.run(client, proxy.url, [{"op": "callTool", "name": "summarize", "arguments": {"text": "long"}}])
    assert ok(out, 0)["text"] == f"Summary: {ANSWERS[client]['sampled']}"
    assert out["counts"] == {"elicitation": 0, "sampling": 1, "roots": 0}, out


@every_front
@both_clients
def test_roots_list_is_answered_by_the_clients_callback(front, client, peers):
    # The Python server sends roots/list unrelated to the call (the GET stream over HTTP).
    proxy = peers.watch(front["proxy"])
    out = peers.run(client, proxy.url, [{"op": "callTool", "name": "list_roots"}])
    assert ok(out, 0)["text"] == f"Roots: {ANSWERS[client]['root']}"
    assert out["counts"] == {"elicitation": 0, "sampling": 0, "roots": 1}, out


@every_front
@both_clients
def test_elicitation_sampling_and_roots_at_once_are_each_answered(front, client, peers):
    proxy = peers.watch(front["proxy"])
    out = peers.run(client, proxy.url, [{"op": "callTool", "name": "everything"}])
    a = ANSWERS[client]
    assert ok(out, 0)["text"] == f"name={a['name']} sample={a['sampled']} roots={a['root']}"
    assert out["counts"] == {"elicitation": 1, "sampling": 1, "roots": 1}, out


@every_front
@both_clients
def test_concurrent_calls_on_one_session_all_complete(front, client, peers):
    # Several calls in flight on one session, three of them asking the client something: every
    # server request reaches the client and every answer gets back to the call that asked.
    proxy = peers.watch(front["proxy"])
    out = peers.run(client, proxy.url, [{"op": "concurrent", "ops": [
        {"op": "callTool", "name": "ask_name"},
        {"op": "callTool", "name": "summarize", "arguments": {"text": "a"}},
        {"op": "callTool", "name": "list_roots"},
        {"op": "callTool", "name": "echo", "arguments": {"text": "meanwhile"}},
    ]}])
    a = ANSWERS[client]
    assert [r.get("text") for r in ok(out, 0)["results"]] == [
        f"Hello, {a['name']}!", f"Summary: {a['sampled']}", f"Roots: {a['root']}", "meanwhile",
    ], out
    assert out["counts"] == {"elicitation": 1, "sampling": 1, "roots": 1}, out


@every_front
@both_clients
def test_progress_of_one_of_several_concurrent_calls_reaches_its_callback(front, client, peers):
    # Progress carries the call's progressToken; the clients drop progress that arrives after
    # their call's result, so it must come before it (on the call's own stream, or the GET stream).
    proxy = peers.watch(front["proxy"])
    out = peers.run(client, proxy.url, [{"op": "concurrent", "ops": [
        {"op": "callTool", "name": "everything"},
        {"op": "progress", "name": "progress", "arguments": {"steps": 2}},
    ]}])
    _, progressed = ok(out, 0)["results"]
    assert progressed["text"] == "done after 2 steps", out
    assert progressed["progress"] == [1, 2], out


_tags = iter(range(1_000_000))


@every_front
@both_clients
def test_a_call_the_client_cancels_is_cancelled_upstream(front, client, peers):
    # The client gives up on wait_forever after 2 s and sends notifications/cancelled (TS: its
    # AbortSignal; Python 1.x: by hand, as it never sends one itself). The same session then asks
    # the upstream (the same child, over stdio) whether the tool was cancelled.
    proxy = peers.watch(front["proxy"])
    tag = f"legacy-{client}-{front['kind']}-{next(_tags)}"
    gave_up, asked = ok(peers.run(client, proxy.url, [
        {"op": "cancel", "tag": tag, "afterMs": 2000},
        {"op": "callTool", "name": "was_cancelled", "arguments": {"tag": tag}},
    ]))
    assert gave_up["gaveUp"] is True, gave_up
    assert asked["text"] == "cancelled"


@every_front
@both_clients
def test_closing_the_session_deletes_it_and_its_id_then_answers_404(front, client, peers):
    proxy = peers.watch(front["proxy"])
    out = peers.run(client, proxy.url, [{"op": "callTool", "name": "echo", "arguments": {"text": "bye"}}])
    assert ok(out, 0)["text"] == "bye"
    assert out.get("closed") is True and "deleteError" not in out, out
    method, status = out["http"][-1]
    assert method == "DELETE" and status in (200, 204), out
    status, body = post_with_session(proxy.url, out["session"])
    assert status == 404, (status, body)


@every_front
def test_an_unknown_session_id_answers_404(front, peers):
    proxy = peers.watch(front["proxy"])
    status, body = post_with_session(proxy.url, "0123456789abcdef0123456789abcdef")
    assert status == 404, (status, body)


# --- sessions are upstream sessions of their own ----------------------------------------------


@pytest.mark.parametrize("kind", ["py-stdio", "ts-stdio", "ts-sse"])
@both_clients
def test_five_concurrent_sessions_each_have_an_upstream_session_of_their_own(kind, client, peers):
    # add_tool changes the server it runs in: the Python stdio server is one per process, the TS
    # server one per process over stdio and one per session over HTTP+SSE (the Python HTTP+SSE
    # server shares one among its sessions, so it cannot show this). Each client adds a tool,
    # all five wait until every one has, then each lists: it sees its own tool and none of the
    # others'.
    up, upstream = UPSTREAMS[kind]()
    proxy = peers.watch(Proxy(upstream, log="info"))
    try:
        clients = [
            peers.start(client, proxy.url, [
                {"op": "callTool", "name": "add_tool", "arguments": {"name": f"only_{i}"}},
                {"op": "wait"},
                {"op": "listTools"},
            ])
            for i in range(5)
        ]
        sessions = [c.wait_for("WAITING")["session"] for c in clients]
        assert len(set(sessions)) == 5, sessions
        if kind.endswith("-stdio"):
            # All five are open at once, so five children run (a warm one may be there as well).
            kids = live_children(proxy)
            assert len(kids) >= 5, kids
        for c in clients:
            c.resume()
        for i, c in enumerate(clients):
            added, _, listed = ok(c.result())
            assert added["text"] == f"added only_{i}"
            assert sorted(t for t in listed["tools"] if t.startswith("only_")) == [f"only_{i}"], listed
    finally:
        proxy.kill()
        if up is not None:
            up.kill()


@pytest.mark.parametrize("kind", ["py-stdio", "ts-stdio"])
@both_clients
def test_a_child_killed_mid_call_fails_the_call_and_ends_the_session(kind, client, peers):
    proxy = peers.watch(Proxy(stdio_command(kind), log="info"))
    try:
        c = peers.start(client, proxy.url, [
            {"op": "heldCall", "name": "ask_name"},
            {"op": "callTool", "name": "echo", "arguments": {"text": "same session"}},
        ])
        # The call is in the child, waiting for the client's elicitation answer.
        session = c.wait_for("HELD")["session"]
        kids = live_children(proxy)
        assert kids, "the proxy runs no child"
        for pid in kids:
            os.kill(pid, signal.SIGKILL)
        wait_until_dead(kids)
        c.resume()
        out = c.result()
        assert "error" not in out, out
        held, after = out["results"]
        # The call fails with an error, rather than hanging until the client's own 20 s timeout.
        assert "error" in held and "timed out" not in held["error"].lower(), out
        # The session is over: the client's next request on it is refused with 404 (which Python
        # reports as "Session terminated", TS as a StreamableHTTPError with the status as code).
        assert "error" in after, out
        if client == "py":
            assert "Session terminated" in after["error"], out
        else:
            assert after.get("code") == 404, out
        status, body = post_with_session(proxy.url, session)
        assert status == 404, (status, body)
        # A new session works.
        again = peers.run(client, proxy.url, [{"op": "callTool", "name": "echo", "arguments": {"text": "new session"}}])
        assert ok(again, 0)["text"] == "new session"
        assert again["session"] != session
    finally:
        proxy.kill()


# --- modern clients on the same proxy at the same time ------------------------------------------


@every_front
@both_clients
def test_modern_clients_pass_while_a_legacy_call_is_in_flight(front, client, peers):
    proxy = peers.watch(front["proxy"])
    legacy = peers.start(client, proxy.url, [
        {"op": "heldCall", "name": "ask_name"},
        {"op": "callTool", "name": "everything"},
    ])
    legacy.wait_for("HELD")

    # The legacy session holds a call with an unanswered elicitation; modern clients go through
    # MRTR rounds meanwhile.
    async def modern(c):
        return (
            await c.call_tool("ask_name", {}),
            await c.call_tool("everything", {}),
            await c.call_tool("echo", {"text": "modern"}),
        )

    py_modern = PyClient(proxy.url)
    asked, everything, echo = py_modern.run(modern)
    assert text_of(asked) == "Hello, Ada!"
    assert text_of(everything) == "name=Ada sample=py-sampled roots=file:///py/root"
    assert text_of(echo) == "modern"
    ts_modern = run_ts_client(proxy.url, [{"op": "callTool", "name": "ask_name"}, {"op": "callTool", "name": "summarize", "arguments": {"text": "x"}}])
    assert "error" not in ts_modern, ts_modern
    assert [ts_text(r) for r in ts_modern["results"]] == ["Hello, Grace!", "Summary: ts-sampled"]

    legacy.resume()
    held, after = ok(legacy.result())
    a = ANSWERS[client]
    assert held["text"] == f"Hello, {a['name']}!"
    assert after["text"] == f"name={a['name']} sample={a['sampled']} roots={a['root']}"
