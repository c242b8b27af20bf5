"""A legacy client on the official Python SDK (mcp==1.30.0): initialize, list tools, a plain call
and a call that elicits (answered inline, the legacy way). Prints one JSON line."""

import asyncio
import json
import sys

from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client
from mcp.types import ElicitResult


async def elicit(context, params):
    return ElicitResult(action="accept", content={"name": "Linus"})


async def main(url):
    async with streamablehttp_client(url) as (read, write, _):
        async with ClientSession(read, write, elicitation_callback=elicit) as s:
            init = await s.initialize()
            tools = await s.list_tools()
            echo = await s.call_tool("echo", {"text": "legacy-hi"})
            ask = await s.call_tool("ask_name", {})
            print(json.dumps({
                "protocol": init.protocolVersion,
                "tools": [t.name for t in tools.tools],
                "echo": echo.content[0].text,
                "ask_name": ask.content[0].text,
            }))


asyncio.run(asyncio.wait_for(main(sys.argv[1]), 50))
