"""OAuth at the edge (issue 22), with real peers: a real authorization server (servers/oauth_as.py:
registration, PKCE, RFC 8707 audiences, RS256 JWTs or opaque tokens, refresh rotation, JWKS,
introspection), the official Python client (mcp==2.3.0, pinned to 2026-07-28) with its own OAuth
provider driven headless, and the official Python server (mcp==1.30.0, servers/py_oauth_upstream.py,
which records every request it gets).

Resource-server mode (the proxy checks the token; the upstream has no auth): the client discovers
everything from the proxy's 401, gets a token and completes an elicitation round; a token refreshed
between the first leg and the retry resumes the parked call; another user's token on the retry is
refused and the owner can still resume; expired, wrong-audience, wrong-issuer and forged tokens get
the 401 challenge; a missing scope gets 403 naming it (and the SDK steps up); a rotated signing key
is accepted after a JWKS refetch; the upstream never sees the client's token (unless
`forward_authorization`) and sees the verified subject, never one the client sent; an unreachable
JWKS or introspection endpoint is a 503 with Retry-After. Introspection mode (opaque tokens): the
same round with a refreshed token, one introspection for two requests with one token. Pass-through
mode, in front of the official SDK's own resource-server auth: the upstream's 401 and metadata
reach the client rewritten to the proxy's public URL (at both well-known locations), and each leg
carries its own (refreshed) token upstream. Cluster: a refreshed token's retry forwarded to the
owner resumes.
"""

import asyncio
import json
import re
import sys
import time
import urllib.error
import urllib.request
from urllib.parse import parse_qs, urlparse

import httpx2
import pytest
from mcp import Client
from mcp.client.auth import AuthorizationCodeResult, OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientMetadata
from mcp.types import ElicitResult

from conftest import HERE, PY_LEGACY, Proc, Proxy, free_port, on_probed_ports, sse_messages, wait_tcp
from test_cluster import NGINX, NGINX_CONF, REPLICAS

WAIT_S = 30
CALL_TIMEOUT_S = 60
# Where the client says it listens for the authorization redirect; never fetched (the test reads
# the code from the authorization server's Location header).
REDIRECT_URI = "http://127.0.0.1:9/callback"
INTROSPECTION_ID, INTROSPECTION_SECRET = "mrtr-proxy", "s3cret-for-introspection"
ELICIT_CAPS = {"elicitation": {"form": {}}}


# --- peers ---------------------------------------------------------------------------------------


class AuthServer:
    """servers/oauth_as.py, with its test hooks."""

    def __init__(self, *flags):
        self.proc = Proc([sys.executable, str(HERE / "servers" / "oauth_as.py"),
                          "--introspection-client", f"{INTROSPECTION_ID}:{INTROSPECTION_SECRET}", *flags])
        port = self.proc.wait_for(r"READY (\d+)").group(1)
        self.base = f"http://127.0.0.1:{port}"
        self.issuer = self.base + "/" if "--trailing-slash" in flags else self.base

    def _post(self, path, body):
        req = urllib.request.Request(self.base + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=WAIT_S) as r:
            return json.loads(r.read())

    def mint(self, **claims):
        """A token with exactly these claims (`kid` and `forge` are directions, see oauth_as.py)."""
        return self._post("/test/mint", claims)["token"]

    def token_for(self, sub, aud, scope="mcp", ttl=300, **extra):
        now = int(time.time())
        return self.mint(iss=self.issuer, sub=sub, aud=aud, scope=scope, iat=now, exp=now + ttl,
                         jti=f"{sub}-{time.monotonic_ns()}", client_id="minted", **extra)

    def rotate(self):
        return self._post("/test/rotate", {})["kid"]

    def stats(self):
        with urllib.request.urlopen(self.base + "/test/stats", timeout=WAIT_S) as r:
            return json.loads(r.read())

    def kill(self):
        self.proc.kill()


class Upstream:
    """servers/py_oauth_upstream.py (mcp==1.30.0) and what it saw."""

    def __init__(self, *flags):
        self.proc = Proc([str(PY_LEGACY), str(HERE / "servers" / "py_oauth_upstream.py"), *flags])
        port = self.proc.wait_for(r"READY (\d+)").group(1)
        self.base = f"http://127.0.0.1:{port}"
        self.url = self.base + "/mcp"

    def seen(self, since=0):
        with urllib.request.urlopen(self.base + "/test/seen", timeout=WAIT_S) as r:
            return json.loads(r.read())[since:]

    def mark(self):
        return len(self.seen())

    def kill(self):
        self.proc.kill()


def rpcs(entries, rpc):
    return [e for e in entries if e["rpc"] == rpc]


def answers(entries):
    return [e for e in entries if (e["rpc"] or "").startswith("response to id")]


def auth_toml(resource, as_issuer, as_base, principal="jwt", require=True, jwks_uri=None,
              introspection_endpoint=None, secret_file=None, forward_authorization=False):
    text = f"""
[auth]
principal = "{principal}"
require = {str(require).lower()}
resource = "{resource}"
authorization_servers = ["{as_issuer}"]
scopes_supported = ["mcp"]
subject_header = "x-mcp-subject"
forward_authorization = {str(forward_authorization).lower()}
"""
    if require:  # tool scopes are the proxy's to check only in resource-server mode
        text += '\n[auth.scopes]\nadmin_tool = ["admin"]\n'
    if principal == "jwt":
        text += f"""
[auth.jwt]
issuer = "{as_issuer}"
jwks_uri = "{jwks_uri or as_base + '/jwks'}"
algorithms = ["RS256"]
leeway = "5s"
jwks_refetch_interval = "0s"
"""
    else:
        text += f"""
[auth.introspection]
endpoint = "{introspection_endpoint or as_base + '/introspect'}"
client_id = "{INTROSPECTION_ID}"
client_secret_file = "{secret_file}"
"""
    return text


def start_proxy(tmp_path, upstream_url, toml_for):
    """A proxy on a port chosen first, since its [auth] resource names it; `toml_for(resource)`
    gives the [auth] tables. Its config is tests/interop/proxy.toml plus those."""

    def start(ports):
        [port] = ports
        resource = f"http://127.0.0.1:{port}/mcp"
        config = tmp_path / f"proxy-{port}.toml"
        config.write_text((HERE / "proxy.toml").read_text() + toml_for(resource))
        proxy = Proxy(upstream_url, config=config, listen=f"127.0.0.1:{port}")
        assert proxy.url == resource, (proxy.url, resource)
        return proxy

    # A proxy that failed to start has exited: nothing to stop.
    return on_probed_ports(1, start, lambda: None)


def secret_file(tmp_path):
    path = tmp_path / "introspection-secret"
    path.write_text(INTROSPECTION_SECRET)
    return path


# --- raw HTTP ------------------------------------------------------------------------------------


class Reply:
    def __init__(self, status, headers, raw):
        self.status, self.headers, self.raw = status, headers, raw
        self.body = None
        ctype = headers.get("content-type", "")
        if ctype.startswith("text/event-stream"):
            for message in sse_messages(raw):
                if "result" in message or "error" in message:
                    self.body = message
        elif raw.strip():
            try:
                self.body = json.loads(raw)
            except ValueError:
                self.body = None

    def challenge(self):
        """The WWW-Authenticate header: (scheme, {param: value})."""
        header = self.headers.get("www-authenticate") or ""
        return header.split(" ", 1)[0], dict(re.findall(r'(\w+)="([^"]*)"', header))

    def __repr__(self):
        return f"<HTTP {self.status} {dict(self.headers)} {self.raw[:400]!r}>"


def modern_call(rpc_id, name, arguments=None, **extra):
    return {"jsonrpc": "2.0", "id": rpc_id, "method": "tools/call", "params": {
        "name": name, "arguments": arguments or {}, **extra,
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                  "io.modelcontextprotocol/clientCapabilities": ELICIT_CAPS,
                  "io.modelcontextprotocol/clientInfo": {"name": "raw-oauth-test", "version": "1"}}}}


def post(url, body, token=None, extra_headers=None):
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream",
               "mcp-protocol-version": "2026-07-28", "mcp-method": body["method"]}
    if "name" in body.get("params", {}):
        headers["mcp-name"] = body["params"]["name"]
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    headers.update(extra_headers or {})
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=WAIT_S) as r:
            return Reply(r.status, {k.lower(): v for k, v in r.headers.items()}, r.read().decode())
    except urllib.error.HTTPError as e:
        return Reply(e.code, {k.lower(): v for k, v in e.headers.items()}, e.read().decode())


def get_json(url):
    with urllib.request.urlopen(url, timeout=WAIT_S) as r:
        return r.status, json.loads(r.read())


def first_leg(url, token, rpc_id=1):
    """whoami's first leg: the input_required result (asserted) → its requestState."""
    reply = post(url, modern_call(rpc_id, "whoami"), token)
    assert reply.status == 200, reply
    result = reply.body["result"]
    assert result["resultType"] == "input_required", reply
    [key] = result["inputRequests"]
    return key, result["requestState"]


def retry(url, token, key, state, rpc_id=2, name="Ada"):
    body = modern_call(rpc_id, "whoami", requestState=state,
                       inputResponses={key: {"action": "accept", "content": {"name": name}}})
    return post(url, body, token)


def text_of(reply):
    assert reply.status == 200 and "result" in reply.body, reply
    assert reply.body["result"].get("resultType", "complete") == "complete", reply
    return reply.body["result"]["content"][0]["text"]


def metadata_url(proxy):
    return proxy.base + "/.well-known/oauth-protected-resource/mcp"


def assert_challenge(reply, proxy, status=401, error="invalid_token"):
    assert reply.status == status, reply
    scheme, params = reply.challenge()
    assert scheme.lower() == "bearer", reply
    assert params.get("resource_metadata") == metadata_url(proxy), reply
    if error is not None:
        assert params.get("error") == error, reply
    return params


# --- the official client, OAuth driven headless --------------------------------------------------


class MemoryStorage:
    def __init__(self):
        self.tokens, self.client_info = None, None

    async def get_tokens(self):
        return self.tokens

    async def set_tokens(self, tokens):
        self.tokens = tokens

    async def get_client_info(self):
        return self.client_info

    async def set_client_info(self, client_info):
        self.client_info = client_info


class OAuthUser:
    """mcp==2.3.0 `Client` pinned to 2026-07-28 over an httpx2 client carrying the SDK's
    `OAuthClientProvider`. The "browser" fetches the authorization URL without following the
    redirect and hands the code and state to the provider. With `refresh_on_elicit`, the elicitation
    callback marks the access token expired, so the provider refreshes it before the retry: the
    refresh happens between the first leg and the retry, deterministically. Every HTTP exchange the
    client makes is logged in `exchanges`; a failure carries the requests it made and, from
    `procs`, the output of the peers (the proxy's log)."""

    def __init__(self, server_url, refresh_on_elicit=False, procs=()):
        self.server_url = server_url
        self.procs = procs
        self.refresh_on_elicit = refresh_on_elicit
        self.storage = MemoryStorage()
        self.provider = OAuthClientProvider(
            server_url,
            OAuthClientMetadata(client_name="mrtr-oauth-test", redirect_uris=[REDIRECT_URI],
                                grant_types=["authorization_code", "refresh_token"], response_types=["code"],
                                token_endpoint_auth_method="client_secret_post"),
            self.storage, redirect_handler=self._open_browser, callback_handler=self._callback)
        self.redirect = None
        self.exchanges = []
        self.attempts = []

    async def _open_browser(self, authorization_url):
        async with httpx2.AsyncClient(timeout=WAIT_S) as browser:
            r = await browser.get(authorization_url)
        assert r.status_code == 302, (r.status_code, r.text)
        location = r.headers["location"]
        assert location.startswith(REDIRECT_URI), location
        self.redirect = {k: v[0] for k, v in parse_qs(urlparse(location).query).items()}
        assert "code" in self.redirect, location

    async def _callback(self):
        return AuthorizationCodeResult(code=self.redirect["code"], state=self.redirect.get("state"))

    async def _elicit(self, ctx, params):
        if self.refresh_on_elicit:
            self.provider.context.token_expiry_time = time.time() - 1
        return ElicitResult(action="accept", content={"name": "Ada"})

    async def _log_attempt(self, request):
        self.attempts.append(f"{request.method} {request.url} {request.headers.get('mcp-method')}")

    async def _log(self, response):
        request = response.request
        self.exchanges.append({"method": request.method, "url": str(request.url),
                               "mcp_method": request.headers.get("mcp-method"),
                               "mcp_name": request.headers.get("mcp-name"),
                               "authorization": request.headers.get("authorization"),
                               "status": response.status_code})

    def run(self, fn):
        async def go():
            hooks = {"request": [self._log_attempt], "response": [self._log]}
            async with httpx2.AsyncClient(auth=self.provider, timeout=CALL_TIMEOUT_S, event_hooks=hooks) as http:
                transport = streamable_http_client(self.server_url, http_client=http)
                async with Client(transport, mode="2026-07-28", elicitation_callback=self._elicit) as c:
                    return await asyncio.wait_for(fn(c), CALL_TIMEOUT_S)

        try:
            return asyncio.run(go())
        except BaseException as e:
            e.add_note("HTTP requests the client made, in order:\n" + "\n".join(self.attempts))
            for proc in self.procs:
                e.add_note(f"output of {proc.cmd[0]}:\n" + proc.output()[-4000:])
            raise

    def calls(self, tool=None):
        """The exchanges of MCP requests with the server (tools/call of `tool` when given)."""
        out = [x for x in self.exchanges if x["url"] == self.server_url and x["method"] == "POST"]
        if tool is not None:
            out = [x for x in out if x["mcp_method"] == "tools/call" and x["mcp_name"] == tool]
        return out


def sdk_text(result):
    return result.content[0].text


# --- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rs(tmp_path_factory):
    """Resource-server mode: an unauthenticated official SDK upstream behind a proxy that requires
    RS256 JWTs from the authorization server."""
    tmp = tmp_path_factory.mktemp("oauth-rs")
    auth, up, proxy = AuthServer(), None, None
    try:
        up = Upstream()
        proxy = start_proxy(tmp, up.url, lambda resource: auth_toml(resource, auth.issuer, auth.base))
        yield {"as": auth, "up": up, "proxy": proxy, "resource": proxy.url}
    finally:
        for p in (proxy, up, auth):
            if p is not None:
                p.kill()


@pytest.fixture(scope="module")
def introspecting(tmp_path_factory):
    """Introspection mode: opaque access tokens, checked at the authorization server's /introspect."""
    tmp = tmp_path_factory.mktemp("oauth-introspection")
    auth, up, proxy = AuthServer("--opaque"), None, None
    try:
        up = Upstream()
        proxy = start_proxy(tmp, up.url, lambda resource: auth_toml(
            resource, auth.issuer, auth.base, principal="introspection", secret_file=secret_file(tmp)))
        yield {"as": auth, "up": up, "proxy": proxy, "resource": proxy.url}
    finally:
        for p in (proxy, up, auth):
            if p is not None:
                p.kill()


@pytest.fixture(scope="module")
def passthrough(tmp_path_factory):
    """Pass-through mode: the official SDK's own resource-server auth upstream (its metadata names
    its internal URL), the proxy verifying tokens only to know the principal. The authorization
    server's issuer ends in "/": mcp==1.30.0 writes a root issuer with a trailing slash into its
    metadata, and the 2.3.0 client compares issuers as strings (RFC 8414 §3.3)."""
    tmp = tmp_path_factory.mktemp("oauth-passthrough")
    auth, started = AuthServer("--trailing-slash"), []

    def start(ports):
        # The upstream's metadata names the proxy's URL: its port is chosen first.
        [port] = ports
        resource = f"http://127.0.0.1:{port}/mcp"
        started.append(Upstream("--auth", auth.issuer, "--resource", resource))
        config = tmp / "proxy.toml"
        config.write_text((HERE / "proxy.toml").read_text()
                          + auth_toml(resource, auth.issuer, auth.base, require=False))
        started.append(Proxy(started[0].url, config=config, listen=f"127.0.0.1:{port}"))
        return {"as": auth, "up": started[0], "proxy": started[1], "resource": resource}

    def stop():
        while started:
            started.pop().kill()

    try:
        yield on_probed_ports(1, start, stop)
    finally:
        stop()
        auth.kill()


MODES = ["rs", "introspecting", "passthrough"]


# --- resource-server mode: the full flow with the official client --------------------------------


def test_the_client_discovers_everything_from_the_401_gets_a_token_and_completes_a_round(rs):
    auth, up, proxy = rs["as"], rs["up"], rs["proxy"]
    mark, before = up.mark(), auth.stats()
    user = OAuthUser(proxy.url, procs=[proxy.proc, rs["as"].proc])
    assert sdk_text(user.run(lambda c: c.call_tool("whoami", {}))) == "hello Ada"

    steps = [(x["method"], x["url"], x["status"]) for x in user.exchanges]
    well_known = metadata_url(proxy)
    assert steps[0] == ("POST", proxy.url, 401), steps
    assert steps[1] == ("GET", well_known, 200), steps
    assert ("GET", auth.base + "/.well-known/oauth-authorization-server", 200) in steps, steps
    assert ("POST", auth.base + "/register", 201) in steps, steps
    assert ("POST", auth.base + "/token", 200) in steps, steps
    after = auth.stats()
    assert after["registrations"] == before["registrations"] + 1
    [grant] = after["authorizations"][len(before["authorizations"]):]
    assert grant["resource"] == rs["resource"], "the client asked for the proxy's canonical URI (RFC 8707)"
    legs = user.calls("whoami")
    assert [x["status"] for x in legs] == [401, 200, 200], legs
    assert legs[1]["authorization"] == legs[2]["authorization"] is not None

    seen = up.seen(mark)
    assert len(rpcs(seen, "tools/call")) == 1 and len(answers(seen)) == 1, seen


def test_a_token_refreshed_between_the_first_leg_and_the_retry_resumes_the_call(rs):
    auth, up, proxy = rs["as"], rs["up"], rs["proxy"]
    mark, refreshes = up.mark(), auth.stats()["token_requests"]["refresh_token"]
    user = OAuthUser(proxy.url, refresh_on_elicit=True, procs=[proxy.proc, rs["as"].proc])
    assert sdk_text(user.run(lambda c: c.call_tool("whoami", {}))) == "hello Ada"

    legs = user.calls("whoami")
    assert [x["status"] for x in legs] == [401, 200, 200], legs
    _, first, second = legs
    assert first["authorization"] != second["authorization"], "the retry carried the refreshed token"
    assert second["authorization"] == f"Bearer {user.storage.tokens.access_token}"
    assert auth.stats()["token_requests"]["refresh_token"] == refreshes + 1
    seen = up.seen(mark)
    assert len(rpcs(seen, "tools/call")) == 1, "the retry resumed the parked call, not a new one"
    assert len(answers(seen)) == 1, seen


def test_the_upstream_never_sees_the_clients_token_but_sees_the_subject(rs):
    up, proxy = rs["up"], rs["proxy"]
    mark = up.mark()
    user = OAuthUser(proxy.url, procs=[proxy.proc, rs["as"].proc])
    assert sdk_text(user.run(lambda c: c.call_tool("whoami", {}))) == "hello Ada"
    seen = up.seen(mark)
    assert seen and all(e["authorization"] is None for e in seen), seen
    [call] = rpcs(seen, "tools/call")
    assert call["subject"] == "alice", call


def test_a_clients_own_subject_header_is_replaced_by_the_verified_one(rs):
    auth, up, proxy = rs["as"], rs["up"], rs["proxy"]
    mark = up.mark()
    reply = post(proxy.url, modern_call(1, "echo", {"text": "me"}), auth.token_for("frank", rs["resource"]),
                 extra_headers={"x-mcp-subject": "alice"})
    assert text_of(reply) == "me"
    [call] = rpcs(up.seen(mark), "tools/call")
    assert call["subject"] == "frank", call


def test_forward_authorization_sends_the_clients_token_upstream(rs, tmp_path):
    auth, up = rs["as"], rs["up"]
    proxy = start_proxy(tmp_path, up.url, lambda resource: auth_toml(
        resource, auth.issuer, auth.base, forward_authorization=True))
    try:
        mark = up.mark()
        token = auth.token_for("grace", proxy.url)
        assert text_of(post(proxy.url, modern_call(1, "echo", {"text": "fwd"}), token)) == "fwd"
        [call] = rpcs(up.seen(mark), "tools/call")
        assert call["authorization"] == f"Bearer {token}" and call["subject"] == "grace", call
    finally:
        proxy.kill()


def test_a_missing_scope_gets_403_naming_it_and_the_client_steps_up(rs):
    auth, proxy = rs["as"], rs["proxy"]
    reply = post(proxy.url, modern_call(1, "admin_tool"), auth.token_for("alice", rs["resource"], scope="mcp"))
    params = assert_challenge(reply, proxy, status=403, error="insufficient_scope")
    assert params.get("scope") == "admin", reply
    admin = post(proxy.url, modern_call(2, "admin_tool"), auth.token_for("alice", rs["resource"], scope="mcp admin"))
    assert text_of(admin) == "admin ok"

    before = len(auth.stats()["authorizations"])
    user = OAuthUser(proxy.url, procs=[proxy.proc, rs["as"].proc])

    async def echo_then_admin(c):
        await c.call_tool("echo", {"text": "hi"})
        return await c.call_tool("admin_tool", {})

    assert sdk_text(user.run(echo_then_admin)) == "admin ok"
    grants = auth.stats()["authorizations"][before:]
    assert [g["scope"].split() for g in grants] == [["mcp"], ["mcp", "admin"]], grants
    assert (403 in [x["status"] for x in user.calls("admin_tool")]), user.exchanges


# --- resource-server mode: the token rules on the wire -------------------------------------------


def test_without_a_token_the_proxy_answers_401_with_its_metadata_url(rs):
    proxy = rs["proxy"]
    reply = post(proxy.url, modern_call(1, "echo", {"text": "x"}))
    assert_challenge(reply, proxy, error=None)


@pytest.mark.parametrize("case", ["expired", "wrong_audience", "wrong_issuer", "forged_signature", "garbage"])
def test_an_invalid_token_gets_the_401_challenge(rs, case):
    auth, proxy, resource = rs["as"], rs["proxy"], rs["resource"]
    mark = rs["up"].mark()
    token = {
        "expired": lambda: auth.token_for("alice", resource, ttl=-120),
        "wrong_audience": lambda: auth.token_for("alice", "http://127.0.0.1:1/other-mcp"),
        "wrong_issuer": lambda: auth.mint(iss="http://127.0.0.1:1", sub="alice", aud=resource, scope="mcp",
                                          exp=int(time.time()) + 300),
        "forged_signature": lambda: auth.token_for("alice", resource, forge=True),
        "garbage": lambda: "not-a-jwt",
    }[case]()
    reply = post(proxy.url, modern_call(1, "echo", {"text": "x"}), token)
    assert_challenge(reply, proxy, error="invalid_token")
    assert rpcs(rs["up"].seen(mark), "tools/call") == [], "nothing reached the upstream"


def test_the_protected_resource_metadata_is_served_at_both_locations(rs):
    auth, proxy = rs["as"], rs["proxy"]
    expected = {"resource": rs["resource"], "authorization_servers": [auth.issuer],
                "scopes_supported": ["mcp"], "bearer_methods_supported": ["header"]}
    for url in (metadata_url(proxy), proxy.base + "/.well-known/oauth-protected-resource"):
        status, meta = get_json(url)
        assert status == 200
        assert {k: meta.get(k) for k in expected} == expected, (url, meta)


def test_a_rotated_signing_key_is_accepted_after_a_refetch(rs):
    auth, proxy, resource = rs["as"], rs["proxy"], rs["resource"]
    assert text_of(post(proxy.url, modern_call(1, "echo", {"text": "old key"}), auth.token_for("alice", resource))) \
        == "old key"
    fetches = auth.stats()["jwks_fetches"]
    new_kid = auth.rotate()
    token = auth.token_for("alice", resource)
    assert json.loads(urllib.request.urlopen(auth.base + "/jwks", timeout=WAIT_S).read())["keys"][0]["kid"] == new_kid
    assert text_of(post(proxy.url, modern_call(2, "echo", {"text": "new key"}), token)) == "new key"
    assert auth.stats()["jwks_fetches"] > fetches, "the unknown kid made the proxy fetch the JWKS again"


# --- every mode: the call belongs to the user, not to the token ----------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_another_users_token_on_the_retry_is_refused_and_the_owner_still_resumes(request, mode):
    stack = request.getfixturevalue(mode)
    auth, up, proxy, resource = stack["as"], stack["up"], stack["proxy"], stack["resource"]
    user = f"dana-{mode}"  # a principal of its own: pooled upstream sessions are per principal
    mark = up.mark()
    key, state = first_leg(proxy.url, auth.token_for(user, resource))
    refused = retry(proxy.url, auth.token_for(f"mallory-{mode}", resource), key, state, name="Mallory")
    assert refused.status == 400 and refused.body["error"]["code"] == -32602, refused
    assert answers(up.seen(mark)) == [], "the other user's answer never reached the upstream"
    done = retry(proxy.url, auth.token_for(user, resource), key, state, rpc_id=3)
    assert text_of(done) == "hello Ada"
    seen = up.seen(mark)
    assert len(rpcs(seen, "tools/call")) == 1 and len(answers(seen)) == 1, seen


# --- introspection mode ----------------------------------------------------------------------------


def test_introspection_mode_completes_a_round_with_a_refreshed_opaque_token(introspecting):
    auth, up, proxy = introspecting["as"], introspecting["up"], introspecting["proxy"]
    mark = up.mark()
    user = OAuthUser(proxy.url, refresh_on_elicit=True, procs=[proxy.proc, introspecting["as"].proc])
    assert sdk_text(user.run(lambda c: c.call_tool("whoami", {}))) == "hello Ada"
    assert "." not in user.storage.tokens.access_token, "opaque, not a JWT"
    legs = user.calls("whoami")
    assert [x["status"] for x in legs] == [401, 200, 200], legs
    assert legs[1]["authorization"] != legs[2]["authorization"]
    seen = up.seen(mark)
    assert len(rpcs(seen, "tools/call")) == 1 and len(answers(seen)) == 1, seen
    assert all(e["authorization"] is None for e in seen), seen


def test_introspection_results_are_cached(introspecting):
    auth, proxy = introspecting["as"], introspecting["proxy"]
    token = auth.token_for("erin", introspecting["resource"])
    before = auth.stats()["introspections"]
    assert text_of(post(proxy.url, modern_call(1, "echo", {"text": "one"}), token)) == "one"
    assert text_of(post(proxy.url, modern_call(2, "echo", {"text": "two"}), token)) == "two"
    assert auth.stats()["introspections"] - before == 1


def test_an_inactive_opaque_token_gets_the_401_challenge(introspecting):
    proxy = introspecting["proxy"]
    reply = post(proxy.url, modern_call(1, "echo", {"text": "x"}), "never-issued-by-the-server")
    assert_challenge(reply, proxy, error="invalid_token")


# --- an unreachable key source is the proxy's problem, not the client's ----------------------------


@pytest.mark.parametrize("principal", ["jwt", "introspection"])
def test_an_unreachable_key_source_gives_503_with_retry_after(rs, tmp_path, principal):
    auth = rs["as"]
    dead = f"http://127.0.0.1:{free_port()}"
    proxy = start_proxy(tmp_path, rs["up"].url, lambda resource: auth_toml(
        resource, auth.issuer, auth.base, principal=principal, jwks_uri=dead + "/jwks",
        introspection_endpoint=dead + "/introspect", secret_file=secret_file(tmp_path)))
    try:
        reply = post(proxy.url, modern_call(1, "echo", {"text": "x"}), auth.token_for("alice", proxy.url))
        assert reply.status == 503, reply
        assert reply.headers.get("retry-after", "").strip(), reply
    finally:
        proxy.kill()


# --- pass-through mode, in front of the SDK's own resource-server auth ---------------------------


def test_passthrough_relays_the_upstreams_401_with_the_proxys_metadata_url(passthrough):
    proxy, up = passthrough["proxy"], passthrough["up"]
    mark = up.mark()
    reply = post(proxy.url, modern_call(1, "echo", {"text": "x"}))
    assert_challenge(reply, proxy, error="invalid_token")
    assert up.base not in reply.headers["www-authenticate"], reply
    assert [e["status"] for e in up.seen(mark) if e["path"] == "/mcp"][-1:] == [401], "the upstream's own 401"


def test_passthrough_relays_the_upstreams_metadata_at_both_locations(passthrough):
    auth, proxy, up = passthrough["as"], passthrough["proxy"], passthrough["up"]
    _, internal = get_json(up.base + "/.well-known/oauth-protected-resource/mcp")
    assert internal["resource"] == up.url, "the upstream only knows its internal address"
    for url in (metadata_url(proxy), proxy.base + "/.well-known/oauth-protected-resource"):
        status, meta = get_json(url)
        assert status == 200
        assert meta == {**internal, "resource": passthrough["resource"]}, (url, meta)
        assert meta["authorization_servers"] == [auth.issuer]


def test_passthrough_each_leg_carries_its_own_token_to_the_upstream(passthrough):
    auth, up, proxy = passthrough["as"], passthrough["up"], passthrough["proxy"]
    mark, refreshes = up.mark(), auth.stats()["token_requests"]["refresh_token"]
    user = OAuthUser(proxy.url, refresh_on_elicit=True, procs=[proxy.proc, passthrough["as"].proc])
    assert sdk_text(user.run(lambda c: c.call_tool("whoami", {}))) == "hello Ada"
    assert auth.stats()["token_requests"]["refresh_token"] == refreshes + 1

    legs = user.calls("whoami")
    assert [x["status"] for x in legs] == [401, 200, 200], legs
    first_token, retry_token = legs[1]["authorization"], legs[2]["authorization"]
    assert first_token != retry_token, "refreshed between the first leg and the retry"
    seen = up.seen(mark)
    authorized_calls = [e for e in rpcs(seen, "tools/call") if e["status"] == 200]
    assert len(authorized_calls) == 1, seen
    assert authorized_calls[0]["authorization"] == first_token, "the token went upstream unchanged"
    [answer] = answers(seen)
    assert answer["authorization"] == retry_token, "the elicitation answer carried the retry's token"
    assert answer["status"] == 202, answer


# --- cluster: the retry with a refreshed token reaches the owner ---------------------------------


class OAuthCluster:
    """Three resource-server-mode replicas (one key, one [auth]) each before its own unauthenticated
    upstream, behind nginx round-robin; the canonical resource is the balancer's URL."""

    def __init__(self, tmp_path, auth):
        self.upstreams, self.proxies, self.nginx = [], [], None
        try:
            self._start(tmp_path, auth)
        except BaseException:
            self.close()
            raise

    def _start(self, tmp_path, auth):
        # The replicas and the balancer must know their ports before they start.
        on_probed_ports(REPLICAS + 1, lambda ports: self._start_on(tmp_path, auth, ports), self.close)

    def _start_on(self, tmp_path, auth, ports):
        self.upstreams, self.proxies, self.nginx = [], [], None
        *ports, lb_port = ports
        self.url = f"http://127.0.0.1:{lb_port}/mcp"
        peers = ", ".join(f'"http://127.0.0.1:{p}/mcp"' for p in ports)
        config = tmp_path / "proxy.toml"
        config.write_text(
            '[state]\nsecret = "a-cluster-key-shared-by-every-replica-0123"\ngather_window = "250ms"\n'
            f'[server]\nshutdown_grace = "1s"\n[cluster]\npeers = [{peers}]\n'
            + auth_toml(self.url, auth.issuer, auth.base))
        for port in ports:
            up = Upstream()
            self.upstreams.append(up)
            self.proxies.append(Proxy(up.url, config=config, listen=f"127.0.0.1:{port}"))
        servers = "\n".join(f"        server 127.0.0.1:{p} max_fails=0;" for p in ports)
        conf = tmp_path / "nginx.conf"
        conf.write_text(NGINX_CONF.format(dir=tmp_path, servers=servers, port=lb_port))
        self.nginx = Proc([NGINX, "-p", str(tmp_path), "-c", str(conf)])
        wait_tcp(lb_port, self.nginx)

    def total(self, name, **labels):
        return sum(p.metrics().sum(name, **labels) for p in self.proxies)

    def close(self):
        if self.nginx is not None:
            self.nginx.stop()
        for p in self.proxies + self.upstreams:
            p.kill()


CLUSTER_CALLS = 3


def test_cluster_a_refreshed_tokens_retry_forwarded_to_the_owner_resumes(rs, tmp_path):
    auth = rs["as"]
    cluster = None
    try:
        cluster = OAuthCluster(tmp_path, auth)
        marks = [u.mark() for u in cluster.upstreams]
        refreshes = auth.stats()["token_requests"]["refresh_token"]
        user = OAuthUser(cluster.url, refresh_on_elicit=True, procs=[auth.proc] + [p.proc for p in cluster.proxies])

        async def calls(c):
            return [await c.call_tool("whoami", {}) for _ in range(CLUSTER_CALLS)]

        assert [sdk_text(r) for r in user.run(calls)] == ["hello Ada"] * CLUSTER_CALLS
        assert auth.stats()["token_requests"]["refresh_token"] == refreshes + CLUSTER_CALLS
        legs = [x for x in user.calls("whoami") if x["status"] == 200]
        assert len(legs) == 2 * CLUSTER_CALLS
        for first, second in zip(legs[::2], legs[1::2]):
            assert first["authorization"] != second["authorization"], "each retry carried a refreshed token"
        assert cluster.total("mrtr_forwarded_retries_total", result="ok") > 0, "some retry met a non-owner"
        seen = [e for u, m in zip(cluster.upstreams, marks) for e in u.seen(m)]
        assert len(rpcs(seen, "tools/call")) == CLUSTER_CALLS and len(answers(seen)) == CLUSTER_CALLS, seen
        assert all(e["authorization"] is None for e in seen), seen
    finally:
        if cluster is not None:
            cluster.close()
