"""A legacy MCP server on the official Python SDK (mcp==1.30.0, FastMCP, Streamable HTTP on /mcp)
for the OAuth tests, which records every HTTP request it receives.

`whoami` elicits a form {name} and returns "hello <name>"; `admin_tool` returns "admin ok"; `echo`
returns its text. With `--auth <issuer>` it requires a bearer token with scope `mcp` through the
SDK's own resource-server auth: a TokenVerifier that checks the RS256 JWT against the issuer's JWKS
(refetched on an unknown kid), its issuer (exactly `--auth`), expiry and that its audience is
`--resource` (the proxy's public URL; by default its own URL). Its protected-resource metadata names
its OWN internal URL as `resource`, as a server that only knows its internal address does. Without
`--auth` it has no auth at all.

GET /test/seen (outside the auth) answers the record: one entry per request with the HTTP method,
path, the JSON-RPC method and id (or "response to id N" for an answer POST), the Authorization and
x-mcp-subject headers, the session id and the status it answered. Binds 127.0.0.1:0 and prints
`READY <port>`.
"""

import argparse
import json
import time
import urllib.request

import jwt
from mcp.server.auth.provider import AccessToken, TokenVerifier
from mcp.server.auth.settings import AuthSettings
from mcp.server.fastmcp import Context, FastMCP
from pydantic import BaseModel

from serve import serve

JWKS_TIMEOUT_S = 5


class Name(BaseModel):
    name: str


class JwtVerifier(TokenVerifier):
    """RS256 access tokens of one issuer for one audience, keys from the issuer's JWKS."""

    def __init__(self, issuer: str, audience: str):
        self.issuer = issuer
        self.audience = audience
        self.keys: dict[str, object] = {}

    def fetch_keys(self) -> None:
        with urllib.request.urlopen(self.issuer.rstrip("/") + "/jwks", timeout=JWKS_TIMEOUT_S) as r:
            jwks = json.loads(r.read())
        self.keys = {k["kid"]: jwt.algorithms.RSAAlgorithm.from_jwk(k) for k in jwks["keys"]}

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            kid = jwt.get_unverified_header(token).get("kid")
            if kid not in self.keys:
                self.fetch_keys()
            key = self.keys.get(kid)
            if key is None:
                return None
            claims = jwt.decode(token, key, algorithms=["RS256"], issuer=self.issuer, audience=self.audience,
                                options={"require": ["exp", "iss", "sub", "aud"]})
        except (jwt.PyJWTError, OSError, ValueError):
            return None
        return AccessToken(token=token, client_id=str(claims.get("client_id", "unknown")),
                           scopes=str(claims.get("scope", "")).split(), expires_at=int(claims["exp"]),
                           resource=self.audience, subject=str(claims["sub"]), claims={"iss": claims["iss"]})


class Recorder:
    """ASGI wrapper: records each HTTP request (and the status answered) and serves the record at
    GET /test/seen, in front of any auth."""

    def __init__(self, app):
        self.app = app
        self.seen: list[dict] = []

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if scope["path"] == "/test/seen":
            body = json.dumps(self.seen).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        entry = {"http": scope["method"], "path": scope["path"], "at": time.time(),
                 "authorization": headers.get("authorization"), "subject": headers.get("x-mcp-subject"),
                 "session": headers.get("mcp-session-id"), "status": None}
        entry.update(describe(body))
        self.seen.append(entry)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        async def record_status(message):
            if message["type"] == "http.response.start":
                entry["status"] = message["status"]
            await send(message)

        await self.app(scope, replay, record_status)


def describe(body: bytes) -> dict:
    """What a POST body is, in JSON-RPC terms: {"rpc": method or "response to id N", "id": …}."""
    if not body:
        return {"rpc": None, "id": None}
    try:
        message = json.loads(body)
    except ValueError:
        return {"rpc": "<not json>", "id": None}
    if isinstance(message, list):
        message = message[0] if message else {}
    if not isinstance(message, dict):
        return {"rpc": "<not an object>", "id": None}
    if "method" in message:
        return {"rpc": message["method"], "id": message.get("id")}
    return {"rpc": f"response to id {message.get('id')}", "id": message.get("id")}


def build(port: int, args) -> object:
    kwargs = {}
    if args.auth:
        own_url = f"http://127.0.0.1:{port}/mcp"
        kwargs["token_verifier"] = JwtVerifier(args.auth, args.resource or own_url)
        kwargs["auth"] = AuthSettings(
            issuer_url=args.auth,
            resource_server_url=own_url,
            required_scopes=["mcp"],
            validate_token_resource=False,
        )
    mcp = FastMCP("py-oauth-upstream", **kwargs)

    @mcp.tool()
    async def whoami(ctx: Context) -> str:
        """Asks for a name (one elicitation round), then greets it."""
        r = await ctx.elicit("What is your name?", schema=Name)
        return f"hello {r.data.name}" if r.action == "accept" else f"<{r.action}>"

    @mcp.tool()
    async def admin_tool() -> str:
        """A tool the proxy reserves for tokens with scope `admin`."""
        return "admin ok"

    @mcp.tool()
    async def echo(text: str) -> str:
        """Echoes text."""
        return text

    return Recorder(mcp.streamable_http_app())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--auth", help="base URL of the authorization server (turns auth on)")
    parser.add_argument("--resource", help="the audience tokens must carry (the proxy's public URL; "
                        "default: this server's own URL)")
    args = parser.parse_args()
    serve(lambda port: build(port, args))


if __name__ == "__main__":
    main()
