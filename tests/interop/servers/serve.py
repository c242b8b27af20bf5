"""Shared start-up of the Python test servers: bind 127.0.0.1:0 (or the port in `MRTR_SERVE_PORT`,
so that the soak can restart a killed server where the proxy expects it), build the ASGI app for
that port, serve it with uvicorn, and print `READY <port>` once it accepts connections."""

import asyncio
import os
import socket
from typing import Any, Callable


def serve(build_app: Callable[[int], Any]) -> None:
    asyncio.run(_serve(build_app))


async def _serve(build_app: Callable[[int], Any]) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", int(os.environ.get("MRTR_SERVE_PORT", "0"))))
    sock.listen(128)
    port = sock.getsockname()[1]
    import uvicorn

    config = uvicorn.Config(build_app(port), log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    print(f"READY {port}", flush=True)
    await task
