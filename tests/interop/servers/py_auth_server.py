"""A legacy MCP server on the official Python SDK (mcp==1.30.0, FastMCP) that requires a bearer
token (the SDK's own resource-server auth: 401 + WWW-Authenticate, protected-resource metadata under
/.well-known/). Only `Bearer good-token` is accepted. Binds 127.0.0.1:0 and prints `READY <port>`.
"""

import asyncio
import socket
import sys

import uvicorn
from mcp.server.auth.provider import AccessToken, TokenVerifier
from mcp.server.auth.settings import AuthSettings
from mcp.server.fastmcp import Context, FastMCP
from pydantic import BaseModel

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


async def main() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    config = uvicorn.Config(build(port).streamable_http_app(), log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    print(f"READY {port}", flush=True)
    await task


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
