"""A small, real OAuth 2.1 authorization server for the OAuth tests (Starlette + PyJWT).

RFC 8414 metadata (also at the OIDC well-known URL), dynamic client registration (RFC 7591), an
/authorize that approves at once (PKCE S256 required), /token for the authorization_code and
refresh_token grants (refresh tokens rotate), RFC 8707 `resource` → the access token's `aud`,
RS256 JWT access tokens (or opaque ones with `--opaque`), /jwks, and RFC 7662 /introspect behind
HTTP Basic client authentication (`--introspection-client id:secret`, or the environment variable
MRTR_AS_INTROSPECTION_CLIENT). The issuer is `http://127.0.0.1:<port>`, or with `--trailing-slash`
`http://127.0.0.1:<port>/`. Test hooks, under /test/: `user` (who signs in next), `rotate` (a
new signing key; the old one leaves /jwks), `mint` (a token with exactly the given claims) and
`stats` (what was asked of it). Binds 127.0.0.1:0 and prints `READY <port>`.
"""

import argparse
import base64
import hashlib
import json
import os
import secrets
import time
from urllib.parse import unquote, urlencode

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from serve import serve

SCOPES = ["mcp", "admin"]
CODE_TTL_S = 120


def b64url_sha256(text: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).decode().rstrip("=")


class SigningKey:
    def __init__(self):
        self.private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.kid = secrets.token_hex(8)

    def jwk(self) -> dict:
        jwk = jwt.algorithms.RSAAlgorithm.to_jwk(self.private.public_key(), as_dict=True)
        return {**jwk, "kid": self.kid, "alg": "RS256", "use": "sig"}

    def sign(self, claims: dict, kid: str | None = None) -> str:
        return jwt.encode(claims, self.private, algorithm="RS256", headers={"kid": kid or self.kid})


class AuthorizationServer:
    def __init__(self, base: str, issuer: str, ttl_s: int, opaque: bool,
                 introspection_client: tuple[str, str] | None):
        self.base = base
        self.issuer = issuer
        self.ttl_s = ttl_s
        self.opaque = opaque
        self.introspection_client = introspection_client
        self.key = SigningKey()
        self.user = "alice"
        self.clients: dict[str, dict] = {}
        self.codes: dict[str, dict] = {}
        self.refresh_tokens: dict[str, dict] = {}
        self.opaque_tokens: dict[str, dict] = {}
        self.stats = {"introspections": 0, "jwks_fetches": 0, "registrations": 0,
                      "authorizations": [], "token_requests": {"authorization_code": 0, "refresh_token": 0}}

    # --- tokens ------------------------------------------------------------------------------

    def issue_access_token(self, sub: str, client_id: str, scope: str, resource: str | None) -> str:
        now = int(time.time())
        claims = {"iss": self.issuer, "sub": sub, "iat": now, "exp": now + self.ttl_s,
                  "scope": scope, "jti": secrets.token_hex(12), "client_id": client_id}
        if resource:
            claims["aud"] = resource
        return self.encode(claims)

    def encode(self, claims: dict, kid: str | None = None, forge: bool = False) -> str:
        if self.opaque:
            token = secrets.token_urlsafe(32)
            self.opaque_tokens[token] = claims
            return token
        key = SigningKey() if forge else self.key
        return key.sign(claims, kid or (self.key.kid if forge else None))

    def decode(self, token: str) -> dict | None:
        """The claims of a token this server issued and that is still valid, else None."""
        now = time.time()
        if self.opaque:
            claims = self.opaque_tokens.get(token)
        else:
            try:
                header = jwt.get_unverified_header(token)
                if header.get("kid") != self.key.kid:
                    return None
                claims = jwt.decode(token, self.key.private.public_key(), algorithms=["RS256"],
                                    options={"verify_aud": False, "verify_exp": False, "require": []})
            except jwt.PyJWTError:
                return None
        if claims is None or claims.get("iss") != self.issuer:
            return None
        if "exp" in claims and claims["exp"] <= now:
            return None
        return claims

    # --- endpoints ---------------------------------------------------------------------------

    async def metadata(self, request: Request) -> Response:
        i = self.base
        return JSONResponse({
            "issuer": self.issuer,
            "authorization_endpoint": f"{i}/authorize",
            "token_endpoint": f"{i}/token",
            "registration_endpoint": f"{i}/register",
            "jwks_uri": f"{i}/jwks",
            "introspection_endpoint": f"{i}/introspect",
            "scopes_supported": SCOPES,
            "response_types_supported": ["code"],
            "grant_types_supported": ["authorization_code", "refresh_token"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["none", "client_secret_post", "client_secret_basic"],
            "introspection_endpoint_auth_methods_supported": ["client_secret_basic"],
        })

    async def jwks(self, request: Request) -> Response:
        self.stats["jwks_fetches"] += 1
        return JSONResponse({"keys": [] if self.opaque else [self.key.jwk()]})

    async def register(self, request: Request) -> Response:
        try:
            meta = await request.json()
        except ValueError:
            return oauth_error("invalid_client_metadata", "body is not JSON")
        uris = meta.get("redirect_uris")
        if not isinstance(uris, list) or not uris:
            return oauth_error("invalid_redirect_uri", "redirect_uris is required")
        method = meta.get("token_endpoint_auth_method") or "client_secret_basic"
        if method not in ("none", "client_secret_post", "client_secret_basic"):
            return oauth_error("invalid_client_metadata", f"unsupported token_endpoint_auth_method {method}")
        client = {**meta, "client_id": secrets.token_hex(8), "client_id_issued_at": int(time.time()),
                  "token_endpoint_auth_method": method,
                  "grant_types": meta.get("grant_types") or ["authorization_code", "refresh_token"],
                  "response_types": ["code"]}
        if method != "none":
            client["client_secret"] = secrets.token_hex(16)
            client["client_secret_expires_at"] = 0
        self.clients[client["client_id"]] = client
        self.stats["registrations"] += 1
        return JSONResponse(client, status_code=201)

    async def authorize(self, request: Request) -> Response:
        q = request.query_params
        client = self.clients.get(q.get("client_id", ""))
        if client is None:
            return oauth_error("invalid_client", "unknown client_id")
        redirect_uri = q.get("redirect_uri") or client["redirect_uris"][0]
        if redirect_uri not in client["redirect_uris"]:
            return oauth_error("invalid_request", "redirect_uri is not registered")

        def back(**params) -> Response:
            if q.get("state") is not None:
                params["state"] = q["state"]
            sep = "&" if "?" in redirect_uri else "?"
            return RedirectResponse(f"{redirect_uri}{sep}{urlencode(params)}", status_code=302)

        if q.get("response_type") != "code":
            return back(error="unsupported_response_type")
        if q.get("code_challenge_method") != "S256" or not q.get("code_challenge"):
            return back(error="invalid_request", error_description="PKCE with S256 is required")
        scope = q.get("scope") or "mcp"
        if any(s not in SCOPES for s in scope.split()):
            return back(error="invalid_scope")
        code = secrets.token_urlsafe(24)
        self.codes[code] = {"client_id": client["client_id"], "redirect_uri": redirect_uri,
                            "challenge": q["code_challenge"], "scope": scope, "resource": q.get("resource"),
                            "sub": self.user, "expires": time.time() + CODE_TTL_S}
        self.stats["authorizations"].append({"client_id": client["client_id"], "scope": scope,
                                             "resource": q.get("resource"), "sub": self.user})
        return back(code=code)

    def authenticate_client(self, request: Request, form) -> dict | None:
        """The registered client a token request comes from (RFC 6749 §2.3), else None."""
        basic = parse_basic(request.headers.get("authorization"))
        client_id = basic[0] if basic else form.get("client_id")
        client = self.clients.get(client_id or "")
        if client is None:
            return None
        method = client["token_endpoint_auth_method"]
        if method == "none":
            return client
        secret = basic[1] if basic else form.get("client_secret")
        if secret is None or not secrets.compare_digest(secret, client["client_secret"]):
            return None
        return client

    async def token(self, request: Request) -> Response:
        form = await request.form()
        client = self.authenticate_client(request, form)
        if client is None:
            return oauth_error("invalid_client", "client authentication failed", 401)
        grant = form.get("grant_type")
        if grant == "authorization_code":
            self.stats["token_requests"]["authorization_code"] += 1
            code = self.codes.pop(form.get("code", ""), None)
            if code is None or code["client_id"] != client["client_id"] or code["expires"] < time.time():
                return oauth_error("invalid_grant", "unknown, used or expired code")
            if form.get("redirect_uri") != code["redirect_uri"]:
                return oauth_error("invalid_grant", "redirect_uri does not match the authorization request")
            verifier = form.get("code_verifier") or ""
            if not secrets.compare_digest(b64url_sha256(verifier), code["challenge"]):
                return oauth_error("invalid_grant", "PKCE verification failed")
            resource = form.get("resource") or code["resource"]
            if code["resource"] and resource != code["resource"]:
                return oauth_error("invalid_target", "resource differs from the authorization request")
            grant_record = {"client_id": client["client_id"], "scope": code["scope"], "resource": resource,
                            "sub": code["sub"]}
        elif grant == "refresh_token":
            self.stats["token_requests"]["refresh_token"] += 1
            old = self.refresh_tokens.pop(form.get("refresh_token", ""), None)
            if old is None or old["client_id"] != client["client_id"]:
                return oauth_error("invalid_grant", "unknown or used refresh token")
            resource = form.get("resource") or old["resource"]
            if old["resource"] and resource != old["resource"]:
                return oauth_error("invalid_target", "resource differs from the original grant")
            scope = form.get("scope") or old["scope"]
            if any(s not in old["scope"].split() for s in scope.split()):
                return oauth_error("invalid_scope", "a refresh cannot widen the scope")
            grant_record = {**old, "scope": scope}
        else:
            return oauth_error("unsupported_grant_type", f"grant_type {grant!r}")
        refresh = secrets.token_urlsafe(32)
        self.refresh_tokens[refresh] = grant_record
        access = self.issue_access_token(grant_record["sub"], grant_record["client_id"], grant_record["scope"],
                                         grant_record["resource"])
        return JSONResponse({"access_token": access, "token_type": "Bearer", "expires_in": self.ttl_s,
                             "scope": grant_record["scope"], "refresh_token": refresh},
                            headers={"cache-control": "no-store"})

    async def introspect(self, request: Request) -> Response:
        basic = parse_basic(request.headers.get("authorization"))
        if self.introspection_client is None or basic is None or not (
            secrets.compare_digest(basic[0], self.introspection_client[0])
            and secrets.compare_digest(basic[1], self.introspection_client[1])
        ):
            return JSONResponse({"error": "invalid_client"}, status_code=401,
                                headers={"www-authenticate": 'Basic realm="introspection"'})
        self.stats["introspections"] += 1
        form = await request.form()
        claims = self.decode(form.get("token", ""))
        if claims is None:
            return JSONResponse({"active": False})
        answer = {"active": True, "token_type": "Bearer"}
        for name in ("sub", "iss", "exp", "iat", "scope", "aud", "client_id", "jti"):
            if name in claims:
                answer[name] = claims[name]
        return JSONResponse(answer)

    # --- test hooks --------------------------------------------------------------------------

    async def set_user(self, request: Request) -> Response:
        self.user = (await request.json())["sub"]
        return JSONResponse({"sub": self.user})

    async def rotate(self, request: Request) -> Response:
        self.key = SigningKey()
        return JSONResponse({"kid": self.key.kid})

    async def mint(self, request: Request) -> Response:
        """A token with exactly the claims in the body, except the keys `kid` (the header's kid) and
        `forge` (sign with a key this server never published, under the current kid)."""
        claims = await request.json()
        kid = claims.pop("kid", None)
        forge = bool(claims.pop("forge", False))
        return JSONResponse({"token": self.encode(claims, kid=kid, forge=forge), "kid": kid or self.key.kid})

    async def get_stats(self, request: Request) -> Response:
        return JSONResponse({**self.stats, "kid": self.key.kid, "user": self.user,
                             "issuer": self.issuer, "ttl": self.ttl_s})

    def app(self) -> Starlette:
        return Starlette(routes=[
            Route("/.well-known/oauth-authorization-server", self.metadata),
            Route("/.well-known/openid-configuration", self.metadata),
            Route("/jwks", self.jwks),
            Route("/register", self.register, methods=["POST"]),
            Route("/authorize", self.authorize),
            Route("/token", self.token, methods=["POST"]),
            Route("/introspect", self.introspect, methods=["POST"]),
            Route("/test/user", self.set_user, methods=["POST"]),
            Route("/test/rotate", self.rotate, methods=["POST"]),
            Route("/test/mint", self.mint, methods=["POST"]),
            Route("/test/stats", self.get_stats),
        ])


def oauth_error(error: str, description: str, status: int = 400) -> Response:
    return JSONResponse({"error": error, "error_description": description}, status_code=status,
                        headers={"cache-control": "no-store"})


def parse_basic(header: str | None) -> tuple[str, str] | None:
    if not header or not header.lower().startswith("basic "):
        return None
    try:
        user, _, password = base64.b64decode(header[6:].strip()).decode().partition(":")
    except ValueError:
        return None
    return unquote(user), unquote(password)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ttl", type=int, default=300, help="access token lifetime in seconds")
    parser.add_argument("--opaque", action="store_true", help="opaque access tokens (introspection only)")
    parser.add_argument("--trailing-slash", action="store_true",
                        help="issuer `http://127.0.0.1:<port>/` instead of `http://127.0.0.1:<port>` (the form the "
                        "mcp==1.30.0 server writes into its protected-resource metadata)")
    parser.add_argument("--introspection-client", default=os.environ.get("MRTR_AS_INTROSPECTION_CLIENT"),
                        help="id:secret a caller of /introspect authenticates with (HTTP Basic)")
    args = parser.parse_args()
    client = None
    if args.introspection_client:
        cid, _, secret = args.introspection_client.partition(":")
        client = (cid, secret)

    def build(port: int) -> Starlette:
        base = f"http://127.0.0.1:{port}"
        issuer = base + "/" if args.trailing_slash else base
        return AuthorizationServer(base, issuer, args.ttl, args.opaque, client).app()

    serve(build)


if __name__ == "__main__":
    main()
