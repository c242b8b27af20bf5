"""What only the stream-carried transports have: a stdio server runs as the proxy's children (one
session each), and an HTTP+SSE server is found from its /sse URL alone. The modern-client suites
(test_modern_clients, test_listen, test_logging, test_cancellation) already run on both; these
tests cover what those cannot see.
"""

import asyncio
import itertools
import json
import os
import re
import urllib.request

from conftest import Proxy, py_stdio_command, start_py_sse_upstream, start_ts_sse_upstream
from test_cancellation import abandon_wait_forever
from test_modern_clients import PyClient, text_of

_tags = (f"stdio-{n}" for n in itertools.count())


def children_of(pid):
    """Live (non-zombie) child pids of `pid`, from /proc."""
    kids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # Fields after the parenthesised command: state, ppid, ...
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == pid:
            kids.append((int(entry), state))
    return kids


def test_abandoning_a_call_on_a_stdio_child_cancels_its_tool():
    # Each stdio child is a session of its own, so the next call cannot ask the cancelled one;
    # the child says so on stderr, which the proxy logs (at info) as `upstream: …`.
    _, command = py_stdio_command()
    proxy = Proxy(command, log="info")
    try:
        tag = next(_tags)
        # The call must reach its tool before the client gives up (after 2 s), and on a busy
        # machine a Python child takes longer than that to start: a first call starts the child
        # that the next one, of the same principal and capabilities, finds warm in the pool.
        warm = PyClient(proxy.url).run(lambda c: c.call_tool("echo", {"text": "warm"}))
        assert text_of(warm) == "warm"
        assert abandon_wait_forever(proxy.url, tag) == "gave up"
        proxy.proc.wait_for(rf"upstream: CANCELLED {tag}\b", timeout=20)
    finally:
        proxy.kill()


def test_concurrent_calls_run_on_children_of_their_own_and_none_is_left_behind():
    _, command = py_stdio_command()
    proxy = Proxy(command)
    try:
        async def go(c):
            return await asyncio.gather(*[c.call_tool("twice", {}) for _ in range(4)])

        client = PyClient(proxy.url)
        assert [text_of(r) for r in client.run(go)] == ["Ada and Ada"] * 4
        assert client.counts["elicitation"] == 8
        kids = children_of(proxy.proc.p.pid)
        # Four calls parked at once needed four children; they stay warm, none is a zombie.
        assert len(kids) >= 4, kids
        assert all(state != "Z" for _, state in kids), kids
        pids = [pid for pid, _ in kids]
    finally:
        proxy.proc.p.terminate()
        proxy.proc.p.wait(timeout=30)
    # The proxy stopped its children when it shut down.
    assert [p for p in pids if os.path.exists(f"/proc/{p}")] == []


def test_an_sse_url_is_detected_and_said_so():
    for start in (start_py_sse_upstream, start_ts_sse_upstream):
        up, url = start()
        proxy = Proxy(url, log="info")
        try:
            r = PyClient(proxy.url).run(lambda c: c.call_tool("ask_name", {}))
            assert text_of(r) == "Hello, Ada!"
            proxy.proc.wait_for(r"the upstream speaks HTTP\+SSE \(detected\)")
        finally:
            proxy.kill()
            up.kill()


def test_a_legacy_initialize_in_front_of_a_stdio_server_opens_a_session_of_its_own():
    """The raw answer: the upstream's InitializeResult for the version asked, under an
    Mcp-Session-Id the proxy issued (the full legacy matrix is test_legacy_matrix.py)."""
    _, command = py_stdio_command()
    proxy = Proxy(command)
    try:
        body = b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"old","version":"1"}}}'
        req = urllib.request.Request(proxy.url, body, {"content-type": "application/json", "accept": "application/json, text/event-stream"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            session = resp.headers["mcp-session-id"]
            answer = json.loads(resp.read())
        assert session and len(session) >= 16, session
        assert answer["id"] == 1 and answer["result"]["protocolVersion"] == "2025-06-18", answer
        assert answer["result"]["serverInfo"]["name"], answer
    finally:
        proxy.kill()
