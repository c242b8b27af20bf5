"""The MCP Inspector (npm @modelcontextprotocol/inspector 2.12.0, its CLI), the tool a newcomer tries
first, against `mrtr-proxy demo` as they would run it, and against a real legacy server.

In the 2026-07-28 era (`--protocol-era modern`) it lists and calls tools through the proxy's
bridge; it declares neither elicitation nor sampling there, so a tool that asks gets -32021 and
the message names what is missing. In its default legacy era it reaches the demo's built-in server
as a legacy client: through the proxy (relayed) and with the server as its own stdio child. That
era's CLI sends `logging/setLevel` right after `initialize` and stops on an error, so every
command there also proves the demo serves it. Each run gets a home directory of its own (the
Inspector keeps a catalog and settings there), so runs in parallel share nothing.
"""

import json
import os
import subprocess

import pytest

from conftest import HERE, NODE, Proxy, proxy_binary, start_py_upstream
from procs import Proc

INSPECTOR = HERE / "inspector" / "node_modules" / "@modelcontextprotocol" / "inspector" / "clients" / "launcher" / "build" / "index.js"
RUN_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def demo():
    """`mrtr-proxy demo` on a free port, after its walkthrough: the proxy's URL."""
    proc = Proc([proxy_binary(), "demo", "--listen", "127.0.0.1:0"],
                env={k: v for k, v in os.environ.items() if k != "RUST_LOG"})
    try:
        url = proc.wait_for(r"mrtr-proxy \(2026-07-28 front\) at (http://\S+)").group(1)
        proc.wait_for(r"Protocol Era")
        yield url
    finally:
        proc.kill()


@pytest.fixture(scope="module")
def py_stack():
    """The official Python legacy server (mcp==1.30.0) with a proxy in front of it."""
    up, url = start_py_upstream()
    proxy = Proxy(url)
    try:
        yield proxy.url
    finally:
        proxy.kill()
        up.kill()


def inspector(home, *args):
    """Runs the Inspector's CLI (`--format json`); returns (exit code, stdout's JSON, stderr)."""
    assert INSPECTOR.exists(), f"{INSPECTOR} missing: run tests/run.sh (it runs npm ci there)"
    env = {**os.environ, "HOME": str(home)}
    out = subprocess.run([NODE, str(INSPECTOR), "--cli", *args, "--format", "json"], cwd=str(home),
                         env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    body = None
    for stream in (out.stdout, out.stderr):
        lines = [l for l in stream.splitlines() if l.startswith("{")]
        if lines and body is None:
            body = json.loads(lines[-1])
    return out.returncode, body, f"stdout:\n{out.stdout}\nstderr:\n{out.stderr}"


def tool_names(body):
    return {t["name"] for t in body["result"]["tools"]}


def text_of(body):
    return body["result"]["content"][0]["text"]


@pytest.mark.parametrize("server", ["demo", "py"])
def test_modern_era_lists_and_calls_tools_through_the_bridge(server, request, tmp_path):
    url = request.getfixturevalue("demo" if server == "demo" else "py_stack")
    modern = ("--protocol-era", "modern")
    code, body, out = inspector(tmp_path, url, *modern, "--method", "tools/list")
    assert code == 0, out
    assert {"echo", "ask_name"} <= tool_names(body), out
    code, body, out = inspector(tmp_path, url, *modern, "--method", "tools/call", "--tool-name", "echo",
                                "--tool-arg", "text=through the bridge")
    assert code == 0, out
    assert text_of(body) == "through the bridge", out
    assert body["result"]["resultType"] == "complete", out
    # It declares no elicitation in this era: the answer names the capability it would need.
    code, body, out = inspector(tmp_path, url, *modern, "--method", "tools/call", "--tool-name", "ask_name")
    assert code != 0, out
    assert "needs elicitation.form" in out, out


def test_legacy_era_reaches_the_demo_server_through_the_proxy(demo, tmp_path):
    code, body, out = inspector(tmp_path, demo, "--method", "tools/list")
    assert code == 0, out
    assert {"echo", "provision"} <= tool_names(body), out
    assert "resultType" not in json.dumps(body), "relayed untouched, not rewritten"
    code, body, out = inspector(tmp_path, demo, "--method", "logging/setLevel", "--log-level", "debug")
    assert (code, body) == (0, {"result": {}}), out
    code, body, out = inspector(tmp_path, demo, "--method", "resources/templates/list")
    assert code == 0, out
    assert body["result"]["resourceTemplates"][0]["uriTemplate"] == "demo://echo/{text}", out
    code, body, out = inspector(tmp_path, demo, "--method", "tools/call", "--tool-name", "progress",
                                "--tool-arg", "steps=2")
    assert code == 0, out
    assert text_of(body) == "done after 2 steps", out


def test_legacy_era_runs_the_demo_server_as_its_stdio_child(tmp_path):
    command = (proxy_binary(), "demo-upstream")
    code, body, out = inspector(tmp_path, *command, "--method", "tools/list")
    assert code == 0, out
    assert "echo" in tool_names(body), out
    code, body, out = inspector(tmp_path, *command, "--method", "prompts/list")
    assert code == 0, out
    assert body["result"]["prompts"][0]["name"] == "greeting", out
