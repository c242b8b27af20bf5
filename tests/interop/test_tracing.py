"""Trace context end to end on the real binary, with real peers: a modern client's W3C trace
context (SEP-414 `_meta.traceparent`, or the HTTP header) → the proxy's server spans, exported over
OTLP/HTTP protobuf to a real OTLP receiver (otlp_receiver.py, decoding with `opentelemetry-proto`)
→ the legacy upstream (the official Python server, mcp==1.30.0, py_trace_server.py recording the
trace context of every message it is POSTed: `_meta` and headers).

In front: raw 2026-07-28 HTTP where the test must choose each leg's context, and the official
Python client (mcp==2.3.0), whose own OpenTelemetry instrumentation injects `_meta.traceparent`
into every leg. Every trace id is fresh per test, so each test reads only its own spans. Nothing
sleeps: the receiver and the upstream's record are waited on, bounded.

`pytest -s` prints what the receiver and the upstream saw for the two-round call.
"""

import contextlib
import json
import os
import secrets
import socket
import time
import urllib.error
import urllib.request

import pytest

from conftest import HERE, PY_LEGACY, Proxy, free_port, sse_messages
from otlp_receiver import OtlpReceiver
from procs import Proc

SERVICE = "mrtr-proxy-interop"
MODERN = "2026-07-28"
ELICIT_CAPS = {"elicitation": {}}
WAIT_S = 30


# --- helpers -----------------------------------------------------------------------------------


def new_trace():
    return secrets.token_hex(16)


def new_span():
    return secrets.token_hex(8)


def unique_id():
    """A JSON-RPC id no other request of the run has."""
    return secrets.randbelow(10**12)


def traceparent(trace, span, sampled=True):
    return f"00-{trace}-{span}-{'01' if sampled else '00'}"


def parse_traceparent(value):
    """(trace id, parent span id, flags) of a `traceparent`."""
    version, trace, span, flags = value.split("-")[:4]
    assert version == "00" and len(trace) == 32 and len(span) == 16, value
    return trace, span, flags


def telemetry_config(tmp_path, endpoint, **extra):
    """tests/interop/proxy.toml plus a [telemetry] table; the path of the copy."""
    lines = [f'otlp_endpoint = "{endpoint}"', f'service_name = "{SERVICE}"', "sample_ratio = 1.0"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in extra.items()]
    path = tmp_path / "proxy.toml"
    path.write_text((HERE / "proxy.toml").read_text() + "\n[telemetry]\n" + "\n".join(lines) + "\n")
    return path


def start_proxy(upstream_url, config, **env):
    """The proxy with `config`, no OTEL_* variable but `env` (the variables win over the file)."""
    with pytest.MonkeyPatch.context() as mp:
        for k in [k for k in os.environ if k.startswith("OTEL_")]:
            mp.delenv(k)
        for k, v in env.items():
            mp.setenv(k, v)
        return Proxy(upstream_url, config=config)


def start_trace_upstream():
    proc = Proc([str(PY_LEGACY), str(HERE / "servers" / "py_trace_server.py")])
    port = proc.wait_for(r"READY (\d+)").group(1)
    return proc, f"http://127.0.0.1:{port}"


def modern(rpc_id, method, params=None, caps=None, meta=None):
    """A 2026-07-28 request; `meta` adds to its `_meta` (e.g. traceparent)."""
    return {"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": {
        **(params or {}),
        "_meta": {"io.modelcontextprotocol/protocolVersion": MODERN,
                  "io.modelcontextprotocol/clientCapabilities": caps or {},
                  "io.modelcontextprotocol/clientInfo": {"name": "tracing-test", "version": "1"},
                  **(meta or {})}}}


def post(url, body, headers=None):
    """POSTs one modern request; (HTTP status, the JSON-RPC answer to it), from JSON or SSE."""
    h = {"content-type": "application/json", "accept": "application/json, text/event-stream",
         "mcp-protocol-version": MODERN, "mcp-method": body["method"]}
    name = body["params"].get("name")
    if name is not None:
        h["mcp-name"] = name
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={**h, **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=WAIT_S) as r:
            status, ctype, raw = r.status, r.headers.get("content-type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        status, ctype, raw = e.code, e.headers.get("content-type", ""), e.read().decode()
    if not ctype.startswith("text/event-stream"):
        return status, json.loads(raw) if raw.strip() else None
    [answer] = [m for m in sse_messages(raw) if m.get("id") == body["id"] and ("result" in m or "error" in m)]
    return status, answer


def upstream_seen(base):
    """Every message the upstream was POSTed, with its `_meta` and the POST's trace headers."""
    return json.loads(urllib.request.urlopen(base + "/test/seen", timeout=10).read())


def seen_in_trace(base, trace):
    """The upstream's record of the messages whose `_meta` or headers carry `trace`."""
    def trace_of(entry):
        tps = [(entry.get("meta") or {}).get("traceparent"), entry["headers"].get("traceparent")]
        return {parse_traceparent(tp)[0] for tp in tps if tp}

    return [e for e in upstream_seen(base) if trace in trace_of(e)]


def upstream_request(base, trace, method, name=None):
    """The one `method` request (`name`d) the upstream was POSTed in `trace`; fails showing the
    upstream's last requests when there is none."""
    found = [e for e in seen_in_trace(base, trace) if e.get("method") == method and name in (None, e.get("name"))]
    if len(found) != 1:
        last = [{k: e.get(k) for k in ("method", "name", "meta", "headers")}
                for e in upstream_seen(base) if e["kind"] == "request"][-4:]
        raise AssertionError(f"the upstream had {len(found)} {method} in trace {trace}; its last requests: {last}")
    return found[0]


def server_spans(trace, name=None):
    return lambda s: s.trace_id == trace and s.kind == "SERVER" and (name is None or s.name == name)


def assert_descends(rx, span_id, ancestor, trace):
    """`span_id` is `ancestor` (a span id, or a set of them) or one of its descendants among the
    exported spans of `trace` (a client span per upstream request may stand between the proxy's
    server span and the upstream); waits, bounded, for the spans in between. The chain, nearest
    first."""
    stop = ancestor if isinstance(ancestor, set) else {ancestor}
    chain = [span_id]
    while span_id not in stop:
        assert len(chain) < 8, f"no path from {chain[0]} to {ancestor}:\n{rx.dump(lambda s: s.trace_id == trace)}"
        span = rx.wait_one(lambda s, sid=span_id: s.span_id == sid and s.trace_id == trace)
        assert span.parent_span_id, f"{span.brief()} is a root, not under {ancestor}"
        span_id = span.parent_span_id
        chain.append(span_id)
    return chain


def assert_delivered_under(rx, base, trace, request_span):
    """The one answer the upstream got in `trace` came with the context of an `inputResponses`
    client span of the proxy, the child of `request_span` (the retry's or the tasks/update's)."""
    [answer] = [e for e in seen_in_trace(base, trace) if e["kind"] == "response"]
    _, answer_parent, _ = parse_traceparent(answer["headers"]["traceparent"])
    delivery = rx.wait_one(lambda s: s.trace_id == trace and s.span_id == answer_parent)
    assert (delivery.kind, delivery.name, delivery.parent_span_id) == \
        ("CLIENT", "inputResponses", request_span.span_id), delivery.brief()


def common_attributes(span, method, rpc_id):
    a = span.attributes
    assert a.get("mcp.method.name") == method, span.brief()
    assert a.get("mcp.protocol.version") == MODERN, span.brief()
    assert a.get("jsonrpc.request.id") == str(rpc_id), span.brief()
    assert "error.type" not in a, span.brief()


def wait_until(cond, why, timeout=WAIT_S):
    """Polls `cond` (a scrape, say) every 50 ms until it holds; fails with `why` after `timeout`."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, why
        time.sleep(0.05)


@contextlib.contextmanager
def elapsed():
    took = {}
    start = time.monotonic()
    try:
        yield took
    finally:
        took["s"] = time.monotonic() - start


def two_round_ask_name(url, trace, first_span, retry_span, first_id=None, retry_id=None, meta=None):
    """ask_name as two legs, each with its own traceparent in `trace` (and `meta` on the first);
    the legs' JSON-RPC ids (fresh unless given)."""
    first_id = unique_id() if first_id is None else first_id
    retry_id = unique_id() if retry_id is None else retry_id
    status, first = post(url, modern(first_id, "tools/call", {"name": "ask_name", "arguments": {}}, ELICIT_CAPS,
                                     {"traceparent": traceparent(trace, first_span), **(meta or {})}))
    assert status == 200 and first["result"]["resultType"] == "input_required", first
    [(key, asked)] = first["result"]["inputRequests"].items()
    assert asked["method"] == "elicitation/create", first
    retry = modern(retry_id, "tools/call", {
        "name": "ask_name", "arguments": {},
        "inputResponses": {key: {"action": "accept", "content": {"name": "Ada"}}},
        "requestState": first["result"]["requestState"]}, ELICIT_CAPS,
        {"traceparent": traceparent(trace, retry_span)})
    status, final = post(url, retry)
    assert status == 200 and final["result"]["content"][0]["text"] == "Hello, Ada!", final
    return first_id, retry_id


def span_of(rx, rpc_id):
    """The proxy's server span of the request with JSON-RPC id `rpc_id` (waited for)."""
    return rx.wait_one(lambda s: s.kind == "SERVER" and s.attributes.get("jsonrpc.request.id") == str(rpc_id))


# --- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """An OTLP receiver; the recording Python upstream; the proxy exporting to the receiver."""
    rx = OtlpReceiver()
    up, base = start_trace_upstream()
    try:
        config = telemetry_config(tmp_path_factory.mktemp("tracing"), rx.endpoint)
        proxy = start_proxy(base + "/mcp", config)
    except BaseException:
        up.kill()
        rx.close()
        raise
    yield {"rx": rx, "proxy": proxy, "up": up, "base": base}
    proxy.kill()
    up.kill()
    rx.close()


# --- the two-round call ------------------------------------------------------------------------


def test_a_two_round_call_is_one_trace_from_the_client_through_the_proxy_to_the_upstream(traced):
    rx, proxy, base = traced["rx"], traced["proxy"], traced["base"]
    trace, c1, c2 = new_trace(), new_span(), new_span()
    first_id, retry_id = two_round_ask_name(proxy.url, trace, c1, c2)

    # The proxy: one server span per leg, with the MCP attributes, each the child of the client
    # span that leg named, in the client's trace.
    first, retry = span_of(rx, first_id), span_of(rx, retry_id)
    for span, rpc_id, outcome in [(first, first_id, "input_required"), (retry, retry_id, "complete")]:
        assert span.name == "tools/call ask_name", span.brief()
        common_attributes(span, "tools/call", rpc_id)
        assert span.attributes.get("gen_ai.tool.name") == "ask_name", span.brief()
        assert span.attributes.get("mrtr.outcome") == outcome, span.brief()
        assert span.service_name == SERVICE, span.resource
    assert (first.trace_id, first.parent_span_id) == (trace, c1), first.brief()
    assert (retry.trace_id, retry.parent_span_id) == (trace, c2), retry.brief()

    # The upstream: the call carried the client's trace under the proxy's first-leg span, in
    # `_meta` and in the header; the answer the retry delivered carried the retry's.
    call = upstream_request(base, trace, "tools/call", "ask_name")
    seen = seen_in_trace(base, trace)
    tp = call["meta"]["traceparent"]
    assert call["headers"].get("traceparent") == tp, call
    up_trace, up_parent, flags = parse_traceparent(tp)
    assert (up_trace, flags) == (trace, "01"), call
    assert up_parent != c1, f"the upstream's parent must be the proxy's span, not the client's: {call}"
    call_chain = assert_descends(rx, up_parent, first.span_id, trace)
    [answer] = [e for e in seen if e["kind"] == "response" and e.get("action") == "accept"]
    answer_tp = answer["headers"].get("traceparent") or (answer.get("meta") or {}).get("traceparent")
    assert answer_tp, f"the answer delivered upstream carried no trace context: {answer}"
    answer_trace, answer_parent, _ = parse_traceparent(answer_tp)
    assert answer_trace == trace, answer
    assert answer_parent != c2, f"the answer's parent must be the proxy's retry span, not the client's: {answer}"
    answer_chain = assert_descends(rx, answer_parent, retry.span_id, trace)

    print(f"\n--- the receiver saw (trace {trace}; the client's spans: first leg {c1}, retry {c2})")
    print(rx.dump(lambda s: s.trace_id == trace))
    print("--- the upstream saw")
    for e in seen:
        what = e.get("method") or f"answer({e.get('action')})"
        print(f"{e['kind']:<12} {what:<26} _meta.traceparent={(e.get('meta') or {}).get('traceparent')}"
              f" header={e['headers'].get('traceparent')}")
    print(f"--- the upstream call's parent chain {' <- '.join(call_chain)}; the answer's {' <- '.join(answer_chain)}")


def test_the_retry_span_links_to_the_first_legs_span(traced):
    rx, proxy = traced["rx"], traced["proxy"]
    trace = new_trace()
    first_id, retry_id = two_round_ask_name(proxy.url, trace, new_span(), new_span())
    first, retry = span_of(rx, first_id), span_of(rx, retry_id)
    assert (first.trace_id, first.span_id) in retry.links, (first.brief(), retry.brief())


def test_the_upstream_call_and_the_delivered_answers_are_client_spans(traced):
    rx, proxy, base = traced["rx"], traced["proxy"], traced["base"]
    trace = new_trace()
    first_id, retry_id = two_round_ask_name(proxy.url, trace, new_span(), new_span())
    first, retry = span_of(rx, first_id), span_of(rx, retry_id)

    # The upstream's parent is the proxy's client span of the call, under the first leg's span.
    call = upstream_request(base, trace, "tools/call", "ask_name")
    _, call_parent, _ = parse_traceparent(call["meta"]["traceparent"])
    client = rx.wait_one(lambda s: s.trace_id == trace and s.span_id == call_parent)
    assert (client.kind, client.name, client.parent_span_id) == ("CLIENT", "tools/call ask_name", first.span_id), \
        client.brief()
    assert client.attributes.get("mcp.method.name") == "tools/call", client.brief(True)
    assert client.attributes.get("gen_ai.tool.name") == "ask_name", client.brief(True)

    # The answer the retry delivered: a client span of its own, under the retry's span.
    assert_delivered_under(rx, base, trace, retry)


def test_an_upstream_error_marks_the_upstream_calls_client_span(traced):
    rx, proxy = traced["rx"], traced["proxy"]
    trace, rpc_id = new_trace(), unique_id()
    uri = "file:///no/such/resource"
    status, answer = post(proxy.url, modern(rpc_id, "resources/read", {"uri": uri},
                                            meta={"traceparent": traceparent(trace, new_span())}),
                          headers={"mcp-name": uri})
    assert "error" in answer, answer
    server = span_of(rx, rpc_id)
    client = rx.wait_one(lambda s: s.trace_id == trace and s.kind == "CLIENT")
    assert client.parent_span_id == server.span_id, client.brief()
    assert client.status == "ERROR" and client.attributes.get("error.type"), client.brief(True)


def test_park_and_resume_are_events_of_the_legs_spans(traced):
    rx, proxy = traced["rx"], traced["proxy"]
    first_id, retry_id = two_round_ask_name(proxy.url, new_trace(), new_span(), new_span())
    first, retry = span_of(rx, first_id), span_of(rx, retry_id)
    assert first.event("mrtr.park") == {"mrtr.round": 1, "mrtr.input_requests": 1}, first.event_attributes
    assert "mrtr.resume" in retry.events, retry.brief()
    assert "mrtr.park" not in retry.events, retry.brief()


TASKS_CAPS = {**ELICIT_CAPS, "extensions": {"io.modelcontextprotocol/tasks": {}}}


@pytest.fixture(scope="module")
def tasks_proxy(traced, tmp_path_factory):
    """A second proxy before the same upstream, exporting to the same receiver, that runs every
    `ask_name` call of a client declaring the tasks extension as a task."""
    config = telemetry_config(tmp_path_factory.mktemp("tracing-tasks"), traced["rx"].endpoint)
    config.write_text(config.read_text() + '[tasks]\npoll_interval = "50ms"\n[tasks.tools]\nask_name = "always"\n')
    proxy = start_proxy(traced["base"] + "/mcp", config)
    yield proxy
    proxy.kill()


def task_op(url, method, task_id, trace, **params):
    """`tasks/get` / `tasks/update` of `task_id` in `trace`: (its JSON-RPC id, its result)."""
    rpc_id = unique_id()
    body = modern(rpc_id, method, {"taskId": task_id, **params}, TASKS_CAPS,
                  {"traceparent": traceparent(trace, new_span())})
    status, answer = post(url, body, headers={"mcp-name": task_id})
    assert status == 200 and "result" in answer, answer
    return rpc_id, answer["result"]


def poll_task(url, task_id, trace, status):
    """Polls the task at the interval it asks for until it is `status` (bounded); the task."""
    deadline = time.monotonic() + WAIT_S
    while True:
        _, task = task_op(url, "tasks/get", task_id, trace)
        if task["status"] == status:
            return task
        assert task["status"] in ("working", "input_required") and time.monotonic() < deadline, task
        time.sleep(task.get("pollIntervalMs", 50) / 1000)


def test_a_tasks_transitions_are_events_and_its_update_delivers_in_its_own_span(traced, tasks_proxy):
    rx, base, url = traced["rx"], traced["base"], tasks_proxy.url
    trace, call_id = new_trace(), unique_id()
    status, created = post(url, modern(call_id, "tools/call", {"name": "ask_name", "arguments": {}}, TASKS_CAPS,
                                       {"traceparent": traceparent(trace, new_span())}))
    assert status == 200 and created["result"]["resultType"] == "task", created
    task_id = created["result"]["taskId"]
    [(key, _)] = poll_task(url, task_id, trace, "input_required")["inputRequests"].items()
    update_id, _ = task_op(url, "tasks/update", task_id, trace,
                           inputResponses={key: {"action": "accept", "content": {"name": "Ada"}}})
    done = poll_task(url, task_id, trace, "completed")
    assert done["result"]["content"][0]["text"] == "Hello, Ada!", done

    first, update = span_of(rx, call_id), span_of(rx, update_id)
    assert first.attributes.get("mrtr.outcome") == "task" and "mrtr.task.created" in first.events, first.brief()
    call = rx.wait_one(lambda s: s.trace_id == trace and s.kind == "CLIENT" and s.name == "tools/call ask_name"
                       and "mrtr.task.completed" in s.events)
    assert call.parent_span_id == first.span_id, call.brief()
    assert call.events == ["mrtr.task.created", "mrtr.task.input_required", "mrtr.task.answered",
                           "mrtr.task.completed"], call.brief()
    # The answer went upstream under a client span of the tasks/update request.
    assert_delivered_under(rx, base, trace, update)


def test_a_string_request_id_is_its_text(traced):
    rx, proxy = traced["rx"], traced["proxy"]
    rpc_id = f"list-{unique_id()}"
    status, _ = post(proxy.url, modern(rpc_id, "tools/list"))
    assert status == 200
    span = rx.wait_one(lambda s: s.kind == "SERVER" and rpc_id in str(s.attributes.get("jsonrpc.request.id")))
    assert span.attributes["jsonrpc.request.id"] == rpc_id, span.brief()


def test_tracestate_and_baggage_reach_the_upstream_with_the_call(traced):
    proxy, base = traced["proxy"], traced["base"]
    trace = new_trace()
    extra = {"tracestate": "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE", "baggage": "userId=alice,tenant=t-7"}
    two_round_ask_name(proxy.url, trace, new_span(), new_span(), meta=extra)
    call = upstream_request(base, trace, "tools/call")
    for key, value in extra.items():
        assert call["meta"].get(key) == value, call
        assert call["headers"].get(key) == value, call


# What a client may send that must not reach the upstream, one W3C rule broken each.
BAD_TRACEPARENTS = {
    "invalid version": "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "invalid trace id": "00-zzzz651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "all-zero trace id": "00-00000000000000000000000000000000-b7ad6b7169203331-01",
    "all-zero parent id": "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
    "upper case hex": "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01",
}


@pytest.mark.parametrize("where", ["meta", "headers"])
def test_a_traceparent_that_does_not_parse_restarts_the_trace_and_its_tracestate_goes_nowhere(traced, where):
    """With export on, the proxy's span is a root of a trace of its own and the upstream's parent is
    the proxy's span, never the client's value; the tracestate that came with it is not sent on,
    the baggage (on its own) is, less its malformed member."""
    rx, proxy, base = traced["rx"], traced["proxy"], traced["base"]
    for rule, bad in BAD_TRACEPARENTS.items():
        rpc_id = unique_id()
        context = {"traceparent": bad, "tracestate": "vendor=1", "baggage": f"probe={rpc_id},bad key=1"}
        body = modern(rpc_id, "tools/list", meta=context if where == "meta" else None)
        status, _ = post(proxy.url, body, headers=context if where == "headers" else None)
        assert status == 200, rule
        span = span_of(rx, rpc_id)
        assert not span.parent_span_id and span.trace_id not in bad, f"{rule}: {span.brief()}"
        listed = upstream_request(base, span.trace_id, "tools/list")
        for got in (listed["meta"], listed["headers"]):
            assert parse_traceparent(got["traceparent"])[0] == span.trace_id, f"{rule}: {listed}"
            assert "tracestate" not in got, f"{rule}: {listed}"
            assert got["baggage"] == f"probe={rpc_id}", f"{rule}: {listed}"


def test_oversized_tracestate_and_baggage_are_bounded_with_export_on(traced):
    proxy, base = traced["proxy"], traced["base"]
    huge = "x" * 65536
    trace = new_trace()
    status, _ = post(proxy.url, modern(unique_id(), "tools/list", meta={
        "traceparent": traceparent(trace, new_span()), "tracestate": huge, "baggage": huge}))
    assert status == 200
    listed = upstream_request(base, trace, "tools/list")
    for got in (listed["meta"], listed["headers"]):
        assert "tracestate" not in got and "baggage" not in got, listed
    # Valid lists past the W3C bounds, in headers: cut to them, whole members.
    state = ",".join(f"v{i}={'s' * 20}" for i in range(400))
    bag = ",".join(f"k{i}=v{i}" for i in range(300))
    trace = new_trace()
    status, _ = post(proxy.url, modern(unique_id(), "tools/list"), headers={
        "traceparent": traceparent(trace, new_span()), "tracestate": state, "baggage": bag})
    assert status == 200
    listed = upstream_request(base, trace, "tools/list")
    for got in (listed["meta"], listed["headers"]):
        assert len(got["tracestate"]) <= 512 and state.startswith(got["tracestate"]), listed
        assert len(got["baggage"].split(",")) == 180 and bag.startswith(got["baggage"]), listed
    metrics = proxy.metrics()
    for field in ("tracestate", "baggage"):
        for reason in ("invalid", "oversized"):
            assert metrics.sum("mrtr_trace_context_dropped_total", field=field, reason=reason) >= 1, (field, reason)


# --- other requests ----------------------------------------------------------------------------


def test_tools_list_is_a_server_span_with_the_mcp_attributes(traced):
    rx, proxy, base = traced["rx"], traced["proxy"], traced["base"]
    trace, client_span, rpc_id = new_trace(), new_span(), unique_id()
    status, answer = post(proxy.url, modern(rpc_id, "tools/list", meta={"traceparent": traceparent(trace, client_span)}))
    assert status == 200 and any(t["name"] == "ask_name" for t in answer["result"]["tools"]), answer
    span = span_of(rx, rpc_id)
    assert span.name == "tools/list", span.brief()
    common_attributes(span, "tools/list", rpc_id)
    assert span.attributes.get("mrtr.outcome") == "complete", span.brief()
    assert "gen_ai.tool.name" not in span.attributes, span.brief()
    assert (span.trace_id, span.parent_span_id) == (trace, client_span), span.brief()
    listed = upstream_request(base, trace, "tools/list")
    _, parent, _ = parse_traceparent(listed["meta"]["traceparent"])
    assert_descends(rx, parent, span.span_id, trace)


def call_trace_meta(rx, url, trace, client_span):
    """`trace_meta` called in `trace` under `client_span`: (the `_meta` the upstream SDK parsed,
    the proxy's server span of the call)."""
    rpc_id = unique_id()
    status, answer = post(url, modern(rpc_id, "tools/call", {"name": "trace_meta", "arguments": {}},
                                      meta={"traceparent": traceparent(trace, client_span)}))
    assert status == 200, answer
    parsed = json.loads(answer["result"]["content"][0]["text"])  # `_meta` as mcp==1.30.0 parsed it
    return parsed, span_of(rx, rpc_id)


def test_the_upstream_sdk_reads_the_proxys_context_from_meta(traced):
    rx, proxy = traced["rx"], traced["proxy"]
    trace, client_span = new_trace(), new_span()
    parsed, span = call_trace_meta(rx, proxy.url, trace, client_span)
    assert span.name == "tools/call trace_meta", span.brief()
    assert span.attributes.get("mrtr.outcome") == "complete", span.brief()
    up_trace, up_parent, _ = parse_traceparent(parsed["traceparent"])
    assert up_trace == trace, (parsed, span.brief())
    assert (span.trace_id, span.parent_span_id) == (trace, client_span), span.brief()
    assert_descends(rx, up_parent, span.span_id, trace)


@pytest.fixture(scope="module", params=["sse", "stdio"])
def other_transport(request, traced, tmp_path_factory):
    """The recording server on HTTP+SSE or as a stdio child, behind a proxy exporting to the
    module's receiver: (proxy, the upstream's base URL or None)."""
    config = telemetry_config(tmp_path_factory.mktemp(f"tracing-{request.param}"), traced["rx"].endpoint)
    script = [str(PY_LEGACY), str(HERE / "servers" / "py_trace_server.py")]
    if request.param == "stdio":
        up, base, upstream = None, None, [*script, "--stdio"]
    else:
        up = Proc([*script, "--sse"])
        port = up.wait_for(r"READY (\d+)").group(1)
        base = f"http://127.0.0.1:{port}"
        upstream = base + "/sse"
    try:
        proxy = start_proxy(upstream, config)
    except BaseException:
        if up:
            up.kill()
        raise
    yield proxy, base
    proxy.kill()
    if up:
        up.kill()


def test_the_call_is_traced_the_same_on_http_sse_and_stdio_upstreams(traced, other_transport):
    rx, (proxy, base) = traced["rx"], other_transport
    trace, client_span = new_trace(), new_span()
    parsed, span = call_trace_meta(rx, proxy.url, trace, client_span)
    assert (span.trace_id, span.parent_span_id) == (trace, client_span), span.brief()
    up_trace, up_parent, _ = parse_traceparent(parsed["traceparent"])
    assert up_trace == trace, parsed
    call = rx.wait_one(lambda s: s.trace_id == trace and s.span_id == up_parent)
    assert (call.kind, call.name, call.parent_span_id) == ("CLIENT", "tools/call trace_meta", span.span_id), \
        call.brief()
    if base:
        # HTTP+SSE: the POST of the call carried the same context as a header.
        [posted] = [e for e in seen_in_trace(base, trace) if e.get("method") == "tools/call"]
        assert posted["headers"].get("traceparent") == parsed["traceparent"], posted


def legacy_post(url, body, headers):
    """POSTs one legacy (2025-06-18) message; (status, response headers, answers parsed from JSON
    or SSE)."""
    h = {"content-type": "application/json", "accept": "application/json, text/event-stream", **headers}
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers=h)
    with urllib.request.urlopen(req, timeout=WAIT_S) as r:
        raw = r.read().decode()
        if not r.headers.get("content-type", "").startswith("text/event-stream"):
            return r.status, r.headers, [json.loads(raw)] if raw.strip() else []
        return r.status, r.headers, sse_messages(raw)


def test_a_legacy_clients_requests_are_spans_in_its_trace_and_reach_the_upstream_untouched(traced):
    rx, proxy, base = traced["rx"], traced["proxy"], traced["base"]
    trace, init_span, call_span = new_trace(), new_span(), new_span()
    legacy = "2025-06-18"
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": legacy, "capabilities": {}, "clientInfo": {"name": "legacy-tracing", "version": "1"}}}
    status, headers, _ = legacy_post(proxy.url, init, {"traceparent": traceparent(trace, init_span)})
    assert status == 200
    session = {"mcp-session-id": headers["mcp-session-id"], "mcp-protocol-version": legacy}
    legacy_post(proxy.url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session)
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "trace_meta", "arguments": {}, "_meta": {"traceparent": traceparent(trace, call_span)}}}
    status, _, answers = legacy_post(proxy.url, call, session)
    assert status == 200 and answers[-1]["id"] == 2, answers

    spans = rx.wait_for(server_spans(trace), count=2)
    by_name = {s.name: s for s in spans}
    assert by_name["initialize"].parent_span_id == init_span, rx.dump(lambda s: s.trace_id == trace)
    called = by_name["tools/call trace_meta"]
    assert called.parent_span_id == call_span, called.brief()
    assert called.attributes.get("gen_ai.tool.name") == "trace_meta", called.brief()
    assert called.attributes.get("mcp.protocol.version") == legacy, called.brief()
    # Pass-through: the upstream got the client's own context, not one of the proxy's spans.
    got = json.loads(answers[-1]["result"]["content"][0]["text"])
    assert got["traceparent"] == traceparent(trace, call_span), got


def test_the_http_traceparent_header_is_the_parent_when_meta_has_none(traced):
    rx, proxy, base = traced["rx"], traced["proxy"], traced["base"]
    trace, client_span, rpc_id = new_trace(), new_span(), unique_id()
    status, _ = post(proxy.url, modern(rpc_id, "tools/list"), headers={"traceparent": traceparent(trace, client_span)})
    assert status == 200
    span = span_of(rx, rpc_id)
    assert (span.trace_id, span.parent_span_id) == (trace, client_span), span.brief()
    # The upstream reads `_meta`: the proxy put the context there too.
    listed = upstream_request(base, trace, "tools/list")
    assert parse_traceparent(listed["meta"]["traceparent"])[0] == trace, listed


def test_meta_wins_over_the_http_header(traced):
    rx, proxy = traced["rx"], traced["proxy"]
    meta_trace, meta_span, header_trace, rpc_id = new_trace(), new_span(), new_trace(), unique_id()
    status, _ = post(proxy.url, modern(rpc_id, "tools/list", meta={"traceparent": traceparent(meta_trace, meta_span)}),
                     headers={"traceparent": traceparent(header_trace, new_span())})
    assert status == 200
    span = span_of(rx, rpc_id)
    assert (span.trace_id, span.parent_span_id) == (meta_trace, meta_span), span.brief()


def test_a_rejected_retry_is_a_span_with_error_type(traced):
    rx, proxy = traced["rx"], traced["proxy"]
    trace, retry_span, first_id, retry_id = new_trace(), new_span(), unique_id(), unique_id()
    status, first = post(proxy.url, modern(first_id, "tools/call", {"name": "ask_name", "arguments": {}}, ELICIT_CAPS,
                                           {"traceparent": traceparent(trace, new_span())}))
    assert first["result"]["resultType"] == "input_required", first
    [key] = first["result"]["inputRequests"]
    token = first["result"]["requestState"]
    forged = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    status, answer = post(proxy.url, modern(retry_id, "tools/call", {
        "name": "ask_name", "arguments": {}, "inputResponses": {key: {"action": "accept", "content": {"name": "Eve"}}},
        "requestState": forged}, ELICIT_CAPS, {"traceparent": traceparent(trace, retry_span)}))
    assert "error" in answer, answer
    span = span_of(rx, retry_id)
    assert span.attributes.get("error.type") in {str(answer["error"]["code"]), str(status)}, (span.brief(), status, answer)
    assert span.attributes.get("mcp.method.name") == "tools/call", span.brief()
    assert (span.trace_id, span.parent_span_id) == (trace, retry_span), span.brief()


def test_an_unsampled_client_trace_is_propagated_but_not_exported(traced):
    rx, proxy, base = traced["rx"], traced["proxy"], traced["base"]
    unsampled, unsampled_id, sampled_id = new_trace(), unique_id(), unique_id()
    post(proxy.url, modern(unsampled_id, "tools/list", meta={"traceparent": traceparent(unsampled, new_span(), sampled=False)}))
    post(proxy.url, modern(sampled_id, "tools/list", meta={"traceparent": traceparent(new_trace(), new_span())}))
    # Barrier: the later, sampled request's span has been exported, so the earlier one would have been.
    span_of(rx, sampled_id)
    exported = rx.spans(lambda s: s.attributes.get("jsonrpc.request.id") == str(unsampled_id))
    assert not exported, [s.brief() for s in exported]
    listed = upstream_request(base, unsampled, "tools/list")
    assert parse_traceparent(listed["meta"]["traceparent"])[2] == "00", listed


# --- the official Python client's own trace context --------------------------------------------


class _MintingTracer:
    """Stands in for an OpenTelemetry SDK in this process: inside an active span, each span the
    official client starts gets a fresh span id in the same trace (recorded); outside one, none
    (as the API's no-op tracer), so other tests' clients send no trace context."""

    def __init__(self):
        from opentelemetry import trace as api

        self.api = api
        self.started = []  # (name, span id)

    def start_span(self, name, context=None, *args, **kwargs):
        api = self.api
        parent = api.get_current_span(context).get_span_context()
        if not parent.is_valid:
            return api.INVALID_SPAN
        ctx = api.SpanContext(parent.trace_id, int(new_span(), 16), is_remote=False,
                              trace_flags=api.TraceFlags(api.TraceFlags.SAMPLED))
        self.started.append((name, format(ctx.span_id, "016x")))
        return api.NonRecordingSpan(ctx)

    @contextlib.contextmanager
    def start_as_current_span(self, name, context=None, *args, **kwargs):
        span = self.start_span(name, context)
        with self.api.use_span(span, end_on_exit=True):
            yield span


@pytest.fixture(scope="module")
def minting_tracer():
    from opentelemetry import trace as api

    tracer = _MintingTracer()

    class Provider(api.TracerProvider):
        def get_tracer(self, *args, **kwargs):
            return tracer

    api.set_tracer_provider(Provider())
    if api.get_tracer_provider().get_tracer("x") is not tracer:
        pytest.skip("another OpenTelemetry tracer provider is already set in this process")
    return tracer


def test_the_official_python_clients_trace_context_parents_the_proxys_spans(traced, minting_tracer):
    import asyncio

    from mcp import Client
    from mcp.types import ElicitResult
    from opentelemetry import trace as api

    rx, proxy, base = traced["rx"], traced["proxy"], traced["base"]
    trace, root = new_trace(), new_span()

    async def elicit(ctx, params):
        return ElicitResult(action="accept", content={"name": "Ada"})

    async def go():
        async with Client(proxy.url, mode=MODERN, elicitation_callback=elicit) as c:
            return await asyncio.wait_for(c.call_tool("ask_name", {}), timeout=WAIT_S)

    ambient = api.NonRecordingSpan(api.SpanContext(int(trace, 16), int(root, 16), is_remote=False,
                                                   trace_flags=api.TraceFlags(api.TraceFlags.SAMPLED)))
    before = len(minting_tracer.started)
    with api.use_span(ambient):
        result = asyncio.run(go())
    assert result.content[0].text == "Hello, Ada!"
    legs = [sid for name, sid in minting_tracer.started[before:] if name == "MCP send tools/call ask_name"]
    assert len(legs) == 2, minting_tracer.started[before:]
    spans = rx.wait_for(server_spans(trace, "tools/call ask_name"), count=2)
    assert {s.parent_span_id for s in spans} == set(legs), rx.dump(lambda s: s.trace_id == trace)
    assert {s.attributes.get("mrtr.outcome") for s in spans} == {"input_required", "complete"}
    call = upstream_request(base, trace, "tools/call")
    first = next(s for s in spans if s.parent_span_id == legs[0])
    assert_descends(rx, parse_traceparent(call["meta"]["traceparent"])[1], first.span_id, trace)


# --- export configuration ----------------------------------------------------------------------


def test_the_resource_names_the_configured_service(traced):
    rx, proxy = traced["rx"], traced["proxy"]
    rpc_id = unique_id()  # found by its id: this holds whatever the span's parent
    status, _ = post(proxy.url, modern(rpc_id, "tools/list", meta={"traceparent": traceparent(new_trace(), new_span())}))
    assert status == 200
    span = rx.wait_one(lambda s: s.attributes.get("jsonrpc.request.id") == str(rpc_id))
    assert span.service_name == SERVICE, span.resource
    assert rx.refused == [], rx.refused


def test_the_otel_environment_variables_win_over_the_file(traced, tmp_path):
    rx, base = traced["rx"], traced["base"]
    config = telemetry_config(tmp_path, f"http://127.0.0.1:{free_port()}")  # nobody there
    proxy = start_proxy(base + "/mcp", config, OTEL_EXPORTER_OTLP_ENDPOINT=rx.endpoint,
                        OTEL_SERVICE_NAME="from-the-environment")
    try:
        rpc_id = unique_id()
        status, _ = post(proxy.url, modern(rpc_id, "tools/list"))
        assert status == 200
        span = rx.wait_one(lambda s: s.attributes.get("jsonrpc.request.id") == str(rpc_id))
        assert span.service_name == "from-the-environment", span.resource
    finally:
        proxy.kill()


# --- a dead collector --------------------------------------------------------------------------


@contextlib.contextmanager
def silent_collector():
    """A TCP port whose kernel completes the handshake (listen backlog) but that never answers:
    an exporter that waited on it would wait for its whole timeout."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1024)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize("collector", ["closed-port", "silent"])
def test_a_dead_collector_leaves_requests_unaffected(traced, tmp_path, collector):
    base = traced["base"]
    with contextlib.ExitStack() as stack:
        if collector == "silent":
            endpoint = stack.enter_context(silent_collector())
        else:
            endpoint = f"http://127.0.0.1:{free_port()}"
        config = telemetry_config(tmp_path, endpoint, export_timeout="10s", max_queue=4)
        proxy = start_proxy(base + "/mcp", config)
        stack.callback(proxy.kill)
        with elapsed() as took:
            trace = new_trace()
            two_round_ask_name(proxy.url, trace, new_span(), new_span())
            for i in range(20):  # far more spans than the queue holds
                status, answer = post(proxy.url, modern(100 + i, "tools/list",
                                                        meta={"traceparent": traceparent(trace, new_span())}))
                assert status == 200 and "result" in answer, answer
        # Each request is milliseconds; one that waited on the collector would take the 10 s timeout.
        assert took["s"] < 8, f"22 requests took {took['s']:.1f}s with a {collector} collector"
        call = upstream_request(base, trace, "tools/call")
        assert parse_traceparent(call["meta"]["traceparent"])[0] == trace
        health = urllib.request.urlopen(proxy.base + "/healthz", timeout=10)
        assert health.status == 200
        # What was lost is counted: a silent collector holds the 4 queued spans for its whole
        # timeout, so every span past them (22 requests, at least one span each) is dropped at
        # once; a closed port fails each export, and its batch is dropped.
        dropped = "mrtr_trace_spans_dropped_total"
        if collector == "silent":
            assert proxy.metrics().sum(dropped, reason="queue_full") >= 22 - 4, proxy.metrics()
        else:
            wait_until(lambda: proxy.metrics().sum(dropped, reason="export_failed") > 0,
                       f"no failed export counted: {proxy.metrics()}")
