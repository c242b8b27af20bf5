"""The soak's wire: bearer tokens it mints, one modern (2026-07-28) request, and the two legacy
client flows (Streamable HTTP and 2024-11-05 HTTP+SSE), each carrying a nonce it checks in the
answer. Standard JSON-RPC over httpx2, nothing of an SDK, so that every byte is the soak's own."""

import itertools
import json
import time

import httpx2
import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

from conftest import sse_messages

MODERN = "2026-07-28"
LEGACY = "2025-11-25"
ISSUER = "https://issuer.soak.example"
AUDIENCE = "https://soak.example/mcp"
PLAIN_CAPS = {"elicitation": {"form": {}}, "sampling": {}}
TASKS_CAPS = {**PLAIN_CAPS, "extensions": {"io.modelcontextprotocol/tasks": {}}}
ACCEPT = "application/json, text/event-stream"

_ids = itertools.count(1)


class Crossed(Exception):
    """An answer that does not carry the nonce of the operation that asked."""


class Refused(Exception):
    """An answer that ends the operation with an outcome other than success (`outcome` names it)."""

    def __init__(self, outcome, detail=""):
        super().__init__(outcome)
        self.outcome, self.detail = outcome, detail


class Issuer:
    """An RS256 signing key, its key set in a file for `[auth.jwt] jwks_file`, and fresh tokens."""

    def __init__(self, jwks_path):
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        jwk = jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key(), as_dict=True)
        jwks_path.write_text(json.dumps({"keys": [{**jwk, "kid": "soak", "alg": "RS256", "use": "sig"}]}))
        self.jwks_path = jwks_path

    def token(self, subject):
        """A new token for `subject` (a new `jti` and `iat` each time: a refresh)."""
        now = int(time.time())
        claims = {"iss": ISSUER, "sub": subject, "aud": AUDIENCE, "scope": "mcp", "iat": now,
                  "exp": now + 600, "jti": f"{subject}-{time.monotonic_ns()}"}
        return jwt.encode(claims, self.key, algorithm="RS256", headers={"kid": "soak"})


def check(status, answer):
    """Raises Refused for an HTTP or JSON-RPC error (`http_400/rpc_-32602`); the result otherwise."""
    error = answer.get("error", {}) if isinstance(answer, dict) else {}
    if status != 200:
        code = error.get("code")
        raise Refused(f"http_{status}" + (f"/rpc_{code}" if code is not None else ""), error.get("message", ""))
    if error:
        raise Refused(f"rpc_{error.get('code')}", error.get("message", ""))
    return answer["result"]


def answer_of(rpc_id, response):
    """The JSON-RPC answer to `rpc_id` in a JSON or an SSE body."""
    if not response.headers.get("content-type", "").startswith("text/event-stream"):
        return response.json()
    found = [m for m in sse_messages(response.text) if m.get("id") == rpc_id and ("result" in m or "error" in m)]
    if len(found) != 1:
        raise Refused("no_answer_on_stream")
    return found[0]


async def modern(http, url, method, params, token, caps=PLAIN_CAPS):
    """One modern request: (HTTP status, its JSON-RPC answer or {})."""
    rpc_id = next(_ids)
    meta = {"io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": caps,
            "io.modelcontextprotocol/clientInfo": {"name": "soak", "version": "1"}}
    body = {"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": {**params, "_meta": meta}}
    headers = {"content-type": "application/json", "accept": ACCEPT, "mcp-protocol-version": MODERN,
               "mcp-method": method, "authorization": f"Bearer {token}"}
    name = params.get("taskId") or params.get("name")
    if name:
        headers["mcp-name"] = name
    response = await http.post(url, json=body, headers=headers)
    if response.status_code != 200:
        return response.status_code, json_or_empty(response)
    return 200, answer_of(rpc_id, response)


def json_or_empty(response):
    try:
        return response.json()
    except ValueError:
        return {}


def text_of(result):
    content = result.get("content") or [{}]
    return content[0].get("text", "")


def expect_nonces(text, nonces):
    """The result must carry every answer this operation gave, and so its own nonce."""
    missing = [n for n in nonces if n not in text]
    if missing:
        raise Crossed(f"{text!r} lacks {missing}")


# --- legacy clients ------------------------------------------------------------------------------


def legacy_message(method, params=None, rpc_id=None):
    m = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        m["params"] = params
    if rpc_id is not None:
        m["id"] = rpc_id
    return m


def initialize(rpc_id):
    return legacy_message("initialize", {"protocolVersion": LEGACY, "capabilities": {},
                                         "clientInfo": {"name": "soak-legacy", "version": "1"}}, rpc_id)


def echo_call(rpc_id, nonce):
    return legacy_message("tools/call", {"name": "echo", "arguments": {"text": nonce}}, rpc_id)


async def legacy_http_echo(http, url, token, nonce):
    """A 2025-11-25 Streamable HTTP client: initialize, initialized, echo(nonce), DELETE."""
    headers = {"accept": ACCEPT, "authorization": f"Bearer {token}"}
    r = await http.post(url, json=initialize(1), headers=headers)
    check(r.status_code, answer_of(1, r) if r.status_code == 200 else {"error": {"message": r.text[:200]}})
    session = r.headers.get("mcp-session-id")
    if not session:
        raise Refused("no_session_id")
    headers = {**headers, "mcp-session-id": session, "mcp-protocol-version": LEGACY}
    try:
        r = await http.post(url, json=legacy_message("notifications/initialized"), headers=headers)
        if r.status_code != 202:
            raise Refused(f"http_{r.status_code}")
        r = await http.post(url, json=echo_call(2, nonce), headers=headers)
        result = check(r.status_code, answer_of(2, r) if r.status_code == 200 else {})
        expect_nonces(text_of(result), [nonce])
    finally:
        await http.delete(url, headers=headers)


class SseStream:
    """A 2024-11-05 client's GET stream: its events one by one (httpx2's own SSE parser)."""

    def __init__(self, response):
        self.events = aiter(httpx2.EventSource(response))

    async def next_event(self):
        try:
            event = await anext(self.events)
        except StopAsyncIteration:
            raise Refused("stream_ended") from None
        return event.event, event.data

    async def answer_to(self, rpc_id):
        for _ in range(100):
            name, data = await self.next_event()
            message = json.loads(data) if name == "message" else {}
            if message.get("id") == rpc_id and ("result" in message or "error" in message):
                return message
        raise Refused("no_answer_on_stream")


async def legacy_sse_echo(http, base, token, nonce):
    """A 2024-11-05 HTTP+SSE client: GET /sse, its endpoint, initialize, initialized, echo(nonce)
    over POST /messages, every answer on the stream; closing the stream ends the session."""
    auth = {"authorization": f"Bearer {token}"}
    async with http.stream("GET", base + "/sse", headers={**auth, "accept": "text/event-stream"}) as r:
        if r.status_code != 200:
            raise Refused(f"http_{r.status_code}")
        stream = SseStream(r)
        name, endpoint = await stream.next_event()
        if name != "endpoint":
            raise Refused("no_endpoint")
        post = endpoint if endpoint.startswith("http") else base + endpoint
        for message in (initialize(1), legacy_message("notifications/initialized"), echo_call(2, nonce)):
            sent = await http.post(post, json=message, headers=auth)
            if sent.status_code != 202:
                raise Refused(f"http_{sent.status_code}")
            if message.get("id") is not None:
                result = check(200, await stream.answer_to(message["id"]))
        expect_nonces(text_of(result), [nonce])
