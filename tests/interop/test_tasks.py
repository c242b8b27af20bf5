"""The tasks extension (io.modelcontextprotocol/tasks) on the real binary, with real peers: the
Python and TS legacy servers (official SDKs) behind the proxy on every legacy transport; in front,
the official tasks client (@modelcontextprotocol/ext-tasks 0.2.2 over @modelcontextprotocol/client
2.4.0), FastMCP's (fastmcp-tasks 4.1.4) and, for the calls that must not become tasks, the plain TS
client (no extension declared).

The slow tools work `DELAY_MS` before asking, longer than `[tasks] after`, so that each call is a
task by the time it asks (`slow_everything` is `always` a task); `ask_then_slow` asks at once, so
its first question is an MRTR round and the task comes on the retry. What reached the upstream
is read from the tool's result (the answers come back in it) and, for a cancel, from the upstream
itself (`was_cancelled`, or on stdio its stderr line in the proxy's log): never by waiting.
"""

import itertools
import json
import subprocess

import pytest

import drivers
from conftest import HERE, TRANSPORTS, UPSTREAMS, Proxy, run_ts_client
from test_cluster import Cluster

FASTMCP_PY = HERE / ".venv" / "fastmcp" / "bin" / "python"
TASKS_TABLES = """
[tasks]
after = "300ms"
poll_interval = "100ms"
[tasks.tools]
slow_everything = "always"
"""
# proxy.toml's gather window, as every interop test has it.
TASKS_TOML = '[state]\ngather_window = "250ms"\n' + TASKS_TABLES
DELAY_MS = 600
CLIENT_TIMEOUT_S = 60

_tags = (f"task-{n}" for n in itertools.count())


# --- helpers -----------------------------------------------------------------------------------


def run_tasks_client(url, plan):
    """Runs the ext-tasks client with `plan` in this worker's Node driver (drivers.py); its
    transcript (see clients/ts_tasks_client.mjs)."""
    transcript = drivers.start("node", "ts_tasks_client", [url, json.dumps(plan)], "ts tasks client").result(CLIENT_TIMEOUT_S)
    assert "error" not in transcript and "backgroundErrors" not in transcript, json.dumps(transcript, indent=1)
    assert transcript["taskSupport"] == "advertised", "server/discover did not offer the extension"
    return transcript


def run_fastmcp_client(url, plan, fails=False):
    """Runs FastMCP's tasks client with `plan`; its transcript, which must carry no error unless
    `fails`."""
    cmd = [str(FASTMCP_PY), str(HERE / "clients" / "py_tasks_client.py"), url, json.dumps(plan)]
    out = subprocess.run(cmd, cwd=str(HERE), capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S)
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    assert lines, f"fastmcp client printed nothing\nstdout:{out.stdout}\nstderr:{out.stderr}"
    transcript = json.loads(lines[-1])
    assert ("error" in transcript) == fails, transcript
    return transcript


def tool_calls(transcript):
    """The result of each tools/call on the wire, in order (from a JSON or an SSE answer)."""
    results = []
    for entry in transcript["wire"]:
        request = entry.get("request") or {}
        if request.get("method") != "tools/call":
            continue
        answer = entry["response"]
        if isinstance(answer, list):
            [answer] = [m for m in answer if m.get("id") == request["id"] and ("result" in m or "error" in m)]
        assert "result" in answer, answer
        results.append(answer["result"])
    return results


def statuses(transcript):
    """The task statuses the client saw, consecutive repeats collapsed."""
    seen = [e["status"] for e in transcript["events"]]
    return [s for i, s in enumerate(seen) if i == 0 or seen[i - 1] != s]


def is_subsequence(wanted, seen):
    it = iter(seen)
    return all(s in it for s in wanted)


def completed_text(transcript):
    outcome = transcript["outcome"]
    assert outcome["status"] == "completed", outcome
    return outcome["result"]["content"][0]["text"]


def tasks_held(proxy):
    """Tasks on the proxy, whatever their status (finished ones are kept until their TTL)."""
    return proxy.metrics().sum("mrtr_tasks")


def assert_upstream_cancelled(stack, tag):
    """The upstream's `wait_forever(tag)` was cancelled."""
    if stack["kind"].endswith("-stdio"):
        # Each stdio child is a session of its own: a later call may reach another child, which
        # cannot know. The child says so on stderr, which the proxy logs as `upstream: …`.
        stack["proxy"].proc.wait_for(rf"upstream: CANCELLED {tag}\b", timeout=20)
        return
    # The plain client (no extension): `was_cancelled` stays an ordinary call.
    out = run_ts_client(stack["proxy"].url, [{"op": "callTool", "name": "was_cancelled", "arguments": {"tag": tag}}])
    assert out["results"][0]["content"][0]["text"] == "cancelled", out


# --- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tasks_config(tmp_path_factory):
    config = tmp_path_factory.mktemp("tasks") / "proxy.toml"
    config.write_text(TASKS_TOML)
    return config


@pytest.fixture(scope="module")
def tasks_stack(request, tasks_config):
    """(upstream kind) → a legacy upstream behind a proxy that makes slow calls tasks."""
    kind = request.param
    up, url = UPSTREAMS[kind]()
    try:
        # At info the proxy logs a stdio child's stderr (assert_upstream_cancelled).
        proxy = Proxy(url, config=tasks_config, log="info" if kind.endswith("-stdio") else "warn")
    except BaseException:
        if up is not None:
            up.kill()
        raise
    yield {"kind": kind, "proxy": proxy}
    proxy.kill()
    if up is not None:
        up.kill()


every_transport = pytest.mark.parametrize("tasks_stack", TRANSPORTS, indirect=True)


# --- the ext-tasks client, on every transport --------------------------------------------------


@every_transport
def test_a_slow_call_becomes_a_task_that_asks_and_completes(tasks_stack):
    out = run_tasks_client(tasks_stack["proxy"].url, {"tool": "slow_ask", "arguments": {"delay_ms": DELAY_MS}})
    assert out["kind"] == "task"
    [created] = tool_calls(out)
    assert created["resultType"] == "task" and created["status"] == "working", created
    assert created["taskId"] == out["taskId"]
    assert is_subsequence(["working", "input_required", "completed"], statuses(out)), out["events"]
    assert set(statuses(out)) <= {"working", "input_required", "completed"}, out["events"]
    assert out["inputs"] == [{"scope": "task", "delivery": "task-update", "key": out["inputs"][0]["key"],
                              "kind": "elicitation", "message": "What is your name?"}]
    # The upstream's progress (sent just before it asked) is the task's statusMessage.
    asking = [e for e in out["events"] if e["status"] == "input_required"]
    assert asking[0]["statusMessage"] == "Asking for a name", asking
    assert completed_text(out) == "Hello, Grace!"


@every_transport
def test_a_task_that_asks_twice_lists_each_question_once(tasks_stack):
    out = run_tasks_client(tasks_stack["proxy"].url, {"tool": "slow_twice", "arguments": {"delay_ms": DELAY_MS}})
    assert out["kind"] == "task"
    assert [(i["scope"], i["kind"], i["message"]) for i in out["inputs"]] == [
        ("task", "elicitation", "First name?"), ("task", "elicitation", "Second name?")]
    first, second = (i["key"] for i in out["inputs"])
    assert first != second
    asked = [e["inputKeys"] for e in out["events"] if e["status"] == "input_required"]
    assert [keys for i, keys in enumerate(asked) if i == 0 or asked[i - 1] != keys] == [[first], [second]]
    assert completed_text(out) == "Grace and Grace"


@every_transport
def test_elicitation_and_sampling_asked_together_are_one_task_round(tasks_stack):
    proxy = tasks_stack["proxy"]
    before = proxy.metrics()
    out = run_tasks_client(proxy.url, {"tool": "slow_everything", "arguments": {"delay_ms": DELAY_MS}})
    assert out["kind"] == "task"
    assert sorted((i["scope"], i["kind"]) for i in out["inputs"]) == [("task", "elicitation"), ("task", "sampling")]
    assert completed_text(out) == "name=Grace sample=ts-sampled"
    after = proxy.metrics()
    # One finished task, which went to input_required once (both requests listed together).
    assert after.sum("mrtr_task_input_rounds_count") - before.sum("mrtr_task_input_rounds_count") == 1
    assert after.sum("mrtr_task_input_rounds_sum") - before.sum("mrtr_task_input_rounds_sum") == 1


@every_transport
def test_a_partial_update_leaves_the_other_request_outstanding(tasks_stack):
    out = run_tasks_client(tasks_stack["proxy"].url,
                           {"tool": "slow_everything", "arguments": {"delay_ms": DELAY_MS}, "mode": "partial"})
    answered, left = out["partial"]["answered"], out["partial"]["leftOpen"]
    assert len(answered) == 1 and len(left) == 1, out["partial"]
    # The snapshot after the first tasks/update: still input_required, with only the other key.
    split_at = next(i for i, e in enumerate(out["events"]) if len(e.get("inputKeys", [])) == 2)
    assert out["events"][split_at + 1]["status"] == "input_required"
    assert out["events"][split_at + 1]["inputKeys"] == left
    assert [i["key"] for i in out["inputs"]] == answered + left
    assert completed_text(out) == "name=Grace sample=ts-sampled"


@every_transport
def test_cancelling_a_task_cancels_the_call_upstream(tasks_stack):
    tag = next(_tags)
    out = run_tasks_client(tasks_stack["proxy"].url,
                           {"tool": "wait_forever", "arguments": {"tag": tag}, "mode": "cancel"})
    assert out["kind"] == "task"
    assert out["outcome"] == {"status": "cancelled"}
    assert out["statusAfterCancel"] == "cancelled"
    assert_upstream_cancelled(tasks_stack, tag)


@every_transport
def test_a_client_without_the_extension_gets_an_ordinary_result(tasks_stack):
    # slow_everything is `always` a task, for a client that declares the extension.
    proxy = tasks_stack["proxy"]
    held = tasks_held(proxy)
    out = run_ts_client(proxy.url, [{"op": "callTool", "name": "slow_everything", "arguments": {"delay_ms": DELAY_MS}}])
    assert "error" not in out, out
    [result] = out["results"]
    assert result["content"][0]["text"] == "name=Grace sample=ts-sampled"
    assert out["counts"] == {"elicitation": 1, "sampling": 1, "roots": 0}
    assert tasks_held(proxy) == held, "no task was created"


@every_transport
def test_rounds_come_first_then_the_task(tasks_stack):
    out = run_tasks_client(tasks_stack["proxy"].url, {"tool": "ask_then_slow", "arguments": {"delay_ms": DELAY_MS}})
    first, retry = tool_calls(out)
    assert first["resultType"] == "input_required" and "requestState" in first, first
    assert retry["resultType"] == "task", retry
    assert [(i["scope"], i["delivery"], i["message"]) for i in out["inputs"]] == [
        ("request", "request-retry", "First name?"), ("task", "task-update", "Second name?")]
    assert completed_text(out) == "Grace and Grace"


# --- FastMCP's tasks client --------------------------------------------------------------------


@pytest.mark.parametrize("tasks_stack", ["py", "ts-sse"], indirect=True)
def test_fastmcp_a_slow_elicitation_becomes_a_task_and_completes(tasks_stack):
    out = run_fastmcp_client(tasks_stack["proxy"].url, {"tool": "slow_ask", "arguments": {"delay_ms": DELAY_MS}})
    # call_tool_task fails unless the call became a task.
    assert out["statuses"] == ["working", "input_required", "completed"], out
    assert len(out["input_keys"]) == 1
    assert out["elicitations"] == ["What is your name?"]
    assert out["text"] == "Hello, Ada!"


@pytest.mark.parametrize("tasks_stack", ["py"], indirect=True)
def test_fastmcp_as_it_ships_sends_no_mcp_name_on_tasks_and_is_refused(tasks_stack):
    """FastMCP 4.1.4 leaves out the `Mcp-Name` the tasks extension requires on `tasks/*`: its
    first `tasks/get` is refused with -32020 (the other tests mirror the header in the client, as
    a deployment must). When this fails, FastMCP sends it: drop `MirrorTaskId` from the client."""
    out = run_fastmcp_client(tasks_stack["proxy"].url,
                             {"tool": "slow_ask", "arguments": {"delay_ms": DELAY_MS}, "mirror_task_id": False},
                             fails=True)
    assert out["statuses"] == ["working"], out
    assert "missing Mcp-Name header: tasks/get must mirror params.taskId" in out["error"], out


@pytest.mark.parametrize("tasks_stack", ["py", "ts-sse"], indirect=True)
def test_fastmcp_cancelling_a_task_cancels_the_call_upstream(tasks_stack):
    tag = next(_tags)
    out = run_fastmcp_client(tasks_stack["proxy"].url,
                             {"tool": "wait_forever", "arguments": {"tag": tag}, "mode": "cancel"})
    assert out["statuses"] == ["working", "cancelled"], out
    assert_upstream_cancelled(tasks_stack, tag)


# --- scale-out ---------------------------------------------------------------------------------


def test_tasks_through_round_robin_are_served_by_their_owner(tmp_path):
    """Three replicas behind nginx round-robin: the task lives on the replica that created it;
    its tasks/get and tasks/update land on the others too, which forward them to the owner."""
    cluster = Cluster(tmp_path, extra_toml=TASKS_TABLES)
    try:
        out = run_tasks_client(cluster.url, {"tool": "slow_twice", "arguments": {"delay_ms": DELAY_MS}})
        assert out["kind"] == "task"
        assert [i["message"] for i in out["inputs"]] == ["First name?", "Second name?"]
        assert completed_text(out) == "Grace and Grace"
        # Round-robin (one nginx worker) sends any three requests in a row to the three replicas.
        task_requests = [e for e in out["wire"] if (e.get("request") or {}).get("method", "").startswith("tasks/")]
        assert len(task_requests) >= len(cluster.proxies)
        held = [tasks_held(p) for p in cluster.proxies]
        assert sorted(held) == [0, 0, 1], held
        owner = held.index(1)
        forwarded = cluster.per_replica("mrtr_forwarded_retries_total", result="ok")
        assert forwarded[owner] == 0 and all(n > 0 for i, n in enumerate(forwarded) if i != owner), forwarded
        assert cluster.total("mrtr_forwarded_retries_total") == sum(forwarded), "every forward succeeded"
    finally:
        cluster.close()
