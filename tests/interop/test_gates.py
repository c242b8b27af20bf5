"""The gate every client call passes (src/front/gate.rs), on every way in and every upstream
transport, read on the upstream's side: the official Python legacy server (mcp==1.30.0,
servers/py_legacy_server.py) over Streamable HTTP, HTTP+SSE and stdio, behind a proxy in
resource-server mode (`[auth] require = true`, RS256 JWTs checked against a key-set file the test
writes, `subject_header = "x-mcp-subject"`). In front, raw HTTP: a modern client (POST /mcp with
the 2026-07-28 headers and `_meta`), a legacy client on /mcp (initialize, then calls on its
`mcp-session-id`), and a 2024-11-05 HTTP+SSE client (GET /sse, POST /messages, every answer on the
stream).

The matrix, per front and transport: an ungated tool (`echo`) runs; a tool under `[auth.scopes]`
(`progress`) called with a token lacking the scope gets 403 `insufficient_scope` and never runs,
and runs with the scope; a tool under `[approval.tools]` (`chatty`) is asked about (modern: an
`input_required` round; legacy: an inline `elicitation/create`, on the call's SSE response on
/mcp, on the session's stream on /sse), never runs when declined, runs once when approved, and is
refused without running when the client declared no elicitation (or, on /mcp, sent it in a
batch). Every request the client sends carries its own bearer token and a forged `x-mcp-subject:
mallory`; every call the upstream runs over HTTP carries the verified subject (`alice`) and no
`Authorization` — the approved gated call of a legacy client included (issue 37 item 1) — unless
the proxy is configured `forward_authorization = true` (a second proxy on the same upstream),
where it carries the client's own token.

What the upstream ran is read from its call log (`--call-log`): one line per tools/call it runs,
written before it runs, with the headers of the HTTP request that carried it. "It did not run" is
read after a barrier: a later `echo` on the same session that did run (its answer came back, so
its line is written); the refused call must then be absent from the lines since the test began.
"""

import http.client
import itertools
import json
import time
import urllib.parse

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from conftest import HERE, PY_LEGACY, Proc, Proxy, free_port, sse_messages

SERVER = HERE / "servers" / "py_legacy_server.py"
TRANSPORTS = ["py", "py-sse", "py-stdio"]
HTTP_TRANSPORTS = ["py", "py-sse"]
FRONTS = ["modern", "legacy", "sse"]

ISSUER = "https://as.gates.invalid"
KID = "gates-test-key"
SUBJECT = "alice"
FORGED_SUBJECT = "mallory"
PLAIN, SCOPED, GATED = "echo", "progress", "chatty"
SCOPE = "gates:progress"
DECLINED_TEXT = "Not approved: chatty did not run."
APPROVE = {"action": "accept", "content": {"approve": True}}
DECLINE = {"action": "decline"}
MODERN_VERSION = "2026-07-28"
LEGACY_VERSION = "2025-11-25"
SSE_VERSION = "2024-11-05"
ELICIT_CAPS = {"elicitation": {"form": {}}}
WAIT_S = 20


def proxy_toml(resource, key_set, forward_authorization):
    return f"""
[auth]
principal = "jwt"
require = true
resource = "{resource}"
authorization_servers = ["{ISSUER}"]
scopes_supported = ["mcp"]
subject_header = "x-mcp-subject"
forward_authorization = {str(forward_authorization).lower()}

[auth.jwt]
issuer = "{ISSUER}"
jwks_file = "{key_set}"
algorithms = ["RS256"]

[auth.scopes]
{SCOPED} = ["{SCOPE}"]

[approval.tools.{GATED}]
message = "Let {GATED} talk?"
on_decline = "{DECLINED_TEXT}"
"""


# --- peers ---------------------------------------------------------------------------------------


class CallLog:
    """The upstream's call log: one JSON line per tools/call it ran (see py_legacy_server.py)."""

    def __init__(self, path):
        self.path = path
        path.touch()

    def entries(self):
        return [json.loads(l) for l in self.path.read_text().splitlines() if l.strip()]

    def mark(self):
        return len(self.entries())

    def since(self, mark, tool=None):
        return [e for e in self.entries()[mark:] if tool is None or e["tool"] == tool]


def start_upstream(transport, log):
    """(process or None, the proxy's upstream: a URL, or a stdio command line)."""
    flags = ["--call-log", str(log.path)]
    if transport == "py-stdio":
        # A child of the proxy, with a clean environment: the log is named on its command line.
        return None, [str(PY_LEGACY), str(SERVER), "--stdio", *flags]
    sse = transport == "py-sse"
    proc = Proc([str(PY_LEGACY), str(SERVER), *(["--sse"] if sse else []), *flags])
    port = proc.wait_for(r"READY (\d+)").group(1)
    return proc, f"http://127.0.0.1:{port}/{'sse' if sse else 'mcp'}"


class Keys:
    """An RS256 key, its one-key set on disk (the proxy's `jwks_file`), and tokens it signs."""

    def __init__(self, directory):
        self.private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        jwk = jwt.algorithms.RSAAlgorithm.to_jwk(self.private.public_key(), as_dict=True)
        self.path = directory / "jwks.json"
        self.path.write_text(json.dumps({"keys": [{**jwk, "kid": KID, "alg": "RS256", "use": "sig"}]}))

    def token(self, audience, scope):
        now = int(time.time())
        claims = {"iss": ISSUER, "sub": SUBJECT, "aud": audience, "scope": scope,
                  "iat": now, "exp": now + 3600}
        return jwt.encode(claims, self.private, algorithm="RS256", headers={"kid": KID})


class Gated:
    """A proxy in resource-server mode, gating `progress` by scope and `chatty` by approval, with
    the tokens of its audience: `base` (scope `mcp`) and `scoped` (also SCOPE)."""

    def __init__(self, directory, upstream, keys, forward_authorization):
        port = free_port()
        self.resource = f"http://127.0.0.1:{port}/mcp"
        name = "forwarding" if forward_authorization else "proxy"
        config = directory / f"{name}.toml"
        config.write_text(proxy_toml(self.resource, keys.path, forward_authorization))
        self.proxy = Proxy(upstream, config=config, listen=f"127.0.0.1:{port}")
        self.forwards = forward_authorization
        self.base = keys.token(self.resource, "mcp")
        self.scoped = keys.token(self.resource, f"mcp {SCOPE}")

    def kill(self):
        self.proxy.kill()


@pytest.fixture(scope="module")
def stack(request, tmp_path_factory):
    """(transport) → the logging upstream, a gating proxy in front of it and one that forwards
    the client's token."""
    transport = request.param
    directory = tmp_path_factory.mktemp(f"gates-{transport}")
    log = CallLog(directory / "calls.jsonl")
    keys = Keys(directory)
    up, upstream = start_upstream(transport, log)
    started = []
    try:
        for forwards in (False, True):
            started.append(Gated(directory, upstream, keys, forwards))
        gated, forwarding = started
        yield {"transport": transport, "log": log, "gated": gated, "forwarding": forwarding}
    finally:
        for g in started:
            g.kill()
        if up is not None:
            up.kill()


# --- the wire ------------------------------------------------------------------------------------

_ids = itertools.count(1)
_nonces = itertools.count(1)


def nonce(what):
    return f"{what}-{next(_nonces)}"


class Outcome:
    """What a call came to: the HTTP status of the request that carried it, its WWW-Authenticate,
    its JSON-RPC `result` or `error`, and the approval forms the client was asked."""

    def __init__(self, status, challenge="", answer=None, asked=()):
        self.status, self.challenge, self.asked = status, challenge, list(asked)
        answer = answer or {}
        self.result, self.error = answer.get("result"), answer.get("error")

    def text(self):
        assert self.result is not None and not self.result.get("isError"), self
        return self.result["content"][0]["text"]

    def __repr__(self):
        return f"<{self.status} {self.challenge!r} result={self.result} error={self.error} asked={self.asked}>"


def connect(url):
    u = urllib.parse.urlsplit(url)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=WAIT_S)


def request(url, method, path, body=None, headers=None):
    """One whole request on a connection of its own: (status, headers, body text)."""
    conn = connect(url)
    try:
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read().decode()
    finally:
        conn.close()


def events(resp, until):
    """The `(event name, data)` pairs of an SSE response as they come, comments (keep-alives)
    skipped, until the stream ends or the time `until()` gives passes."""
    name, data = "message", []
    while time.monotonic() < until():
        line = resp.readline()
        if not line:
            return
        line = line.decode().rstrip("\r\n")
        if line == "":
            if data:
                yield name, "\n".join(data)
            name, data = "message", []
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            name = value
        elif field == "data":
            data.append(value)
    raise AssertionError("no answer in time")


def parse(raw):
    """A JSON body, or None for an empty or non-JSON one."""
    try:
        return json.loads(raw)
    except ValueError:
        return None


def is_answer(message, rpc_id):
    return message.get("id") == rpc_id and ("result" in message or "error" in message)


def tool_call(rpc_id, name, arguments):
    return {"jsonrpc": "2.0", "id": rpc_id, "method": "tools/call",
            "params": {"name": name, "arguments": arguments}}


def auth_headers(token):
    # Every request carries the client's own token and a subject header it wrote itself.
    return {"authorization": f"Bearer {token}", "x-mcp-subject": FORGED_SUBJECT}


class Modern:
    """A modern client: each call is a POST /mcp of its own; a gated one is an input_required
    round, retried with the approval answer."""

    def __init__(self, gated, token, elicits=True):
        self.url, self.token = gated.proxy.url, token
        self.caps = ELICIT_CAPS if elicits else {}

    def _post(self, rpc_id, name, arguments, token, **extra):
        body = tool_call(rpc_id, name, arguments)
        body["params"].update(extra)
        body["params"]["_meta"] = {
            "io.modelcontextprotocol/protocolVersion": MODERN_VERSION,
            "io.modelcontextprotocol/clientCapabilities": self.caps,
            "io.modelcontextprotocol/clientInfo": {"name": "raw-gates-test", "version": "1"}}
        headers = {"content-type": "application/json", "accept": "application/json, text/event-stream",
                   "mcp-protocol-version": MODERN_VERSION, "mcp-method": "tools/call", "mcp-name": name,
                   **auth_headers(token)}
        status, h, raw = request(self.url, "POST", urllib.parse.urlsplit(self.url).path, body, headers)
        if h.get("content-type", "").startswith("text/event-stream"):
            answers = [m for m in sse_messages(raw) if is_answer(m, rpc_id)]
            answer = answers[-1] if answers else None
        else:
            answer = parse(raw)
        return Outcome(status, h.get("www-authenticate", ""), answer)

    def call(self, name, arguments, token=None, answer=APPROVE):
        token = token or self.token
        first = self._post(next(_ids), name, arguments, token)
        if first.result is None or first.result.get("resultType") != "input_required":
            return first
        [(key, asked)] = first.result["inputRequests"].items()
        assert key == "approval" and asked["method"] == "elicitation/create", first
        done = self._post(next(_ids), name, arguments, token, requestState=first.result["requestState"],
                          inputResponses={key: answer})
        done.asked = [asked["params"]]
        return done

    def close(self):
        pass


class Legacy:
    """A legacy (2025-11-25) client on /mcp: initialize, then every request on its session; an
    `elicitation/create` on a call's SSE answer is answered by a POST on the session."""

    def __init__(self, gated, token, elicits=True):
        self.url, self.token = gated.proxy.url, token
        self.path = urllib.parse.urlsplit(self.url).path
        init = {"jsonrpc": "2.0", "id": next(_ids), "method": "initialize", "params": {
            "protocolVersion": LEGACY_VERSION, "capabilities": ELICIT_CAPS if elicits else {},
            "clientInfo": {"name": "raw-gates-legacy", "version": "1"}}}
        status, h, raw = request(self.url, "POST", self.path, init, self._headers(token, session=False))
        assert status == 200 and "mcp-session-id" in h, (status, h, raw)
        self.session = h["mcp-session-id"]
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        status, _, raw = request(self.url, "POST", self.path, note, self._headers(token))
        assert status == 202, (status, raw)

    def _headers(self, token, session=True):
        h = {"content-type": "application/json", "accept": "application/json, text/event-stream",
             **auth_headers(token)}
        if session:
            h.update({"mcp-session-id": self.session, "mcp-protocol-version": LEGACY_VERSION})
        return h

    def send(self, body, token=None, answer=APPROVE):
        """POSTs `body` (a request, or a batch); the answer to it (to a batch: its error, if any),
        an elicitation on the way answered with `answer`."""
        token = token or self.token
        rpc_id = (body[-1] if isinstance(body, list) else body)["id"]
        conn = connect(self.url)
        try:
            conn.request("POST", self.path, body=json.dumps(body).encode(), headers=self._headers(token))
            resp = conn.getresponse()
            challenge = resp.getheader("www-authenticate", "")
            if not resp.getheader("content-type", "").startswith("text/event-stream"):
                message = parse(resp.read().decode())
                if isinstance(message, list):
                    message = next((m for m in message if "error" in m), message[0])
                return Outcome(resp.status, challenge, message)
            asked = []
            deadline = time.monotonic() + WAIT_S
            for _, data in events(resp, lambda: deadline):
                message = json.loads(data)
                if message.get("method") == "elicitation/create":
                    asked.append(message["params"])
                    reply = {"jsonrpc": "2.0", "id": message["id"], "result": answer}
                    status, _, raw = request(self.url, "POST", self.path, reply, self._headers(token))
                    assert status == 202, ("the answer to the approval", status, raw)
                elif is_answer(message, rpc_id):
                    return Outcome(resp.status, challenge, message, asked)
            raise AssertionError(f"the call's stream ended without its answer (asked: {asked})")
        finally:
            conn.close()

    def call(self, name, arguments, token=None, answer=APPROVE):
        return self.send(tool_call(next(_ids), name, arguments), token, answer)

    def close(self):
        try:
            request(self.url, "DELETE", self.path, headers=self._headers(self.token))
        except OSError:
            pass  # the proxy is gone already


class Sse:
    """A 2024-11-05 HTTP+SSE client: GET /sse, every message POSTed to the endpoint it names,
    every answer (and the proxy's own `elicitation/create`) read on the stream."""

    def __init__(self, gated, token, elicits=True):
        self.proxy, self.token = gated.proxy, token
        self.conn = connect(self.proxy.base)
        try:
            self.conn.request("GET", "/sse", headers={"accept": "text/event-stream", **auth_headers(token)})
            self.resp = self.conn.getresponse()
            assert self.resp.status == 200, (self.resp.status, self.resp.read(2000))
            self.deadline = time.monotonic() + WAIT_S
            self.stream = events(self.resp, lambda: self.deadline)
            name, self.endpoint = next(self.stream)
            assert name == "endpoint", (name, self.endpoint)
            init = {"jsonrpc": "2.0", "id": next(_ids), "method": "initialize", "params": {
                "protocolVersion": SSE_VERSION, "capabilities": ELICIT_CAPS if elicits else {},
                "clientInfo": {"name": "raw-gates-sse", "version": "1"}}}
            self.send(init)
            status, raw = self._post({"jsonrpc": "2.0", "method": "notifications/initialized"})
            assert status == 202, (status, raw)
        except BaseException:
            self.conn.close()
            raise

    def _post(self, message, token=None):
        headers = {"content-type": "application/json", **auth_headers(token or self.token)}
        status, h, raw = request(self.proxy.base, "POST", self.endpoint, message, headers)
        self.last_challenge = h.get("www-authenticate", "")
        return status, raw

    def send(self, message, token=None, answer=APPROVE):
        """POSTs a request; its answer from the stream (an elicitation on the way answered with
        `answer`), or the POST's refusal."""
        status, raw = self._post(message, token)
        if status != 202:
            return Outcome(status, self.last_challenge, parse(raw))
        asked = []
        self.deadline = time.monotonic() + WAIT_S
        for _, data in self.stream:
            m = json.loads(data)
            if m.get("method") == "elicitation/create":
                asked.append(m["params"])
                s, r = self._post({"jsonrpc": "2.0", "id": m["id"], "result": answer}, token)
                assert s == 202, ("the answer to the approval", s, r)
            elif is_answer(m, message["id"]):
                return Outcome(status, "", m, asked)
        raise AssertionError(f"no answer to {message['id']} on the stream (asked: {asked})")

    def call(self, name, arguments, token=None, answer=APPROVE):
        return self.send(tool_call(next(_ids), name, arguments), token, answer)

    def close(self):
        self.conn.close()


CLIENTS = {"modern": Modern, "legacy": Legacy, "sse": Sse}


@pytest.fixture
def clients():
    """Opens clients (`open(front, gated, token, elicits)`) and closes them on every exit path."""
    opened = []

    def open_client(front, gated, token, elicits=True):
        c = CLIENTS[front](gated, token, elicits)
        opened.append(c)
        return c

    yield open_client
    for c in opened:
        c.close()


# --- what the upstream ran -----------------------------------------------------------------------


def barrier(client, log, mark):
    """A plain call on the same client, which runs; then the log's lines since `mark`."""
    text = nonce("barrier")
    assert client.call(PLAIN, {"text": text}).text() == text
    entries = log.since(mark)
    assert [e["arguments"] for e in entries if e["tool"] == PLAIN][-1:] == [{"text": text}], entries
    return entries


def assert_credentials(stack, entry, gated, token):
    """An HTTP transport's call carried the verified subject and, only when forwarded, the token."""
    if stack["transport"] not in HTTP_TRANSPORTS:
        assert entry["http"] is False, entry
        return
    assert entry["http"] is True, entry
    assert entry["subject"] == SUBJECT, f"the upstream saw subject {entry['subject']!r}: {entry}"
    expected = f"Bearer {token}" if gated.forwards else None
    assert entry["authorization"] == expected, f"the upstream saw Authorization {entry['authorization']!r}"


every_transport = pytest.mark.parametrize("stack", TRANSPORTS, indirect=True)
every_front = pytest.mark.parametrize("front", FRONTS)


# --- the matrix ----------------------------------------------------------------------------------


@every_transport
@every_front
def test_an_ungated_tool_runs_with_the_verified_subject_and_without_the_token(stack, front, clients):
    gated, log = stack["gated"], stack["log"]
    client = clients(front, gated, gated.base)
    mark = log.mark()
    text = nonce("plain")
    assert client.call(PLAIN, {"text": text}).text() == text
    [entry] = log.since(mark)
    assert entry["tool"] == PLAIN and entry["arguments"] == {"text": text}, entry
    assert_credentials(stack, entry, gated, gated.base)


@every_transport
@every_front
def test_a_scoped_tool_without_the_scope_is_403_and_never_runs(stack, front, clients):
    gated, log = stack["gated"], stack["log"]
    client = clients(front, gated, gated.base)
    mark = log.mark()
    refused = client.call(SCOPED, {"steps": 1})
    assert refused.status == 403, refused
    assert "insufficient_scope" in refused.challenge and SCOPE in refused.challenge, refused
    assert refused.result is None, refused
    entries = barrier(client, log, mark)
    assert [e for e in entries if e["tool"] == SCOPED] == [], f"the upstream ran {SCOPED}: {entries}"


@every_transport
@every_front
def test_a_scoped_tool_with_the_scope_runs(stack, front, clients):
    gated, log = stack["gated"], stack["log"]
    client = clients(front, gated, gated.scoped)
    mark = log.mark()
    assert client.call(SCOPED, {"steps": 1}).text() == "done after 1 steps"
    [entry] = log.since(mark)
    assert entry["tool"] == SCOPED, entry
    assert_credentials(stack, entry, gated, gated.scoped)


@every_transport
@every_front
def test_a_declined_gated_call_never_runs(stack, front, clients):
    gated, log = stack["gated"], stack["log"]
    client = clients(front, gated, gated.base)
    mark = log.mark()
    declined = client.call(GATED, {}, answer=DECLINE)
    assert [a["message"] for a in declined.asked] == [f"Let {GATED} talk?"], declined
    assert declined.result["isError"] is True, declined
    assert declined.result["content"] == [{"type": "text", "text": DECLINED_TEXT}], declined
    entries = barrier(client, log, mark)
    assert [e for e in entries if e["tool"] == GATED] == [], f"the upstream ran {GATED}: {entries}"


def approved_call_runs_once(stack, gated, front, clients):
    log = stack["log"]
    client = clients(front, gated, gated.base)
    mark = log.mark()
    approved = client.call(GATED, {})
    assert [a["message"] for a in approved.asked] == [f"Let {GATED} talk?"], approved
    assert approved.text() == "said three things"
    entries = barrier(client, log, mark)
    [entry] = [e for e in entries if e["tool"] == GATED]
    assert_credentials(stack, entry, gated, gated.base)


@every_transport
@every_front
def test_an_approved_gated_call_runs_once_with_the_verified_subject_only(stack, front, clients):
    approved_call_runs_once(stack, stack["gated"], front, clients)


@pytest.mark.parametrize("stack", HTTP_TRANSPORTS, indirect=True)
@every_front
def test_forward_authorization_sends_the_clients_token_with_the_approved_call(stack, front, clients):
    approved_call_runs_once(stack, stack["forwarding"], front, clients)


@every_transport
@every_front
def test_a_gated_call_nobody_can_be_asked_about_is_refused_and_never_runs(stack, front, clients):
    gated, log = stack["gated"], stack["log"]
    client = clients(front, gated, gated.base, elicits=False)
    mark = log.mark()
    refused = client.call(GATED, {})
    assert refused.asked == [] and refused.result is None, refused
    if front == "modern":
        assert refused.status == 400 and refused.error["code"] == -32021, refused
    else:
        assert refused.error["code"] == -32600 and GATED in refused.error["message"], refused
    entries = barrier(client, log, mark)
    assert [e for e in entries if e["tool"] == GATED] == [], f"the upstream ran {GATED}: {entries}"


@every_transport
@pytest.mark.parametrize("tool", [GATED, SCOPED])
def test_a_legacy_batch_with_a_gated_or_unscoped_call_is_refused_whole(stack, tool, clients):
    gated, log = stack["gated"], stack["log"]
    client = clients("legacy", gated, gated.base)
    mark = log.mark()
    arguments = {} if tool == GATED else {"steps": 1}
    batch = [tool_call(next(_ids), PLAIN, {"text": nonce("in-batch")}), tool_call(next(_ids), tool, arguments)]
    refused = client.send(batch)
    if tool == SCOPED:
        assert refused.status == 403 and SCOPE in refused.challenge, refused
    else:
        assert refused.error["code"] == -32600 and GATED in refused.error["message"], refused
    entries = barrier(client, log, mark)
    assert [e["tool"] for e in entries] == [PLAIN], f"only the barrier ran: {entries}"
