"""A legacy MCP server on the official Python SDK (mcp==1.30.0, FastMCP) that requires a bearer
token (the SDK's own resource-server auth: 401 + WWW-Authenticate, protected-resource metadata under
/.well-known/). Only `Bearer good-token` is accepted. Binds 127.0.0.1:0 and prints `READY <port>`.
"""

from mcp.server.auth.provider import AccessToken, TokenVerifier
from mcp.server.auth.settings import AuthSettings
from mcp.server.fastmcp import Context, FastMCP
from pydantic import BaseModel

from serve import serve

GOOD_TOKEN = "good-token"


class Verifier(TokenVerifier):
    async def verify_token(self, token: str) -> AccessToken | None:
        if token == GOOD_TOKEN:
            return AccessToken(token=token, client_id="tester", scopes=[])
        return None


class Name(BaseModel):
    name: str


def build(port: int) -> FastMCP:
    mcp = FastMCP(
        "py-auth-server",
        token_verifier=Verifier(),
        auth=AuthSettings(
            issuer_url="https://auth.example",
            resource_server_url=f"http://127.0.0.1:{port}/mcp",
            required_scopes=[],
            validate_token_resource=False,
        ),
    )

    @mcp.tool()
    async def whoami(ctx: Context) -> str:
        """Elicits a name (an authenticated MRTR round)."""
        r = await ctx.elicit("Name?", schema=Name)
        return f"hello {r.data.name}" if r.action == "accept" else f"<{r.action}>"

    return mcp


if __name__ == "__main__":
    serve(lambda port: build(port).streamable_http_app())
