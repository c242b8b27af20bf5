"""A client of the tasks extension from another ecosystem: the FastMCP 4 client with its tasks
support (PyPI fastmcp-tasks==4.1.4, on mcp==2.3.0), pinned to 2026-07-28. FastMCP declares the
extension on every call; of the inputs a task may ask for it answers only elicitation.

Usage: python py_tasks_client.py URL '<plan JSON>'
plan: {"tool": name, "arguments": {..}, "mode": "result" | "cancel", "hold": bool}
  result (default) `call_tool_task` (fails unless the call became a task), wait until the task
         asks for input, then `result()`, which answers it through the elicitation handler and
         polls to the end; with `"hold": true`, between the two it prints
         `{"held": task_id, "input_keys": [..]}` and waits for a line on stdin (the test acts on
         the task meanwhile: a person who has not answered yet)
  cancel `call_tool_task`, `cancel()`, then wait for the task's final status
Every elicitation is accepted with {"name": "Ada"}. Prints one JSON line: task_id, statuses
(what tasks/get said, in order), elicitations (their messages), text, final, error.

FastMCP 4.1.4 sends no `Mcp-Name` on `tasks/get|update|cancel` (its request types declare no
`name_param` for mcp's `send_request` to mirror), where the tasks extension says the client MUST
set it to `params.taskId` and the proxy refuses the request without it (400 + -32020). So the
client mirrors it here, in an httpx auth hook, as a deployment of this FastMCP must; the plan's
`"mirror_task_id": false` leaves the client as it ships (the test that it is refused).
"""

import asyncio
import json
import sys

import httpx2
from fastmcp import Client
from fastmcp.client.elicitation import ElicitResult
from fastmcp.client.transports import StreamableHttpTransport
from fastmcp_tasks.client import call_tool_task

RUN_TIMEOUT_S = 30
WAIT_S = 20


class MirrorTaskId(httpx2.Auth):
    """Sets `Mcp-Name` to `params.taskId` on a `tasks/*` POST that has none."""

    requires_request_body = True

    def auth_flow(self, request):
        if "mcp-name" not in request.headers:
            try:
                body = json.loads(request.content or b"null")
            except ValueError:
                body = None
            if isinstance(body, dict) and str(body.get("method", "")).startswith("tasks/"):
                task_id = (body.get("params") or {}).get("taskId")
                if isinstance(task_id, str):
                    request.headers["Mcp-Name"] = task_id
        yield request


async def main(url, plan, out):
    async def on_elicit(message, response_type, params, context):
        out["elicitations"].append(message)
        return ElicitResult(action="accept", content={"name": "Ada"})

    auth = MirrorTaskId() if plan.get("mirror_task_id", True) else None
    transport = StreamableHttpTransport(url, auth=auth)
    async with Client(transport, mode="2026-07-28", elicitation_handler=on_elicit) as client:
        task = await call_tool_task(client, plan["tool"], plan.get("arguments", {}))
        out["task_id"] = task.task_id
        out["statuses"].append(task.create_result.status)
        if plan.get("mode", "result") == "cancel":
            await task.cancel()
            out["final"] = (await task.wait(timeout=WAIT_S)).status
            out["statuses"].append(out["final"])
            return
        asked = await task.wait(state="input_required", timeout=WAIT_S)
        out["statuses"].append(asked.status)
        out["input_keys"] = sorted(asked.input_requests or {})
        if plan.get("hold"):
            print(json.dumps({"held": task.task_id, "input_keys": out["input_keys"]}), flush=True)
            await asyncio.to_thread(sys.stdin.readline)
        result = await task.result()
        out["text"] = result.content[0].text
        out["final"] = (await task.status()).status
        out["statuses"].append(out["final"])


if __name__ == "__main__":
    out = {"statuses": [], "elicitations": []}
    try:
        asyncio.run(asyncio.wait_for(main(sys.argv[1], json.loads(sys.argv[2]), out), RUN_TIMEOUT_S))
    except Exception as e:  # noqa: BLE001 - reported in the transcript, for the test to show
        out["error"] = f"{type(e).__name__}: {e}"
    print(json.dumps(out))
