"""SIGTERM to the real binary with a call parked, a real Python (mcp 1.30.0) upstream behind it and
the official Python modern client (pinned to 2026-07-28) in front. Every assertion about what the
upstream received is made on the upstream's side, from the `REC` lines its recording middleware
prints when it answers a request: a 202 there is the upstream acknowledging the message.
"""

import asyncio
import json
import signal
import threading
import time
import urllib.error
import urllib.request

from mcp.types import ElicitResult

from conftest import Proxy, start_py_upstream
from test_modern_clients import PyClient, text_of

EXIT_TIMEOUT_S = 30


def write_config(tmp_path, grace):
    path = tmp_path / "proxy.toml"
    path.write_text(f'[server]\nshutdown_grace = "{grace}"\n[state]\ngather_window = "250ms"\n')
    return path


def records(upstream):
    return [json.loads(l[4:]) for l in upstream.output().splitlines() if l.startswith("REC ")]


def status(url):
    try:
        return urllib.request.urlopen(url, timeout=5).status
    except urllib.error.HTTPError as e:
        return e.code


def assert_every_session_deleted(recs):
    sessions = {r["session"] for r in recs if r.get("method") == "initialize" and r["status"] == 200}
    # A 404 counts: the upstream had already ended the session itself, so nothing is left open
    # there (seen under load with mcp 1.30, with this proxy's earlier builds too).
    deleted = {r["session"] for r in recs if r["http"] == "DELETE" and (200 <= r["status"] < 300 or r["status"] == 404)}
    assert sessions, recs
    assert sessions <= deleted, f"sessions never DELETEd: {sessions - deleted} {[r for r in recs if r['session'] in sessions - deleted]}"


class SignalOnElicit(PyClient):
    """Sends SIGTERM to the proxy from inside the elicitation callback (the call is parked then),
    and answers only once `answer_when` says so."""

    def __init__(self, proxy, answer_when):
        super().__init__(proxy.url)
        self.proxy = proxy
        self.answer_when = answer_when
        self.parked = threading.Event()

    async def _elicit(self, ctx, params):
        self.counts["elicitation"] += 1
        self.parked.set()
        self.proxy.proc.p.send_signal(signal.SIGTERM)
        await asyncio.to_thread(self.answer_when)
        return ElicitResult(action="accept", content={"name": "Ada"})


def test_sigterm_cancels_a_call_still_parked_after_the_grace_then_deletes_every_session(tmp_path):
    up, url = start_py_upstream("--record")
    proxy = Proxy(url, config=write_config(tmp_path, "1s"))
    try:
        # The client answers only after the proxy is gone: the call stays parked through the grace.
        client = SignalOnElicit(proxy, lambda: proxy.proc.p.wait(EXIT_TIMEOUT_S))
        outcome = {}

        def call():
            try:
                outcome["result"] = client.run(lambda c: c.call_tool("ask_name", {}))
            except Exception as e:  # the retry finds no proxy
                outcome["error"] = e

        t = threading.Thread(target=call, daemon=True)
        t.start()
        assert client.parked.wait(EXIT_TIMEOUT_S), "the call never parked"
        assert proxy.proc.p.wait(EXIT_TIMEOUT_S) == 0, proxy.proc.output()
        t.join(EXIT_TIMEOUT_S)
        assert "result" not in outcome, outcome

        recs = records(up)
        call = next(r for r in recs if r.get("method") == "tools/call")
        s = call["session"]
        on_call = [r for r in recs if r["session"] == s]
        cancel = next(i for i, r in enumerate(on_call) if r.get("kind") == "response" and r.get("action") == "cancel")
        assert on_call[cancel]["status"] == 202, on_call[cancel]
        cancelled = next(i for i, r in enumerate(on_call) if r.get("method") == "notifications/cancelled")
        assert on_call[cancelled]["status"] == 202, on_call[cancelled]
        deleted = next(i for i, r in enumerate(on_call) if r["http"] == "DELETE")
        assert cancel < cancelled < deleted, on_call
        assert_every_session_deleted(recs)
        assert "panicked" not in proxy.proc.output()
    finally:
        proxy.kill()
        up.kill()


def test_a_parked_call_is_resumed_during_the_drain_and_the_proxy_exits_once_it_is_done(tmp_path):
    up, url = start_py_upstream("--record")
    proxy = Proxy(url, config=write_config(tmp_path, "30s"))
    seen = {}
    try:
        def when_draining():
            deadline = time.monotonic() + EXIT_TIMEOUT_S
            while status(proxy.base + "/readyz") != 503:
                assert time.monotonic() < deadline, "readiness never went off"
                time.sleep(0.02)
            body = {"jsonrpc": "2.0", "id": 99, "method": "tools/call", "params": {"name": "ask_name", "arguments": {},
                    "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                              "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}}}}
            req = urllib.request.Request(proxy.url, data=json.dumps(body).encode(), method="POST", headers={
                "content-type": "application/json", "accept": "application/json, text/event-stream",
                "mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call", "mcp-name": "ask_name"})
            try:
                urllib.request.urlopen(req, timeout=10)
            except urllib.error.HTTPError as e:
                seen["fresh"] = (e.code, e.headers.get("retry-after"))

        client = SignalOnElicit(proxy, when_draining)
        r = client.run(lambda c: c.call_tool("ask_name", {}))
        assert text_of(r) == "Hello, Ada!"
        assert seen["fresh"] == (503, "1"), "a new call during the drain goes elsewhere"
        started = time.monotonic()
        assert proxy.proc.p.wait(EXIT_TIMEOUT_S) == 0, proxy.proc.output()
        assert time.monotonic() - started < 20, "the drain ended when nothing was left, not at its 30 s grace"
        assert_every_session_deleted(records(up))
    finally:
        proxy.kill()
        up.kill()
