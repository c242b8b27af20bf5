"""A 2025-11-25 server whose tools run only as tasks (`execution.taskSupport: "required"`), behind
the proxy: the official Python SDK's experimental tasks (mcp==1.30.0, servers/py_task_server.py)
on Streamable HTTP and stdio. Called plainly such a tool answers -32601; the proxy calls it again
task-augmented and waits on `tasks/result`, whose stream carries the task's elicitation. A
modern client without the tasks extension (the official TypeScript client pinned to 2026-07-28)
gets that elicitation as an ordinary input_required round and then the result; one with the
extension (@modelcontextprotocol/ext-tasks) gets a task of the extension over the legacy task.
"""

import pytest

from conftest import HERE, PY_LEGACY, Proxy, run_ts_client
from procs import Proc
from test_tasks import run_tasks_client

SERVER = HERE / "servers" / "py_task_server.py"


def start_http():
    proc = Proc([str(PY_LEGACY), str(SERVER)])
    port = proc.wait_for(r"READY (\d+)").group(1)
    return proc, f"http://127.0.0.1:{port}/mcp"


def stdio():
    return None, [str(PY_LEGACY), str(SERVER), "--stdio"]


# The interop gather window, and the approval tool as a task of the extension at once.
CONFIG = """[state]
gather_window = "250ms"
[tasks.tools]
task_ask = "always"
"""


@pytest.fixture(scope="module", params=["http", "stdio"])
def proxy(request, tmp_path_factory):
    config = tmp_path_factory.mktemp("legacy-tasks") / "proxy.toml"
    config.write_text(CONFIG)
    up, target = {"http": start_http, "stdio": stdio}[request.param]()
    proxy = Proxy(target, config=config)
    yield proxy
    proxy.kill()
    if up is not None:
        up.kill()


def text_of(result):
    return result["content"][0]["text"]


def test_a_task_required_tool_runs_behind_one_ordinary_call(proxy):
    out = run_ts_client(proxy.url, [{"op": "callTool", "name": "task_slow", "arguments": {"ms": 50}}])
    assert "error" not in out, out
    assert text_of(out["results"][0]) == "slept 50"


def test_a_task_s_elicitation_becomes_a_round_for_a_client_without_the_extension(proxy):
    out = run_ts_client(proxy.url, [{"op": "callTool", "name": "task_ask", "arguments": {}}])
    assert "error" not in out, out
    result = out["results"][0]
    assert text_of(result) == "Approved by Grace"
    assert out["counts"]["elicitation"] == 1, out
    assert "io.modelcontextprotocol/related-task" not in result.get("_meta", {}), result


def test_a_failed_legacy_task_fails_the_call_with_its_message(proxy):
    out = run_ts_client(proxy.url, [{"op": "callTool", "name": "task_fail", "arguments": {}}])
    assert "the disk is full" in out.get("error", ""), out


def test_a_legacy_task_becomes_a_task_of_the_extension_for_a_client_that_has_it(proxy):
    t = run_tasks_client(proxy.url, {"tool": "task_ask", "arguments": {}})
    assert t["kind"] == "task", t
    statuses = [e["status"] for e in t["events"]]
    assert "input_required" in statuses, statuses
    assert t["outcome"]["status"] == "completed", t["outcome"]
    assert text_of(t["outcome"]["result"]) == "Approved by Grace"
