"""Trace context across the three-replica cluster, on the real binary with real peers: three
proxies sharing a key, each in front of its own recording Python upstream (py_trace_server.py,
mcp==1.30.0), behind nginx round-robin, every replica exporting over OTLP to one real receiver
(otlp_receiver.py). Instance ids are left unset, so each replica picks a random one, as a
deployment does.

The client is raw 2026-07-28 HTTP with a fresh trace per test and its own span per leg. It posts
each leg to a chosen replica, so where a retry goes is deterministic: the retry of a call parked
on replica 0 sent to replica 1 is forwarded to replica 0; with replica 0 stopped or killed, a
read-only call is replayed on replica 1. One more test goes through the balancer. Nothing sleeps: the
receiver's and the upstreams' records are waited on, bounded.

`pytest -s` prints what the receiver and the upstreams saw of the forwarded and the replayed calls.
"""

import base64
import json
import os
import signal

import pytest

from conftest import Proxy, on_probed_ports
from otlp_receiver import OtlpReceiver
from test_cluster import REPLICAS, start_balancer
from test_tracing import (
    ELICIT_CAPS,
    SERVICE,
    assert_descends,
    modern,
    new_span,
    new_trace,
    parse_traceparent,
    post,
    seen_in_trace,
    span_of,
    start_trace_upstream,
    traceparent,
    two_round_ask_name,
    unique_id,
    upstream_request,
)

INSTANCE = "service.instance.id"


# --- the cluster -------------------------------------------------------------------------------


def start_replica(upstream, config, listen):
    """A replica with `config`, no OTEL_* variable of the test's environment."""
    with pytest.MonkeyPatch.context() as mp:
        for k in [k for k in os.environ if k.startswith("OTEL_")]:
            mp.delenv(k)
        return Proxy(upstream, config=config, listen=listen)


class TracedCluster:
    """test_cluster.Cluster with recording upstreams and every replica exporting to `rx`:
    three replicas sharing a key and the peer list, behind nginx round-robin."""

    def __init__(self, tmp_path, rx):
        self.upstreams, self.bases, self.proxies, self.nginx = [], [], [], None
        try:
            # The peers must know each other's ports before they start.
            ports = on_probed_ports(REPLICAS, lambda ports: self._start(tmp_path, rx, ports), self.close)
            self.nginx, self.url = start_balancer(tmp_path, ports)
        except BaseException:
            self.close()
            raise

    def _start(self, tmp_path, rx, ports):
        """The replicas on `ports`; returns the ports."""
        self.upstreams, self.bases, self.proxies = [], [], []
        peers = ", ".join(f'"http://127.0.0.1:{p}/mcp"' for p in ports)
        config = tmp_path / "proxy.toml"
        config.write_text(
            '[state]\nsecret = "a-cluster-key-shared-by-every-replica-0123"\ngather_window = "250ms"\n'
            f'[server]\nshutdown_grace = "1s"\n[cluster]\npeers = [{peers}]\n'
            f'[telemetry]\notlp_endpoint = "{rx.endpoint}"\nservice_name = "{SERVICE}"\nsample_ratio = 1.0\n'
        )
        for port in ports:
            up, base = start_trace_upstream()
            self.upstreams.append(up)
            self.bases.append(base)
            self.proxies.append(start_replica(base + "/mcp", config, f"127.0.0.1:{port}"))
        return ports

    def stop(self, i, sig):
        """Sends `sig` to replica `i` (its upstream stays) and waits for it to be gone."""
        p = self.proxies[i].proc.p
        p.send_signal(sig)
        p.wait(timeout=30)

    def close(self):
        if self.nginx is not None:
            self.nginx.stop()
        for p in self.proxies:
            p.kill()
        for u in self.upstreams:
            u.kill()


@pytest.fixture(scope="module")
def rx():
    with OtlpReceiver() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def cluster(rx, tmp_path_factory):
    c = TracedCluster(tmp_path_factory.mktemp("traced-cluster"), rx)
    yield c
    c.close()


@pytest.fixture
def fresh_cluster(rx, tmp_path):
    """A cluster of its own, for a test that kills a replica."""
    c = TracedCluster(tmp_path, rx)
    yield c
    c.close()


# --- helpers -----------------------------------------------------------------------------------


def call(url, tool, trace, span):
    """The first leg of `tool`; (its JSON-RPC id, its result: input_required)."""
    rpc_id = unique_id()
    status, answer = post(url, modern(rpc_id, "tools/call", {"name": tool, "arguments": {}}, ELICIT_CAPS,
                                      {"traceparent": traceparent(trace, span)}))
    assert status == 200 and answer["result"]["resultType"] == "input_required", answer
    return rpc_id, answer["result"]


def answer(url, tool, asked, name, trace, span):
    """A retry answering `asked` (an input_required result) with `name`; (its id, its result)."""
    [key] = asked["inputRequests"]
    rpc_id = unique_id()
    status, reply = post(url, modern(rpc_id, "tools/call", {
        "name": tool, "arguments": {},
        "inputResponses": {key: {"action": "accept", "content": {"name": name}}},
        "requestState": asked["requestState"]}, ELICIT_CAPS, {"traceparent": traceparent(trace, span)}))
    assert status == 200 and "result" in reply, reply
    return rpc_id, reply["result"]


def token_issuer(request_state):
    """The instance a requestState names as its owner (`iss` of the JWS payload)."""
    payload = request_state.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["iss"]


def the_answer(base, trace, name):
    """The elicitation answer (accepting `name`) the upstream at `base` was POSTed in `trace`,
    and the span id its trace context names as its parent."""
    found = [e for e in seen_in_trace(base, trace)
             if e["kind"] == "response" and (e.get("content") or {}).get("name") == name]
    assert len(found) == 1, f"{len(found)} answers {name!r} in trace {trace}: {seen_in_trace(base, trace)}"
    tp = found[0]["headers"].get("traceparent") or (found[0].get("meta") or {}).get("traceparent")
    assert tp, f"the answer delivered upstream carried no trace context: {found[0]}"
    answer_trace, parent, _ = parse_traceparent(tp)
    assert answer_trace == trace, found[0]
    return found[0], parent


def dump(rx, trace, bases):
    lines = [f"--- the receiver saw (trace {trace}), by instance"]
    for s in sorted(rx.spans(lambda s: s.trace_id == trace), key=lambda s: s.start_ns):
        lines.append(f"[{s.resource.get(INSTANCE, '?')}] {s.brief()}")
    for i, base in bases:
        lines.append(f"--- the upstream of replica {i} saw")
        for e in seen_in_trace(base, trace):
            what = e.get("method") or f"answer({e.get('action')} {e.get('content')})"
            lines.append(f"{e['kind']:<12} {what:<32} _meta.traceparent={(e.get('meta') or {}).get('traceparent')}"
                         f" header={e['headers'].get('traceparent')}")
    return "\n".join(lines)


# --- a forward ---------------------------------------------------------------------------------


def test_a_forwarded_retry_is_in_the_clients_trace_on_both_replicas(cluster, rx):
    trace, c1, c2 = new_trace(), new_span(), new_span()
    first_id, asked = call(cluster.proxies[0].url, "ask_name", trace, c1)
    owner_id = token_issuer(asked["requestState"])
    retry_id, done = answer(cluster.proxies[1].url, "ask_name", asked, "Ada", trace, c2)
    assert done["content"][0]["text"] == "Hello, Ada!", done

    # Every server span of the call is in the client's trace: the first leg on replica 0, the
    # retry on replica 1 (which forwarded it) and on replica 0 (which resumed the call).
    first = span_of(rx, first_id)
    assert (first.trace_id, first.parent_span_id) == (trace, c1), first.brief()
    retries = rx.wait_for(lambda s: s.kind == "SERVER" and s.attributes.get("jsonrpc.request.id") == str(retry_id),
                          count=2)
    assert len(retries) == 2, [s.brief() for s in retries]
    for span in [first, *retries]:
        assert span.trace_id == trace, span.brief()
        assert span.name == "tools/call ask_name" and span.service_name == SERVICE, span.brief()
    assert rx.spans(lambda s: s.trace_id != trace and s.attributes.get("jsonrpc.request.id")
                    in (str(first_id), str(retry_id))) == []

    # The owner's upstream: the call under the first leg's span, the answer under the owner's
    # retry span (which tells the two retry spans apart); the other upstreams saw nothing of it.
    up = upstream_request(cluster.bases[0], trace, "tools/call", "ask_name")
    assert_descends(rx, parse_traceparent(up["meta"]["traceparent"])[1], first.span_id, trace)
    _, answer_parent = the_answer(cluster.bases[0], trace, "Ada")
    chain = assert_descends(rx, answer_parent, {s.span_id for s in retries}, trace)
    [owner] = [s for s in retries if s.span_id == chain[-1]]
    [forwarder] = [s for s in retries if s is not owner]
    for base in cluster.bases[1:]:
        assert seen_in_trace(base, trace) == [], base
    # The forwarder's span is the client's retry span's child; the owner's is too, or under the
    # forwarder's.
    assert forwarder.parent_span_id == c2, forwarder.brief()
    assert_descends(rx, owner.parent_span_id, {c2, forwarder.span_id}, trace)

    # Both verified the token: both link to the first leg's span.
    for span in (owner, forwarder):
        assert (first.trace_id, first.span_id) in span.links, (first.brief(), span.brief())
    assert owner.attributes.get("mrtr.outcome") == "complete", owner.brief()

    print("\n" + dump(rx, trace, [(0, cluster.bases[0])]))
    print(f"--- the answer's parent chain {' <- '.join(chain)}; owner {owner_id}")

    # Two instances: the first leg and the resumed retry on the owner (the token's issuer), the
    # forwarding span on another; and the forwarder says it forwarded.
    assert first.resource.get(INSTANCE) == owner_id, first.resource
    assert owner.resource.get(INSTANCE) == owner_id, owner.resource
    assert forwarder.resource.get(INSTANCE) not in (None, "", owner_id), forwarder.resource
    assert forwarder.event("mrtr.forward") == {"mrtr.peer": owner_id, "mrtr.forwarded": True}, \
        forwarder.event_attributes
    assert "mrtr.replay" not in forwarder.events, forwarder.brief()
    assert "mrtr.resume" in owner.events, owner.brief()


def test_through_the_balancer_every_span_of_the_call_is_in_the_clients_trace(cluster, rx):
    trace = new_trace()
    first_id, retry_id = two_round_ask_name(cluster.url, trace, new_span(), new_span())
    first = span_of(rx, first_id)
    assert first.trace_id == trace, first.brief()
    # Round-robin sends the retry to the next replica: it forwards (two spans) unless it is the owner.
    retries = rx.wait_for(lambda s: s.kind == "SERVER" and s.attributes.get("jsonrpc.request.id") == str(retry_id))
    for span in retries:
        assert span.trace_id == trace, span.brief()
        assert (first.trace_id, first.span_id) in span.links, (first.brief(), span.brief())


# --- a parked call, a lost owner -------------------------------------------------------------


def test_the_first_legs_span_is_exported_while_its_call_is_parked(cluster, rx):
    """An owner that dies with the call parked must not take the first leg's span with it."""
    trace = new_trace()
    first_id, asked = call(cluster.proxies[2].url, "ask_name", trace, new_span())
    try:
        first = rx.wait_one(lambda s: s.kind == "SERVER" and s.attributes.get("jsonrpc.request.id") == str(first_id),
                            timeout=10)
    finally:
        answer(cluster.proxies[2].url, "ask_name", asked, "Ada", trace, new_span())
    assert first.trace_id == trace, first.brief()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["stopped", "killed"])
def test_a_replayed_call_is_in_the_clients_trace_and_linked_to_its_first_leg(fresh_cluster, rx, sig):
    cluster = fresh_cluster
    trace, c1, c2, c3 = new_trace(), new_span(), new_span(), new_span()
    first_id, asked = call(cluster.proxies[0].url, "twice_read_only", trace, c1)
    owner_id = token_issuer(asked["requestState"])
    if sig == signal.SIGKILL:
        # A killed instance loses what it has not exported: its first leg's span must be out
        # while the call is parked (a stopped one flushes at exit).
        span_of(rx, first_id)
    cluster.stop(0, sig)
    first = span_of(rx, first_id)
    assert (first.trace_id, first.parent_span_id) == (trace, c1), first.brief()

    retry_id, again = answer(cluster.proxies[1].url, "twice_read_only", asked, "Ada", trace, c2)
    assert again["resultType"] == "input_required", again
    assert token_issuer(again["requestState"]) != owner_id, "the replayed call is held by replica 1"
    last_id, done = answer(cluster.proxies[1].url, "twice_read_only", again, "Grace", trace, c3)
    assert done["content"][0]["text"] == "Ada and Grace, read-only", done
    assert cluster.proxies[1].metrics().sum("mrtr_replayed_calls_total") == 1

    replay, last = span_of(rx, retry_id), span_of(rx, last_id)
    assert (replay.trace_id, replay.parent_span_id) == (trace, c2), replay.brief()
    assert (last.trace_id, last.parent_span_id) == (trace, c3), last.brief()
    assert (first.trace_id, first.span_id) in replay.links, (first.brief(), replay.brief())

    # Replica 1's upstream: the call run again under the replay span, the answer given before
    # replayed from the token in the same trace, the new answer under the last leg's span.
    base = cluster.bases[1]
    up = upstream_request(base, trace, "tools/call", "twice_read_only")
    assert_descends(rx, parse_traceparent(up["meta"]["traceparent"])[1], replay.span_id, trace)
    the_answer(base, trace, "Ada")
    _, grace_parent = the_answer(base, trace, "Grace")
    assert_descends(rx, grace_parent, last.span_id, trace)

    print("\n" + dump(rx, trace, [(0, cluster.bases[0]), (1, base)]))

    assert first.resource.get(INSTANCE) == owner_id, first.resource
    assert replay.resource.get(INSTANCE) not in (None, "", owner_id), replay.resource
    assert replay.event("mrtr.replay") == {"mrtr.owner": owner_id, "mrtr.round": 1}, replay.event_attributes
    # The owner could not be reached: the forward was tried, and failed.
    assert replay.event("mrtr.forward") == {"mrtr.peer": owner_id, "mrtr.forwarded": False}, replay.event_attributes
