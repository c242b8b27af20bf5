"""The approval gate on the real binary, with real peers: the official Python legacy server
(mcp==1.30.0, recording every request it answers) behind the proxy; in front, the official
modern clients (Python mcp==2.3.0 and TS @modelcontextprotocol/client 2.4.0, pinned to
2026-07-28), raw HTTP for the token rules, and a legacy client (Python mcp==1.30.0).

Gated here: `echo` (a message naming the argument `text`, an extra required form field
`reason`, its own decline text) and, by the glob `ask_*`, `ask_name` (a tool that elicits itself
once approved). Whether the upstream saw a `tools/call` is read on the upstream's side, from the
`REC` lines of its recording middleware; "it did not" is checked against a later call that did
(the barrier), never by waiting.
"""

import json
import os
import subprocess
import textwrap
import time
import urllib.error
import urllib.request

import pytest
from mcp.types import ElicitResult

from conftest import HERE, NODE, PY_LEGACY, Proxy, sse_messages, start_py_upstream
from test_cluster import Cluster
from test_modern_clients import PyClient, text_of

ECHO_DECLINED = "Not approved: echo did not run."
ASK_DECLINED = "Not approved: nobody was asked."
APPROVAL_TOML = f"""
[approval.tools.echo]
message = "Echo {{text}} back to you?"
schema = {{ properties = {{ reason = {{ type = "string" }} }}, required = ["reason"] }}
on_decline = "{ECHO_DECLINED}"

[approval.tools."ask_*"]
message = "Let the tool ask your name?"
on_decline = "{ASK_DECLINED}"
"""
CONFIG = '[state]\ngather_window = "250ms"\n' + APPROVAL_TOML
ELICIT_CAPS = {"elicitation": {"form": {}}}
APPROVE = {"action": "accept", "content": {"approve": True, "reason": "because"}}
WAIT_S = 20
SUBPROCESS_TIMEOUT_S = 60


# --- helpers -----------------------------------------------------------------------------------


def upstream_calls(up):
    """How many `tools/call` requests the upstream has answered so far."""
    with up.cond:
        lines = list(up.lines)
    return sum(1 for l in lines if l.startswith("REC ") and json.loads(l[4:]).get("method") == "tools/call")


def wait_upstream_calls(up, at_least):
    """Waits (bounded) until the upstream has answered `at_least` tools/call requests; returns the count."""
    deadline = time.monotonic() + WAIT_S
    with up.cond:
        while True:
            n = sum(1 for l in up.lines if l.startswith("REC ") and json.loads(l[4:]).get("method") == "tools/call")
            left = deadline - time.monotonic()
            if n >= at_least or left <= 0 or up.p.poll() is not None:
                return n
            up.cond.wait(left)


def approvals(proxy, decision):
    return proxy.metrics().sum("mrtr_approvals_total", decision=decision)


class Approver(PyClient):
    """mcp==2.3.0 client whose elicitation callback records every request it sees, answers the
    approval form with `approval` and any other form (the tool's own question) with "Ada"."""

    def __init__(self, url, approval=ElicitResult(**APPROVE)):
        super().__init__(url, sampling=False, roots=False)
        self.approval = approval
        self.seen = []

    async def _elicit(self, ctx, params):
        asked = params.model_dump(by_alias=True, exclude_none=True)
        self.seen.append(asked)
        if "approve" in asked["requestedSchema"]["properties"]:
            return self.approval
        return await super()._elicit(ctx, params)


def modern_call(rpc_id, name, arguments, caps=ELICIT_CAPS, **extra):
    return {"jsonrpc": "2.0", "id": rpc_id, "method": "tools/call", "params": {
        "name": name, "arguments": arguments, **extra,
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                  "io.modelcontextprotocol/clientCapabilities": caps,
                  "io.modelcontextprotocol/clientInfo": {"name": "raw-approval-test", "version": "1"}}}}


def post(url, body):
    """POSTs one modern request; (HTTP status, the JSON-RPC response to it), from JSON or SSE."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={
        "content-type": "application/json", "accept": "application/json, text/event-stream",
        "mcp-protocol-version": "2026-07-28", "mcp-method": body["method"], "mcp-name": body["params"]["name"]})
    try:
        with urllib.request.urlopen(req, timeout=WAIT_S) as r:
            status, ctype, raw = r.status, r.headers.get("content-type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        status, ctype, raw = e.code, e.headers.get("content-type", ""), e.read().decode()
    if not ctype.startswith("text/event-stream"):
        return status, json.loads(raw)
    [answer] = [m for m in sse_messages(raw) if m.get("id") == body["id"] and ("result" in m or "error" in m)]
    return status, answer


def ask_and_approve(url, rpc_id, arguments):
    """Asks for approval of echo(arguments) and approves it; (token, retry body, retry answer)."""
    status, first = post(url, modern_call(rpc_id, "echo", arguments))
    assert status == 200 and first["result"]["resultType"] == "input_required", first
    assert first["result"]["inputRequests"]["approval"]["method"] == "elicitation/create", first
    token = first["result"]["requestState"]
    retry = modern_call(rpc_id + 1, "echo", arguments, requestState=token, inputResponses={"approval": APPROVE})
    return token, retry, post(url, retry)


# --- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    """A recording Python legacy upstream behind a proxy gating `echo` and `ask_*`."""
    config = tmp_path_factory.mktemp("approval") / "proxy.toml"
    config.write_text(CONFIG)
    up, url = start_py_upstream("--record")
    try:
        proxy = Proxy(url, config=config)
    except BaseException:
        up.kill()
        raise
    yield {"proxy": proxy, "up": up}
    proxy.kill()
    up.kill()


# --- modern Python client ----------------------------------------------------------------------


def test_py_client_approves_and_the_gated_tool_runs_after_a_rendered_question(gated):
    proxy, up = gated["proxy"], gated["up"]
    before = upstream_calls(up)
    client = Approver(proxy.url)
    result = client.run(lambda c: c.call_tool("echo", {"text": "hello-approval"}))
    assert not result.is_error and text_of(result) == "hello-approval"
    [asked] = client.seen
    assert asked["message"] == "Echo hello-approval back to you?"
    schema = asked["requestedSchema"]
    assert schema["properties"]["approve"]["type"] == "boolean"
    assert schema["properties"]["reason"]["type"] == "string"
    assert set(schema["required"]) == {"approve", "reason"}
    assert wait_upstream_calls(up, before + 1) == before + 1, "the approved call went upstream once"


def test_a_gated_tool_that_elicits_asks_for_approval_then_its_own_question(gated):
    client = Approver(gated["proxy"].url)
    result = client.run(lambda c: c.call_tool("ask_name", {}))
    assert text_of(result) == "Hello, Ada!"
    assert [s["message"] for s in client.seen] == ["Let the tool ask your name?", "What is your name?"]
    assert "approve" in client.seen[0]["requestedSchema"]["required"]
    assert "approve" not in client.seen[1]["requestedSchema"]["properties"]


@pytest.mark.parametrize("answer", [
    ElicitResult(action="decline"),
    ElicitResult(action="cancel"),
    ElicitResult(action="accept", content={"approve": False, "reason": "no"}),
], ids=["decline", "cancel", "approve-false"])
def test_a_refused_approval_is_an_error_result_the_upstream_never_saw(gated, answer):
    proxy, up = gated["proxy"], gated["up"]
    before = upstream_calls(up)
    declined_before = approvals(proxy, "declined")
    client = Approver(proxy.url, approval=answer)
    result = client.run(lambda c: c.call_tool("echo", {"text": "must-not-run"}))
    assert result.is_error
    assert [c.text for c in result.content] == [ECHO_DECLINED]
    assert len(client.seen) == 1
    assert approvals(proxy, "declined") - declined_before == 1
    # Barrier: an ungated call that does reach the upstream; only it may have been counted.
    barrier = PyClient(proxy.url, sampling=False, roots=False)
    assert text_of(barrier.run(lambda c: c.call_tool("progress", {"steps": 1}))) == "done after 1 steps"
    assert wait_upstream_calls(up, before + 1) == before + 1, "the declined call never went upstream"


# --- modern TS client --------------------------------------------------------------------------

TS_CLIENT = textwrap.dedent("""
    import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
    const answers = JSON.parse(process.env.APPROVAL_ANSWERS);
    const calls = JSON.parse(process.env.APPROVAL_CALLS);
    const seen = [];
    const client = new Client(
      { name: 'ts-approval-client', version: '1.0.0' },
      { capabilities: { elicitation: { form: {} } }, versionNegotiation: { mode: { pin: '2026-07-28' } },
        inputRequired: { autoFulfill: true, maxRounds: 10 } },
    );
    client.setRequestHandler('elicitation/create', async (request) => {
      seen.push({ message: request.params.message, required: request.params.requestedSchema.required });
      return answers.shift();
    });
    const timer = setTimeout(() => { console.log(JSON.stringify({ error: 'client timed out' })); process.exit(3); }, 50_000);
    try {
      await client.connect(new StreamableHTTPClientTransport(new URL(process.env.APPROVAL_URL)));
      const results = [];
      for (const c of calls) results.push(await client.callTool({ name: c.name, arguments: c.arguments }));
      console.log(JSON.stringify({ results, seen, version: client.getNegotiatedProtocolVersion?.() }));
      await client.close();
      clearTimeout(timer);
      process.exit(0);
    } catch (e) {
      console.log(JSON.stringify({ error: String(e?.message ?? e), code: e?.code, seen }));
      clearTimeout(timer);
      process.exit(2);
    }
""")


def run_ts_approval_client(url, calls, answers):
    env = {**os.environ, "APPROVAL_URL": url, "APPROVAL_CALLS": json.dumps(calls), "APPROVAL_ANSWERS": json.dumps(answers)}
    # Evaluated as a module from this directory, so the import resolves in its node_modules.
    out = subprocess.run([NODE, "--input-type=module", "-e", TS_CLIENT], cwd=str(HERE), env=env,
                         capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if not lines:
        raise AssertionError(f"ts client printed nothing\nstdout:{out.stdout}\nstderr:{out.stderr}")
    return json.loads(lines[-1])


def test_ts_client_approves_once_and_declines_once(gated):
    proxy, up = gated["proxy"], gated["up"]
    before = upstream_calls(up)
    calls = [{"name": "echo", "arguments": {"text": "ts-yes"}}, {"name": "echo", "arguments": {"text": "ts-no"}}]
    out = run_ts_approval_client(proxy.url, calls, [APPROVE, {"action": "decline"}])
    assert "error" not in out, out
    assert out["version"] == "2026-07-28"
    approved, declined = out["results"]
    assert approved["content"] == [{"type": "text", "text": "ts-yes"}] and not approved.get("isError")
    assert declined["content"] == [{"type": "text", "text": ECHO_DECLINED}] and declined["isError"] is True
    assert [s["message"] for s in out["seen"]] == ["Echo ts-yes back to you?", "Echo ts-no back to you?"]
    assert all("approve" in s["required"] for s in out["seen"])
    # The declined call came last: the approved one is the only one the upstream answered.
    barrier = PyClient(proxy.url, sampling=False, roots=False)
    assert text_of(barrier.run(lambda c: c.call_tool("progress", {"steps": 1}))) == "done after 1 steps"
    assert wait_upstream_calls(up, before + 2) == before + 2, "approved + barrier, not the declined call"


# --- the token rules, on the wire ----------------------------------------------------------------


def test_an_approved_token_is_taken_once(gated):
    proxy, up = gated["proxy"], gated["up"]
    before = upstream_calls(up)
    _, retry, (status, done) = ask_and_approve(proxy.url, 10, {"text": "once"})
    assert status == 200 and done["result"]["content"] == [{"type": "text", "text": "once"}], done
    assert wait_upstream_calls(up, before + 1) == before + 1
    replay = {**retry, "id": 12}
    status, again = post(proxy.url, replay)
    assert status == 400, again
    assert again["error"]["code"] == -32602 and "already used" in again["error"]["message"], again
    barrier = PyClient(proxy.url, sampling=False, roots=False)
    assert text_of(barrier.run(lambda c: c.call_tool("progress", {"steps": 1}))) == "done after 1 steps"
    assert wait_upstream_calls(up, before + 2) == before + 2, "the replay did not run the tool again"


def test_an_approval_does_not_carry_over_to_other_arguments(gated):
    url = gated["proxy"].url
    status, first = post(url, modern_call(20, "echo", {"text": "approved-this"}))
    assert status == 200 and first["result"]["resultType"] == "input_required", first
    token = first["result"]["requestState"]
    other = modern_call(21, "echo", {"text": "not-this"}, requestState=token, inputResponses={"approval": APPROVE})
    status, refused = post(url, other)
    assert status == 400, refused
    assert refused["error"]["code"] == -32602, refused
    assert "belongs to a different request" in refused["error"]["message"], refused


def test_a_client_without_elicitation_cannot_call_a_gated_tool(gated):
    proxy = gated["proxy"]
    unaskable_before = approvals(proxy, "unaskable")
    status, refused = post(proxy.url, modern_call(30, "echo", {"text": "x"}, caps={"sampling": {}}))
    assert status == 400, refused
    assert refused["error"]["code"] == -32021, refused
    assert "elicitation" in refused["error"]["data"]["requiredCapabilities"], refused
    assert approvals(proxy, "unaskable") - unaskable_before == 1


# --- legacy client -----------------------------------------------------------------------------

LEGACY_CLIENT = textwrap.dedent("""
    import asyncio, json, sys
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client
    from mcp.shared.exceptions import McpError

    async def main(url):
        async with streamablehttp_client(url) as (read, write, _):
            async with ClientSession(read, write) as s:
                await s.initialize()
                out = {}
                try:
                    r = await s.call_tool("echo", {"text": "legacy-gated"})
                    out["gated"] = {"result": r.model_dump(mode="json")}
                except McpError as e:
                    out["gated"] = {"code": e.error.code, "message": e.error.message}
                r = await s.call_tool("progress", {"steps": 1})
                out["ungated"] = {"text": r.content[0].text, "isError": r.isError}
                print(json.dumps(out))

    asyncio.run(asyncio.wait_for(main(sys.argv[1]), 50))
""")


def test_a_legacy_client_is_refused_a_gated_tool_and_can_call_others(gated):
    proxy, up = gated["proxy"], gated["up"]
    before = upstream_calls(up)
    refused_before = approvals(proxy, "legacy_refused")
    out = subprocess.run([str(PY_LEGACY), "-c", LEGACY_CLIENT, proxy.url],
                         capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["gated"].get("code") == -32600, result
    assert "approv" in result["gated"]["message"] and "echo" in result["gated"]["message"], result
    assert result["ungated"] == {"text": "done after 1 steps", "isError": False}
    assert approvals(proxy, "legacy_refused") - refused_before == 1
    # The ungated call came after the refused one: it is the only tools/call the upstream saw.
    assert wait_upstream_calls(up, before + 1) == before + 1, "the gated call was not relayed"


# --- cluster -----------------------------------------------------------------------------------

REPLICAS = 3


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path, extra_toml=APPROVAL_TOML, upstream_flags=("--record",))
    yield c
    c.close()


def test_an_approval_asked_on_one_replica_is_taken_through_another_and_runs_once(cluster):
    # Pinned, the client sends nothing but the call and its retry: round-robin sends the retry to
    # the next replica, which forwards it to the one that asked.
    client = Approver(cluster.url)
    result = client.run(lambda c: c.call_tool("echo", {"text": "clustered"}))
    assert text_of(result) == "clustered"
    assert [s["message"] for s in client.seen] == ["Echo clustered back to you?"]
    asked = cluster.per_replica("mrtr_approvals_total", decision="asked")
    approved = cluster.per_replica("mrtr_approvals_total", decision="approved")
    forwarded = cluster.per_replica("mrtr_forwarded_retries_total", result="ok")
    assert sorted(asked) == [0, 0, 1] and approved == asked, (asked, approved)
    issuer = asked.index(1)
    assert sum(forwarded) == 1 and forwarded[issuer] == 0, f"the retry reached another replica: {forwarded}"
    # The tool ran once, on the issuer's upstream.
    assert wait_upstream_calls(cluster.upstreams[issuer], 1) == 1
    # Barrier on each other replica: an ungated call straight to it, the only one its upstream saw.
    for i, (proxy, up) in enumerate(zip(cluster.proxies, cluster.upstreams)):
        if i != issuer:
            barrier = PyClient(proxy.url, sampling=False, roots=False)
            assert text_of(barrier.run(lambda c: c.call_tool("progress", {"steps": 1}))) == "done after 1 steps"
            assert wait_upstream_calls(up, 1) == 1, f"replica {i}'s upstream ran the gated call"


LEGACY_ELICITING_CLIENT = textwrap.dedent("""
    import asyncio, json, sys
    from mcp import ClientSession, types
    from mcp.client.streamable_http import streamablehttp_client

    async def main(url, decision):
        seen = []

        async def on_elicit(context, params):
            seen.append({"message": params.message, "schema": params.requestedSchema})
            if decision == "approve":
                return types.ElicitResult(action="accept", content={"approve": True, "reason": "ok"})
            return types.ElicitResult(action="decline")

        async with streamablehttp_client(url) as (read, write, _):
            async with ClientSession(read, write, elicitation_callback=on_elicit) as s:
                await s.initialize()
                r = await s.call_tool("echo", {"text": "legacy-" + decision})
                print(json.dumps({"seen": seen, "text": r.content[0].text, "isError": r.isError}))

    asyncio.run(asyncio.wait_for(main(sys.argv[1], sys.argv[2]), 50))
""")


@pytest.mark.parametrize("decision", ["approve", "decline"])
def test_a_legacy_client_that_elicits_is_asked_inline(gated, decision):
    proxy, up = gated["proxy"], gated["up"]
    before = upstream_calls(up)
    out = subprocess.run([str(PY_LEGACY), "-c", LEGACY_ELICITING_CLIENT, proxy.url, decision],
                         capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    [asked] = result["seen"]
    assert asked["message"] == f"Echo legacy-{decision} back to you?"
    assert asked["schema"]["required"] == ["approve", "reason"], asked
    if decision == "approve":
        assert result == {"seen": result["seen"], "text": "legacy-approve", "isError": False}, result
        assert wait_upstream_calls(up, before + 1) == before + 1
    else:
        assert result["isError"] is True and result["text"] == ECHO_DECLINED, result
        assert approvals(proxy, "declined") >= 1
        # The declined result came back without the call ever being relayed.
        assert upstream_calls(up) == before
