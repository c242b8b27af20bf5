"""2024-11-05 HTTP+SSE clients in front of every upstream (issue 24, the SSE-client column): a
client GETs `server.sse_path` (`/sse`), whose stream's first event, `endpoint`, names where it POSTs
its messages (`server.sse_messages_path?sessionId=<id>`, each answered 202); everything the server
says arrives on that one stream. The clients are the official 1.x SDKs — Python `mcp==1.30.0`
(`sse_client` + `ClientSession`) and TS `@modelcontextprotocol/sdk@1.32.2` (`SSEClientTransport` +
`Client`) — driven by clients/{py,ts}_sse_client.*; the upstreams are the Python and TS legacy test
servers over Streamable HTTP (there the SSE session becomes a legacy session upstream), HTTP+SSE
and stdio (there it is an upstream session of its own: an HTTP+SSE session, a child).

The contract: initialize, lists, calls, progress, and the upstream's elicitation, sampling and
roots/list requests answered by the client's own callbacks all travel over the stream; a client's
notifications/cancelled reaches the upstream tool; the session ends with its stream (the child is
stopped, the upstream session ended, the session id answers 404 from then on) and with its
upstream (a child killed mid-call fails the call and ends the session); sessions at once are each
their own; modern clients keep working on the same proxy meanwhile; a client that comes as soon as
the proxy listens is served as well as one that comes later.

Two stops make the tests wait on the clients without sleeping: `heldCall` stops a client inside
its first elicitation callback and `wait` between operations; each says a line (`HELD` /
`WAITING`, with the session id) and goes on when the test resumes it. The clients run in this
worker's client drivers (drivers.py), each with connections of its own.

The TS SDK's SSEClientTransport loses progress notifications that reach it in the same read as
the call's answer (it runs notification handlers a microtask later, the answer's at once, and the
answer removes the progress handler); it does so against the official servers directly too. So
the TS client's progress is proved on `slow_ask`, whose progress comes a whole elicitation round
before the answer; the Python client's on `progress` (every step) as well.
"""

import http.client
import json
import os
import re
import signal
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

import drivers
from conftest import UPSTREAMS, Proxy, run_ts_client
from test_modern_clients import PyClient, text_of, ts_text
from test_stdio_and_sse import children_of

CLIENTS = ["py", "ts"]
KINDS = ["py", "ts", "py-sse", "ts-sse", "py-stdio", "ts-stdio"]
# Upstreams where each SSE client has an upstream session of its own (held in the proxy's pool).
OWN = {"py-sse", "ts-sse", "py-stdio", "ts-stdio"}
# Upstreams that run one server object per session (the Python HTTP servers share one FastMCP).
SERVER_PER_SESSION = {"ts", "ts-sse", "py-stdio", "ts-stdio"}
# What each SSE client's callbacks answer.
ANSWERS = {
    "py": {"name": "Barbara", "sampled": "py-sse-sampled", "root": "file:///py-sse/root"},
    "ts": {"name": "Dennis", "sampled": "ts-sse-sampled", "root": "file:///ts-sse/root"},
}
# Both SDKs ask for their latest version, which both servers speak.
VERSION = "2025-11-25"
CLIENT_TIMEOUT_S = 60
WAIT_S = 20
# The proxy's log line once the upstream answered its first initialize (and, for an upstream URL,
# the proxy knows whether it speaks HTTP+SSE or Streamable HTTP).
READY = r"upstream answered initialize; ready"
# An unguessable session id: visible ASCII, URL-safe, at least 16 characters.
SESSION_ID = re.compile(r"^[A-Za-z0-9_\-.~]{16,}$")


class Peers:
    """The test's SSE clients, and the proxies whose log is shown when the test fails."""

    def __init__(self):
        self.clients, self.proxies = [], []

    def watch(self, proxy):
        self.proxies.append((proxy, len(proxy.proc.lines)))
        return proxy

    def start(self, kind, proxy, ops):
        """An SSE client of the `kind` SDK, run in this worker's client driver (drivers.py)."""
        runtime, script = ("py", "py_sse_client") if kind == "py" else ("node", "ts_sse_client")
        client = drivers.start(runtime, script, [sse_url(proxy), json.dumps(ops)], f"{kind} SSE client")
        self.clients.append(client)
        return client

    def run(self, kind, proxy, ops):
        return self.start(kind, proxy, ops).result()

    def close(self):
        for c in self.clients:
            c.kill()
        # pytest shows this only for a failing test.
        for c in self.clients:
            print(f"--- {c.label}\n{c.transcript()}")
        for proxy, start in self.proxies:
            print("--- proxy log from this test\n" + "\n".join(proxy.proc.lines[start:][-300:]))


@pytest.fixture
def peers():
    p = Peers()
    yield p
    p.close()


def start_upstream(kind):
    """(process or None, URL or stdio command) of the legacy server `kind`; the Python Streamable
    HTTP one prints a `REC` line per POST/DELETE it answers."""
    if kind == "py":
        return UPSTREAMS[kind]("--record")
    return UPSTREAMS[kind]()


@pytest.fixture(scope="module")
def front(request):
    """(upstream kind) → that legacy server with a proxy in front of it."""
    kind = request.param
    up, upstream = start_upstream(kind)
    proxy = Proxy(upstream, log="info")
    try:
        # Past start-up (test_an_sse_client_right_after_start_initializes covers what comes before).
        proxy.proc.wait_for(READY)
    except Exception:
        proxy.kill()
        raise
    yield {"kind": kind, "impl": kind.split("-")[0], "proxy": proxy, "up": up, "upstream": upstream}
    proxy.kill()
    if up is not None:
        up.kill()


def sse_url(proxy):
    return proxy.base + "/sse"


def ok(out, n=None):
    """`out`'s results (or result n), after checking that neither the client nor they failed."""
    assert "error" not in out, out
    results = out["results"]
    for r in results if n is None else [results[n]]:
        assert "error" not in r, out
    return results if n is None else results[n]


def post_message(proxy, query, message):
    """POSTs one JSON-RPC message to the messages path with `query`: (status, body)."""
    req = urllib.request.Request(f"{proxy.base}/messages{query}", json.dumps(message).encode(),
                                 {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read(4096).decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


PING = {"jsonrpc": "2.0", "id": 7, "method": "ping"}


def wait_until(what, check, timeout=WAIT_S):
    """Polls `check` (bounded, backing off) until it returns something truthy; returns that."""
    deadline = time.monotonic() + timeout
    pause = 0.02
    while True:
        v = check()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout} s")
        time.sleep(pause)
        pause = min(pause * 2, 0.5)


def answers_404_within(proxy, session, timeout=WAIT_S):
    """Whether a POST to `session` answers 404 within `timeout` (bounded polling), and the last
    (status, body) it got."""
    last = []

    def gone():
        last[:] = post_message(proxy, f"?sessionId={session}", PING)
        return last[0] == 404

    try:
        wait_until("404", gone, timeout=timeout)
        return True, tuple(last)
    except AssertionError:
        return False, tuple(last)


def wait_for_404(proxy, session, what):
    gone, last = answers_404_within(proxy, session)
    assert gone, f"{what} did not happen within {WAIT_S} s (last answer: {last})"


def live_children(proxy):
    return {pid for pid, state in children_of(proxy.proc.p.pid) if state != "Z"}


def sessions_metric(proxy):
    return proxy.metrics().sum("mrtr_upstream_sessions")


def recorded(up, start):
    """The Python upstream's `REC` lines from index `start` on, parsed."""
    with up.cond:
        lines = up.lines[start:]
    return [json.loads(l[4:]) for l in lines if l.startswith("REC ")]


class Stream:
    """A raw GET on the proxy's SSE path: its status, headers, and its events one by one."""

    def __init__(self, proxy):
        u = urllib.parse.urlsplit(proxy.base)
        self.conn = http.client.HTTPConnection(u.hostname, u.port, timeout=WAIT_S)
        self.conn.request("GET", "/sse", headers={"accept": "text/event-stream"})
        self.resp = self.conn.getresponse()

    def next_event(self):
        """(event name, data) of the next event; comments (keep-alives) are skipped."""
        name, data = "message", []
        for _ in range(10_000):
            line = self.resp.readline()
            if not line:
                raise AssertionError("the stream ended")
            line = line.decode().rstrip("\r\n")
            if line == "":
                if data:
                    return name, "\n".join(data)
                name = "message"
                continue
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "event":
                name = value
            elif field == "data":
                data.append(value)
        raise AssertionError("no event in 10000 lines")

    def close(self):
        self.conn.close()


both_clients = pytest.mark.parametrize("client", CLIENTS)
every_front = pytest.mark.parametrize("front", KINDS, indirect=True)


# --- the wire ------------------------------------------------------------------------------------


def raw_initialize(proxy, stream):
    """Reads the stream's first event, the endpoint, and POSTs an initialize there:
    (endpoint, POST status, POST body)."""
    name, endpoint = stream.next_event()
    assert name == "endpoint", (name, endpoint)
    init = {"jsonrpc": "2.0", "id": "init-1", "method": "initialize", "params": {
        "protocolVersion": VERSION, "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}
    return (endpoint, *post_message(proxy, "?" + endpoint.partition("?")[2], init))


@every_front
def test_the_stream_announces_the_endpoint_first_and_answers_on_message_events(front, peers):
    proxy = peers.watch(front["proxy"])
    stream = Stream(proxy)
    try:
        assert stream.resp.status == 200
        assert stream.resp.getheader("content-type", "").startswith("text/event-stream")
        endpoint, status, body = raw_initialize(proxy, stream)
        path, _, query = endpoint.partition("?")
        assert path == "/messages", endpoint
        assert SESSION_ID.match(urllib.parse.parse_qs(query)["sessionId"][0]), endpoint
        assert status == 202, (status, body)
        name, data = stream.next_event()
        answer = json.loads(data)
        assert name == "message", (name, data)
        assert answer["id"] == "init-1" and answer["result"]["protocolVersion"] == VERSION, answer
        assert answer["result"]["serverInfo"]["name"] == f"{front['impl']}-legacy-server", answer
        # A second stream is a second session.
        other = Stream(proxy)
        try:
            assert other.next_event() != ("endpoint", endpoint)
        finally:
            other.close()
    finally:
        stream.close()




@pytest.mark.parametrize("kind", KINDS)
def test_an_sse_client_right_after_start_initializes(kind, peers):
    # The proxy listens before it has found out what an upstream URL speaks (HTTP+SSE or
    # Streamable HTTP); an SSE client that comes at once must not be treated as if it knew.
    up, upstream = start_upstream(kind)
    proxy = peers.watch(Proxy(upstream, log="debug"))
    stream = Stream(proxy)
    try:
        _, status, body = raw_initialize(proxy, stream)
        assert status == 202, (status, body)
        name, data = stream.next_event()
        answer = json.loads(data)
        assert answer["id"] == "init-1" and answer["result"]["protocolVersion"] == VERSION, answer
    finally:
        stream.close()
        proxy.kill()
        if up is not None:
            up.kill()


@every_front
def test_a_post_with_an_unknown_or_no_session_id_answers_404(front, peers):
    proxy = peers.watch(front["proxy"])
    for query in ("?sessionId=AAAAAAAAAAAAAAAAAAAAAA", "?sessionId=", ""):
        status, body = post_message(proxy, query, PING)
        assert status == 404, (query, status, body)


# --- a session's life, driven by the SDK clients --------------------------------------------------


@every_front
@both_clients
def test_initialize_over_the_stream(front, client, peers):
    proxy = peers.watch(front["proxy"])
    out = peers.run(client, proxy, [{"op": "ping"}])
    assert ok(out, 0) == {}, out
    assert out["protocol"] == VERSION, out
    # The upstream's own initialize result came back over the stream.
    assert out["server"] == f"{front['impl']}-legacy-server", out
    assert SESSION_ID.match(out["session"] or ""), out
    assert out["endpoint"] == f"/messages?sessionId={out['session']}", out
    assert out["http"][0] == ["GET", 200, "/sse"], out
    posts = out["http"][1:]
    # initialize, notifications/initialized and ping, each POSTed to the endpoint and accepted.
    assert len(posts) == 3 and all(p == ["POST", 202, out["endpoint"]] for p in posts), out
    assert out.get("closed") is True, out


@every_front
@both_clients
def test_tools_list_and_a_plain_call(front, client, peers):
    proxy = peers.watch(front["proxy"])
    tools, echo = ok(peers.run(client, proxy, [
        {"op": "listTools"},
        {"op": "callTool", "name": "echo", "arguments": {"text": f"plain-{client}-sse"}},
    ]))
    assert {"echo", "progress", "ask_name", "summarize", "list_roots", "wait_forever"} <= set(tools["tools"])
    assert echo == {"text": f"plain-{client}-sse", "isError": False}


@every_front
@both_clients
def test_progress_reaches_the_clients_progress_callback(front, client, peers):
    proxy = peers.watch(front["proxy"])
    ops = [{"op": "progress", "name": "slow_ask", "arguments": {"delay_ms": 0}}]
    if client == "py":
        ops.append({"op": "progress", "name": "progress", "arguments": {"steps": 3}})
    results = ok(peers.run(client, proxy, ops))
    asked = results[0]
    assert asked["text"] == f"Hello, {ANSWERS[client]['name']}!"
    assert asked["progress"] == [1] and asked["totals"] == [2], asked
    if client == "py":
        steps = results[1]
        assert steps["text"] == "done after 3 steps"
        assert steps["progress"] == [1, 2, 3] and steps["totals"] == [3, 3, 3], steps


@every_front
@both_clients
def test_an_elicitation_is_answered_by_the_clients_callback(front, client, peers):
    proxy = peers.watch(front["proxy"])
    out = peers.run(client, proxy, [{"op": "callTool", "name": "ask_name"}])
    assert ok(out, 0)["text"] == f"Hello, {ANSWERS[client]['name']}!"
    assert out["counts"] == {"elicitation": 1, "sampling": 0, "roots": 0}, out


@every_front
@both_clients
def test_a_sampling_request_is_answered_by_the_clients_callback(front, client, peers):
    proxy = peers.watch(front["proxy"])
    out = peers.run(client, proxy, [{"op": "callTool", "name": "summarize", "arguments": {"text": "long"}}])
    assert ok(out, 0)["text"] == f"Summary: {ANSWERS[client]['sampled']}"
    assert out["counts"] == {"elicitation": 0, "sampling": 1, "roots": 0}, out


@every_front
@both_clients
def test_roots_list_is_answered_by_the_clients_callback(front, client, peers):
    # The Python server sends roots/list unrelated to the call (the GET stream over Streamable HTTP).
    proxy = peers.watch(front["proxy"])
    out = peers.run(client, proxy, [{"op": "callTool", "name": "list_roots"}])
    assert ok(out, 0)["text"] == f"Roots: {ANSWERS[client]['root']}"
    assert out["counts"] == {"elicitation": 0, "sampling": 0, "roots": 1}, out


@every_front
@both_clients
def test_elicitation_sampling_and_roots_at_once_are_each_answered(front, client, peers):
    proxy = peers.watch(front["proxy"])
    out = peers.run(client, proxy, [{"op": "callTool", "name": "everything"}])
    a = ANSWERS[client]
    assert ok(out, 0)["text"] == f"name={a['name']} sample={a['sampled']} roots={a['root']}"
    assert out["counts"] == {"elicitation": 1, "sampling": 1, "roots": 1}, out


_tags = iter(range(1_000_000))


@every_front
@both_clients
def test_a_call_the_client_cancels_is_cancelled_upstream(front, client, peers):
    # The client gives up on wait_forever and sends notifications/cancelled (TS: its AbortSignal;
    # Python 1.x: by hand). The same session then asks the upstream (the same child, over stdio)
    # whether the tool was cancelled.
    proxy = peers.watch(front["proxy"])
    tag = f"sse-{client}-{front['kind']}-{next(_tags)}"
    gave_up, asked = ok(peers.run(client, proxy, [
        {"op": "cancel", "tag": tag, "afterMs": 1500},
        {"op": "callTool", "name": "was_cancelled", "arguments": {"tag": tag}},
    ]))
    assert gave_up["gaveUp"] is True, gave_up
    assert asked["text"] == "cancelled"


@pytest.mark.parametrize("kind", KINDS)
@both_clients
def test_closing_the_stream_ends_the_session_and_what_is_behind_it(kind, client, peers):
    # A proxy of its own, so that nothing else holds upstream sessions meanwhile.
    up, upstream = start_upstream(kind)
    proxy = peers.watch(Proxy(upstream, log="info"))
    try:
        proxy.proc.wait_for(READY)
        kids_before = live_children(proxy)
        rec_start = len(up.lines) if kind == "py" else 0
        c = peers.start(client, proxy, [
            {"op": "callTool", "name": "echo", "arguments": {"text": "before the end"}},
            {"op": "wait"},
        ])
        session = c.wait_for("WAITING")["session"]
        open_sessions = sessions_metric(proxy)
        kids = live_children(proxy) - kids_before
        if kind in OWN:
            # The session holds an upstream session of its own (a place in the pool).
            assert open_sessions >= 1, open_sessions
        if kind.endswith("-stdio"):
            assert kids, "no child runs for the session"
        upstream_session = None
        if kind == "py":
            inits = [r for r in recorded(up, rec_start) if r.get("method") == "initialize" and r["status"] == 200]
            assert len(inits) == 1, inits
            upstream_session = inits[0]["session"]
        c.resume()
        out = c.result()
        assert ok(out, 0)["text"] == "before the end"
        assert out.get("closed") is True, out

        # The session is gone: its id answers 404.
        wait_for_404(proxy, session, "the closed session's id answering 404")
        # What was behind it ended too.
        if kind in OWN:
            wait_until("the upstream session's place in the pool freed",
                       lambda: sessions_metric(proxy) <= open_sessions - 1)
        if kind.endswith("-stdio"):
            wait_until(f"the session's child {sorted(kids)} ending", lambda: not (kids & live_children(proxy)))
        if kind == "py":
            wait_until("a DELETE of the upstream session", lambda: [
                r for r in recorded(up, rec_start)
                if r["http"] == "DELETE" and r["session"] == upstream_session and r["status"] == 200])

        # A new session works.
        again = peers.run(client, proxy, [{"op": "callTool", "name": "echo", "arguments": {"text": "new session"}}])
        assert ok(again, 0)["text"] == "new session"
        assert again["session"] != session
    finally:
        proxy.kill()
        if up is not None:
            up.kill()


@pytest.mark.parametrize("kind", ["py-stdio", "ts-stdio"])
@both_clients
def test_a_child_killed_mid_call_fails_the_call_and_ends_the_session(kind, client, peers):
    up, upstream = start_upstream(kind)
    proxy = peers.watch(Proxy(upstream, log="debug"))
    try:
        proxy.proc.wait_for(READY)
        kids_before = live_children(proxy)
        c = peers.start(client, proxy, [
            {"op": "heldCall", "name": "ask_name"},
            {"op": "callTool", "name": "echo", "arguments": {"text": "same session"}},
        ])
        # The call is in the session's child, waiting for the client's elicitation answer.
        session = c.wait_for("HELD")["session"]
        kids = live_children(proxy) - kids_before
        assert kids, "no child runs for the session"
        for pid in kids:
            os.kill(pid, signal.SIGKILL)
        # The session ends with its upstream: its id answers 404 while the client is still there
        # (within less than the client's own 20 s call timeout).
        ended, last = answers_404_within(proxy, session, timeout=10)
        c.resume()
        out = c.result()
        held = out["results"][0] if out.get("results") else out
        problems = []
        if not ended:
            problems.append(f"10 s after the child died, a POST on the session still answered {last}")
        # The call fails with an error from the proxy, rather than at the client's own timeout.
        if "error" not in held or "timed out" in held["error"].lower():
            problems.append(f"the held call ended with {held}")
        assert not problems, (problems, out)
        # A new session works.
        again = peers.run(client, proxy, [{"op": "callTool", "name": "echo", "arguments": {"text": "new session"}}])
        assert ok(again, 0)["text"] == "new session"
        assert again["session"] != session
    finally:
        proxy.kill()


_nonce = iter(range(1_000_000))


@every_front
@both_clients
def test_five_sessions_at_once_are_each_their_own(front, client, peers):
    # Five clients each add a tool, then all five hold an elicitation at the same time; released,
    # each lists the tools. Where the upstream runs a server per session, each sees its own tool
    # and none of the others'.
    proxy = peers.watch(front["proxy"])
    n = next(_nonce)
    names = [f"only_{client}_{n}_{i}" for i in range(5)]
    clients = [
        peers.start(client, proxy, [
            {"op": "callTool", "name": "add_tool", "arguments": {"name": name}},
            {"op": "heldCall", "name": "ask_name"},
            {"op": "listTools"},
        ])
        for name in names
    ]
    sessions = [c.wait_for("HELD")["session"] for c in clients]
    assert len(set(sessions)) == 5, sessions
    if front["kind"] in OWN:
        open_sessions = sessions_metric(proxy)
        assert open_sessions >= 5, open_sessions
    if front["kind"].endswith("-stdio"):
        kids = live_children(proxy)
        assert len(kids) >= 5, kids
    for c in clients:
        c.resume()
    for name, c in zip(names, clients):
        added, asked, listed = ok(c.result())
        assert added["text"] == f"added {name}"
        assert asked["text"] == f"Hello, {ANSWERS[client]['name']}!"
        mine = sorted(t for t in listed["tools"] if t in names)
        if front["kind"] in SERVER_PER_SESSION:
            assert mine == [name], listed
        else:
            assert name in mine, listed


@every_front
@both_clients
def test_modern_clients_pass_while_an_sse_call_is_in_flight(front, client, peers):
    proxy = peers.watch(front["proxy"])
    sse = peers.start(client, proxy, [
        {"op": "heldCall", "name": "ask_name"},
        {"op": "callTool", "name": "everything"},
    ])
    sse.wait_for("HELD")

    # The SSE session holds a call with an unanswered elicitation; modern clients go through MRTR
    # rounds meanwhile.
    async def modern(c):
        return (
            await c.call_tool("ask_name", {}),
            await c.call_tool("everything", {}),
            await c.call_tool("echo", {"text": "modern"}),
        )

    asked, everything, echo = PyClient(proxy.url).run(modern)
    assert text_of(asked) == "Hello, Ada!"
    assert text_of(everything) == "name=Ada sample=py-sampled roots=file:///py/root"
    assert text_of(echo) == "modern"
    ts_modern = run_ts_client(proxy.url, [
        {"op": "callTool", "name": "ask_name"},
        {"op": "callTool", "name": "summarize", "arguments": {"text": "x"}},
    ])
    assert "error" not in ts_modern, ts_modern
    assert [ts_text(r) for r in ts_modern["results"]] == ["Hello, Grace!", "Summary: ts-sampled"]

    sse.resume()
    held, after = ok(sse.result())
    a = ANSWERS[client]
    assert held["text"] == f"Hello, {a['name']}!"
    assert after["text"] == f"name={a['name']} sample={a['sampled']} roots={a['root']}"
