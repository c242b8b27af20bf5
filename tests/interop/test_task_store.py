"""Tasks in a shared store (issue 33) on the real binary, with real peers: a real `redis-server`
(its own, on a free loopback port, no persistence), three replicas sharing it and one key, each
in front of its own official Python legacy server (mcp==1.30.0, servers/py_legacy_server.py),
behind nginx round-robin. Each replica has a fixed instance id (`replica-<i>`), so a task's
holder is read from its id. Every tool used is made a task at once (`[tasks.tools]`); the lease
is short (600 ms), so a SIGKILLed holder's tasks are adopted within a second.

The holder is SIGKILLed at each point of a task's life: at `input_required` after one answer
(raw HTTP), while the person is being asked (FastMCP's tasks client, held at that point),
while `working` (the official ext-tasks client), finished, and with a tool that is not
replay-safe; two survivors race to adopt; another principal is refused before and after
adoption; a scan of every store key finds no argument, answer or result in the clear.

What each upstream ran is read from their shared call log (`--call-log`: one line per
tools/call, written before it runs, with the server's pid); what each replica did from its
metrics. Nothing waits on a timer: each step polls its condition (the lease key gone from
Redis, a task's status) under a deadline.
"""

import asyncio
import itertools
import json
import select
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest
from mcp.client import Client

from conftest import HERE, NODE, Proc, free_port, sse_messages
from test_cluster import Cluster
from test_modern_clients import PyClient, text_of
from test_tasks import FASTMCP_PY, completed_text

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"
MODERN = "2026-07-28"
TASKS_CAPS = {"elicitation": {"form": {}}, "extensions": {"io.modelcontextprotocol/tasks": {}}}
WAIT_S = 20
POLL_S = 0.05
# How long a lapsed lease may take to go: the lease, plus a store round trip and scheduling.
LAPSE_S = 5
LOST = "the replica running this task was lost"
NOT_SAFE = "not marked safe to run again"
UNKNOWN = "unknown or expired taskId"
# Replay-safe by `[replay.tools]`: ask_name, slow_ask; by its annotation (readOnlyHint):
# twice_read_only; not replay-safe: twice, echo.
STORE_TOML = """
[tasks]
store = "redis://127.0.0.1:{port}/0"
store_timeout = "200ms"
lease = "600ms"
poll_interval = "100ms"
[tasks.tools]
ask_name = "always"
slow_ask = "always"
twice = "always"
twice_read_only = "always"
echo = "always"
[replay.tools]
ask_name = "always"
slow_ask = "always"
"""

_ids = itertools.count(1)


# --- the store -----------------------------------------------------------------------------------


class Redis:
    """A `redis-server` of the test's own on a free loopback port, without persistence."""

    def __init__(self):
        self.port = free_port()
        self.proc = Proc([REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1",
                          "--save", "", "--appendonly", "no"])
        deadline = time.monotonic() + WAIT_S
        while self.cli("ping") != "PONG":
            assert time.monotonic() < deadline and self.proc.p.poll() is None, self.proc.output()
            time.sleep(POLL_S)

    def cli(self, *args):
        out = subprocess.run([REDIS_CLI, "-p", str(self.port), *args], capture_output=True, text=True, timeout=10)
        return out.stdout.strip()

    def dump(self):
        """Every key and its value (the store writes strings only)."""
        return {k: self.cli("get", k) for k in self.cli("--scan").splitlines() if k}

    def record(self, task_id):
        """The task's record as the store keeps it (what is in the clear, and `sealed`)."""
        raw = self.cli("get", f"mrtr:task:{task_id}")
        return json.loads(raw) if raw else None

    def holder(self, task_id):
        return self.cli("get", f"mrtr:lease:{task_id}") or None

    def kill(self):
        self.proc.kill()


# --- the cluster ---------------------------------------------------------------------------------


class StoreCluster(Cluster):
    """Three named replicas (`replica-<i>`) on one Redis store, each before its own Python
    upstream (all writing one call log), behind nginx."""

    def __init__(self, tmp_path, redis, listed=True):
        self.redis = redis
        self.call_log = tmp_path / "calls.jsonl"
        self.call_log.touch()
        super().__init__(tmp_path, extra_toml=STORE_TOML.format(port=redis.port),
                         upstream_flags=("--call-log", str(self.call_log)), named=True, listed=listed)

    def creator(self, task_id):
        """The index of the replica that created the task (its id names it)."""
        instance = task_id.rsplit(".", 1)[0]
        assert instance.startswith("replica-"), task_id
        return int(instance.removeprefix("replica-"))

    def kill(self, i):
        """SIGKILLs replica `i` (its upstream lives on); the indices of the survivors."""
        p = self.proxies[i].proc.p
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
        return [j for j in range(len(self.proxies)) if j != i]

    def until_lease_lapsed(self, task_id):
        """Waits until no one holds the task's lease (its holder is dead, no one adopted it)."""
        deadline = time.monotonic() + LAPSE_S
        while self.redis.holder(task_id) is not None:
            assert time.monotonic() < deadline, f"the lease of {task_id} never lapsed"
            time.sleep(POLL_S)

    def calls(self, mark=0, tool=None):
        """The upstreams' tools/call lines from line `mark` on (of `tool`)."""
        lines = [json.loads(l) for l in self.call_log.read_text().splitlines() if l.strip()]
        return [c for c in lines[mark:] if tool is None or c["tool"] == tool]

    def upstream_of(self, call):
        """The index of the replica whose upstream ran `call` (a call log line)."""
        return [u.p.pid for u in self.upstreams].index(call["pid"])

    def adopted(self, outcome=None):
        """Tasks each live replica adopted (with `outcome`), by replica index (0 for the dead)."""
        labels = {} if outcome is None else {"outcome": outcome}
        return [p.metrics().sum("mrtr_tasks_adopted_total", **labels) if p.proc.p.poll() is None else 0
                for p in self.proxies]


def store_cluster(tmp_path, listed):
    redis = Redis()
    try:
        c = StoreCluster(tmp_path, redis, listed)
    except BaseException:
        redis.kill()
        raise
    yield c
    c.close()
    redis.kill()


@pytest.fixture
def cluster(tmp_path):
    yield from store_cluster(tmp_path, listed=True)


@pytest.fixture
def peerless(tmp_path):
    """The cluster with no `[cluster] peers`: the replicas know each other from the store."""
    yield from store_cluster(tmp_path, listed=False)


# --- a modern client on raw HTTP -----------------------------------------------------------------


def rpc(url, method, params, principal=None):
    """One 2026-07-28 request declaring the tasks extension, as `principal` (its bearer token;
    none when None): (HTTP status, its JSON-RPC answer)."""
    rpc_id = next(_ids)
    body = {"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": {**params, "_meta": {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": TASKS_CAPS,
        "io.modelcontextprotocol/clientInfo": {"name": "task-store-test", "version": "1"}}}}
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream",
               "mcp-protocol-version": MODERN, "mcp-method": method,
               "mcp-name": params.get("taskId") or params.get("name")}
    if principal is not None:
        headers["authorization"] = f"Bearer {principal}"
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=WAIT_S) as r:
            status, ctype, raw = r.status, r.headers.get("content-type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        status, ctype, raw = e.code, e.headers.get("content-type", ""), e.read().decode()
    if ctype.startswith("text/event-stream"):
        [answer] = [m for m in sse_messages(raw) if m.get("id") == rpc_id and ("result" in m or "error" in m)]
        return status, answer
    return status, json.loads(raw)


def start_task(url, tool, arguments=None, principal=None):
    status, answer = rpc(url, "tools/call", {"name": tool, "arguments": arguments or {}}, principal)
    assert status == 200 and answer.get("result", {}).get("resultType") == "task", answer
    return answer["result"]["taskId"]


def get(url, task_id, principal=None):
    """`tasks/get`: the task (asserting it was answered)."""
    status, answer = rpc(url, "tasks/get", {"taskId": task_id}, principal)
    assert status == 200 and "result" in answer, (status, answer)
    return answer["result"]


def until(url, task_id, done, principal=None):
    """Polls `tasks/get` of `task_id` at `url` until `done(task)`; the task."""
    deadline = time.monotonic() + WAIT_S
    while True:
        task = get(url, task_id, principal)
        if done(task):
            return task
        assert time.monotonic() < deadline, f"gave up waiting; last: {task}"
        time.sleep(POLL_S)


def status_is(status):
    return lambda task: task["status"] == status


def asks(message):
    """The task lists a request asking `message`."""
    return lambda task: any(r["params"]["message"] == message for r in task.get("inputRequests", {}).values())


def answer(url, task_id, key, name, principal=None):
    status, reply = rpc(url, "tasks/update", {"taskId": task_id, "inputResponses": {
        key: {"action": "accept", "content": {"name": name}}}}, principal)
    assert status == 200 and "result" in reply, (status, reply)


def key_asking(task, message):
    [key] = [k for k, r in task["inputRequests"].items() if r["params"]["message"] == message]
    return key


def assert_sealed(redis, secrets):
    """No key or value of the store holds any of `secrets` in the clear; every key expires."""
    dump = redis.dump()
    assert dump, "the store is empty"
    for key, value in dump.items():
        for secret in secrets:
            assert secret not in key and secret not in value, f"{key} holds {secret!r} in the clear: {value}"
        # -1: no expiry (-2: gone since the scan, a lease that lapsed).
        assert int(redis.cli("pttl", key)) != -1, f"{key} never expires"


# --- the tests -----------------------------------------------------------------------------------


FIRST = "Ada-first-answer-marker"
SECOND = "Bob-second-answer-marker"


def test_a_replay_safe_task_at_input_required_completes_on_a_survivor_without_asking_again(cluster):
    """The person answered the first question; the holder dies while the second is asked. The
    adopter runs the call again on its own upstream: the first question is answered from the
    journal, the second is asked under a fresh key, and the result holds both answers."""
    tool = "twice_read_only"
    created_on = cluster.proxies[0].url
    task_id = start_task(created_on, tool)
    owner = cluster.creator(task_id)
    first = until(created_on, task_id, asks("First name?"))
    answer(created_on, task_id, key_asking(first, "First name?"), FIRST)
    second = until(created_on, task_id, asks("Second name?"))
    old_keys = {key_asking(first, "First name?"), key_asking(second, "Second name?")}
    mark = len(cluster.calls())

    reader, writer = cluster.kill(owner)
    on_reader = cluster.proxies[reader].url
    again = until(on_reader, task_id, lambda t: t["status"] == "input_required"
                  and set(t["inputRequests"]).isdisjoint(old_keys))
    assert [r["params"]["message"] for r in again["inputRequests"].values()] == ["Second name?"], again
    new_key = key_asking(again, "Second name?")
    # Answered on the other survivor: forwarded to the adopter, which holds the lease now.
    answer(cluster.proxies[writer].url, task_id, new_key, SECOND)
    done = until(on_reader, task_id, lambda t: t["status"] not in ("working", "input_required"))
    assert done["status"] == "completed", done
    # The first answer reached the re-run only from the task's journal: it was typed once, on
    # the replica that is gone.
    assert done["result"]["content"][0]["text"] == f"{FIRST} and {SECOND}, read-only"
    assert cluster.adopted("replayed")[reader] == 1
    [rerun] = cluster.calls(mark, tool)
    assert cluster.upstream_of(rerun) == reader, "the adopter's own upstream ran it again"
    assert_sealed(cluster.redis, [FIRST, SECOND, "First name?", "Second name?"])


def test_fastmcp_a_task_whose_holder_dies_while_the_person_is_asked_asks_once_on_a_survivor(cluster):
    """FastMCP's tasks client, through the balancer, sees the task ask; before the person
    answers, the holder is killed. The task is adopted and asks again under a fresh key; the
    client then answers (its handler called once) and the task completes."""
    client = subprocess.Popen(
        [str(FASTMCP_PY), str(HERE / "clients" / "py_tasks_client.py"), cluster.url,
         json.dumps({"tool": "ask_name", "hold": True})],
        cwd=str(HERE), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([client.stdout], [], [], WAIT_S * 2)
        held = json.loads(client.stdout.readline() or "null") if ready else None
        assert held and "held" in held, client.communicate(timeout=WAIT_S)
        task_id = held["held"]
        assert held["input_keys"] == ["elicitation-1"]
        mark = len(cluster.calls())
        survivor, _ = cluster.kill(cluster.creator(task_id))
        asked = until(cluster.proxies[survivor].url, task_id, lambda t: t["status"] == "input_required"
                      and "elicitation-1" not in t["inputRequests"])
        assert list(asked["inputRequests"]) == ["elicitation-2"], asked
        out, err = client.communicate("go\n", timeout=WAIT_S)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait(timeout=10)
    lines = [l for l in out.splitlines() if l.startswith("{")]
    assert lines, f"fastmcp client printed nothing\nstdout:{out}\nstderr:{err}"
    transcript = json.loads(lines[-1])
    assert "error" not in transcript, transcript
    assert transcript["elicitations"] == ["What is your name?"], "the person was asked once"
    assert transcript["text"] == "Hello, Ada!" and transcript["final"] == "completed", transcript
    [rerun] = cluster.calls(mark, "ask_name")
    assert cluster.upstream_of(rerun) == survivor
    assert sum(cluster.adopted("replayed")) == 1


def test_ext_tasks_a_working_task_whose_holder_dies_completes_on_a_survivor(cluster):
    """The official ext-tasks client drives a slow replay-safe tool through the balancer; its
    holder is killed while the tool works (before it asks). The task runs again on a survivor's
    upstream, asks there, and completes; the client saw no error."""
    plan = {"tool": "slow_ask", "arguments": {"delay_ms": 1500}}
    cmd = [NODE, str(HERE / "clients" / "ts_tasks_client.mjs"), cluster.url, json.dumps(plan)]
    client = subprocess.Popen(cmd, cwd=str(HERE), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + WAIT_S
        # A set: SCAN may return a key more than once.
        while not (keys := set(cluster.redis.cli("--scan", "--pattern", "mrtr:task:*").split())):
            assert time.monotonic() < deadline and client.poll() is None, client.communicate(timeout=WAIT_S)
            time.sleep(POLL_S)
        [key] = keys
        task_id = key.removeprefix("mrtr:task:")
        # The store holds the task before the client is told of it: the holder is killed only
        # once the client polls it (it has its CreateTaskResult; a kill before would make the
        # balancer send the tools/call to another replica, a task of its own).
        while sum(p.metrics().sum("mrtr_requests_total", method="tasks/get") for p in cluster.proxies) == 0:
            assert time.monotonic() < deadline and client.poll() is None, client.communicate(timeout=WAIT_S)
            time.sleep(POLL_S)
        mark = len(cluster.calls())
        cluster.kill(cluster.creator(task_id))
        # What the dead holder left: working, never asked (it can write nothing more).
        left = cluster.redis.record(task_id)
        assert (left["status"], left["rounds"]) == ("working", 0), left
        out, err = client.communicate(timeout=WAIT_S * 2)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait(timeout=10)
    transcript = json.loads(out or "null")
    assert transcript and "error" not in transcript and "backgroundErrors" not in transcript, (out, err)
    assert transcript["taskId"] == task_id
    assert [i["message"] for i in transcript["inputs"]] == ["What is your name?"]
    assert completed_text(transcript) == "Hello, Grace!"
    [rerun] = cluster.calls(mark, "slow_ask")
    assert rerun["arguments"] == {"delay_ms": 1500}
    adopted = cluster.adopted("replayed")
    assert sum(adopted) == 1 and adopted.index(1) == cluster.upstream_of(rerun)


def test_a_task_that_is_not_replay_safe_fails_with_a_clear_message_when_its_holder_dies(cluster):
    tool = "twice"
    task_id = start_task(cluster.proxies[1].url, tool)
    until(cluster.proxies[1].url, task_id, asks("First name?"))
    mark = len(cluster.calls())
    survivor, _ = cluster.kill(cluster.creator(task_id))
    failed = until(cluster.proxies[survivor].url, task_id, lambda t: t["status"] != "input_required")
    assert failed["status"] == "failed", failed
    message = failed["statusMessage"]
    assert LOST in message and NOT_SAFE in message, failed
    assert failed["error"]["message"] == message
    assert cluster.adopted("failed")[survivor] == 1
    assert cluster.calls(mark, tool) == [], "it did not run again"


def test_a_task_finished_before_its_holder_dies_is_still_served_by_the_survivors(cluster):
    text = "finished-result-marker"
    task_id = start_task(cluster.proxies[2].url, "echo", {"text": text})
    until(cluster.proxies[2].url, task_id, status_is("completed"))
    survivors = cluster.kill(cluster.creator(task_id))
    for i in survivors:
        done = get(cluster.proxies[i].url, task_id)
        assert done["status"] == "completed" and done["result"]["content"][0]["text"] == text, done
    cluster.until_lease_lapsed(task_id)
    done = get(cluster.url, task_id)
    assert done["result"]["content"][0]["text"] == text, done
    assert sum(cluster.adopted("finished")) == 1, "read, and adopted as finished"
    assert len(cluster.calls(0, "echo")) == 1


def refused(url, task_id, principal):
    """`tasks/*` of `task_id` by `principal` at `url` is answered -32602 unknown task."""
    for method, extra in (("tasks/get", {}), ("tasks/cancel", {}),
                          ("tasks/update", {"inputResponses": {"elicitation-1": {"action": "decline"}}})):
        status, answer = rpc(url, method, {"taskId": task_id, **extra}, principal)
        error = answer.get("error") or {}
        assert error.get("code") == -32602 and UNKNOWN in error.get("message", ""), (method, status, answer)


def test_another_principal_is_refused_before_and_after_adoption_and_does_not_adopt(cluster):
    alice, mallory = "alice-token", "mallory-token"
    created_on = cluster.proxies[0].url
    task_id = start_task(created_on, "ask_name", principal=alice)
    until(created_on, task_id, asks("What is your name?"), alice)
    for p in cluster.proxies:
        refused(p.url, task_id, mallory)
    survivors = cluster.kill(cluster.creator(task_id))
    cluster.until_lease_lapsed(task_id)
    for i in survivors:
        refused(cluster.proxies[i].url, task_id, mallory)
    assert cluster.redis.holder(task_id) is None and sum(cluster.adopted()) == 0, "mallory adopted it"
    adopter = survivors[0]
    asked = until(cluster.proxies[adopter].url, task_id, lambda t: "elicitation-2" in t.get("inputRequests", {}),
                  alice)
    assert cluster.redis.holder(task_id) == f"replica-{adopter}"
    for i in survivors:
        refused(cluster.proxies[i].url, task_id, mallory)
    answer(cluster.url, task_id, key_asking(asked, "What is your name?"), "Alice", alice)
    done = until(cluster.url, task_id, status_is("completed"), alice)
    assert done["result"]["content"][0]["text"] == "Hello, Alice!"


def test_a_scan_of_the_store_finds_no_argument_answer_or_result_in_the_clear(cluster):
    argument, typed = "argument-marker-Quillon", "answer-marker-Zebediah"
    url = cluster.proxies[0].url
    echoed = start_task(url, "echo", {"text": argument})
    asking = start_task(url, "ask_name")
    asked = until(url, asking, asks("What is your name?"))
    until(url, echoed, status_is("completed"))
    assert_sealed(cluster.redis, [argument, "What is your name?", "requestedSchema"])
    answer(url, asking, key_asking(asked, "What is your name?"), typed)
    done = until(url, asking, status_is("completed"))
    assert done["result"]["content"][0]["text"] == f"Hello, {typed}!"
    # The records keep the results, and the replay-safe one its journal (its answer).
    record = cluster.redis.record(asking)
    assert record["status"] == "completed" and record["replay_safe"] and record["sealed"], record
    assert_sealed(cluster.redis, [argument, typed, "What is your name?", "requestedSchema"])


RACERS_PER_SURVIVOR = 3


def test_two_survivors_racing_to_adopt_run_the_call_again_once(cluster):
    tool = "slow_ask"
    url = cluster.proxies[0].url
    task_id = start_task(url, tool, {"delay_ms": 200})
    until(url, task_id, asks("What is your name?"))
    mark = len(cluster.calls())
    survivors = cluster.kill(cluster.creator(task_id))
    cluster.until_lease_lapsed(task_id)
    # Every racer sends its tasks/get at once, half to each survivor.
    barrier = threading.Barrier(RACERS_PER_SURVIVOR * len(survivors))
    seen = []

    def race(i):
        barrier.wait(timeout=WAIT_S)
        seen.append(rpc(cluster.proxies[i].url, "tasks/get", {"taskId": task_id}))

    racers = [threading.Thread(target=race, args=(i,)) for i in survivors for _ in range(RACERS_PER_SURVIVOR)]
    for r in racers:
        r.start()
    for r in racers:
        r.join(timeout=WAIT_S)
    assert len(seen) == len(racers)
    for status, reply in seen:
        assert status == 200 and reply.get("result", {}).get("status") in ("working", "input_required"), reply
    adopted = cluster.adopted()
    assert sorted(adopted[i] for i in survivors) == [0, 1], adopted
    adopter = adopted.index(1)
    assert cluster.redis.holder(task_id) == f"replica-{adopter}"
    asked = until(cluster.url, task_id, lambda t: "elicitation-2" in t.get("inputRequests", {}))
    answer(cluster.url, task_id, "elicitation-2", "Once")
    done = until(cluster.url, task_id, status_is("completed"))
    assert done["result"]["content"][0]["text"] == "Hello, Once!", (asked, done)
    [rerun] = cluster.calls(mark, tool)
    assert cluster.upstream_of(rerun) == adopter


def test_without_a_peer_list_replicas_reach_a_holder_or_owner_at_the_address_it_announced(peerless):
    c = peerless
    # A task created on replica 0, answered on replica 1: forwarded to its holder, found in the
    # store; no one adopts it, its call runs once.
    task_id = start_task(c.proxies[0].url, "ask_name")
    asked = until(c.proxies[0].url, task_id, asks("What is your name?"))
    answer(c.proxies[1].url, task_id, key_asking(asked, "What is your name?"), FIRST)
    done = until(c.proxies[2].url, task_id, status_is("completed"))
    assert done["result"]["content"][0]["text"] == f"Hello, {FIRST}!"
    assert c.per_replica("mrtr_forwarded_retries_total", kind="task", result="ok")[1] == 1
    assert sum(c.adopted()) == 0 and len(c.calls(0, "ask_name")) == 1

    # Two-round calls of a tool that is not replay-safe, by the official Python client pinned to
    # 2026-07-28, through round robin: every retry on another replica is forwarded to the owner.
    async def one():
        client = PyClient(c.url)
        async with Client(c.url, mode=MODERN, **client.kwargs) as session:
            result = await asyncio.wait_for(session.call_tool("twice", {}), WAIT_S)
        return text_of(result), client.counts["elicitation"]

    async def calls():
        return await asyncio.gather(*(one() for _ in range(4)))

    assert asyncio.run(calls()) == [("Ada and Ada", 2)] * 4
    assert c.total("mrtr_forwarded_retries_total", kind="retry", result="ok") > 0
    assert c.total("mrtr_forwarded_retries_total", kind="retry", result="unknown_owner") == 0
