"""Scale-out on the real binary: three proxies, each in front of its own Python mcp==1.30.0
upstream, behind nginx round-robin (no stickiness), sharing one key. The official Python modern
client (mcp==2.3.0, pinned to 2026-07-28; and the TS client 2.4.0) runs two-round calls through the balancer, so its
retries land on any replica: they are forwarded to the owner. When the owner is SIGKILLed with
the call parked (at round 1 or 2; with its upstream or without), a read-only tool is run again
on a survivor from the token and completes with the answers already given, the user's callback
not invoked again for them; a tool that is not replay-safe gets the call-lost error.
"""

import asyncio
import shutil
import signal
import socket
import threading
import time

import pytest
from mcp.client import Client

from conftest import Proc, Proxy, on_probed_ports, run_ts_client, start_py_upstream, wait_tcp
from test_modern_clients import PyClient, text_of, ts_text

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
REPLICAS = 3
PARALLEL_CALLS = 12
CALL_TIMEOUT_S = 60

NGINX_CONF = """
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 512; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    upstream replicas {{
{servers}
        keepalive 16;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://replicas;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            # Responses stream (SSE); requests are buffered, so that one can go to the next
            # replica (nginx cannot resend a body it started to stream).
            proxy_buffering off;
            proxy_read_timeout 120s;
            # A replica that refuses the connection (killed, restarting) is skipped, and so is one
            # that answers 503 because it drains (as a readiness probe would take it out of a
            # Service); neither started the call.
            proxy_next_upstream error timeout http_503 non_idempotent;
        }}
    }}
}}
"""


def start_balancer(tmp_path, ports):
    """nginx round-robin over the replicas on `ports`: (its process, its MCP URL)."""
    servers = "\n".join(f"        server 127.0.0.1:{p} max_fails=0;" for p in ports)
    conf = tmp_path / "nginx.conf"
    started = []

    def start(lb_ports):
        [lb_port] = lb_ports
        conf.write_text(NGINX_CONF.format(dir=tmp_path, servers=servers, port=lb_port))
        started.append(Proc([NGINX, "-p", str(tmp_path), "-c", str(conf)]))
        wait_tcp(lb_port, started[-1])
        return started[-1], f"http://127.0.0.1:{lb_port}/mcp"

    return on_probed_ports(1, start, lambda: started and started[-1].stop())


class Cluster:
    """Three replicas sharing a key, each with its own Python legacy upstream (started with
    `upstream_flags`), behind nginx round-robin; `extra_toml` joins the replicas' config. With
    `named`, replica i has the fixed instance id `replica-<i>` (random otherwise); without
    `listed`, no replica lists the others in `[cluster] peers`."""

    def __init__(self, tmp_path, extra_toml="", upstream_flags=(), named=False, listed=True):
        # The peers must know each other's ports before they start.
        options = (extra_toml, upstream_flags, named, listed)
        ports = on_probed_ports(REPLICAS, lambda ports: self._start(tmp_path, ports, options), self.close)
        self.nginx, self.url = start_balancer(tmp_path, ports)

    def _start(self, tmp_path, ports, options):
        """The replicas on `ports`; returns the ports."""
        self.upstreams, self.proxies, self.configs, self.upstream_urls = [], [], [], []
        extra_toml, upstream_flags, named, listed = options
        peers = ", ".join(f'"http://127.0.0.1:{p}/mcp"' for p in ports) if listed else ""
        for i, port in enumerate(ports):
            config = tmp_path / (f"replica-{i}.toml" if named else "proxy.toml")
            config.write_text(
                '[state]\nsecret = "a-cluster-key-shared-by-every-replica-0123"\ngather_window = "250ms"\n'
                + (f'instance_id = "replica-{i}"\n' if named else "")
                + f'[server]\nshutdown_grace = "1s"\n[cluster]\npeers = [{peers}]\n' + extra_toml
            )
            up, url = start_py_upstream(*upstream_flags)
            self.upstreams.append(up)
            self.upstream_urls.append(url)
            self.configs.append(config)
            self.proxies.append(Proxy(url, config=config, listen=f"127.0.0.1:{port}"))
        return ports

    def restart(self, i):
        """SIGTERM replica `i`, wait for its drain and exit, and start it again on its port."""
        old = self.proxies[i]
        old.proc.p.send_signal(signal.SIGTERM)
        old.proc.p.wait(timeout=30)
        self.proxies[i] = Proxy(self.upstream_urls[i], config=self.configs[i], listen=old.listen)

    def per_replica(self, name, **labels):
        return [p.metrics().sum(name, **labels) for p in self.proxies]

    def total(self, name, **labels):
        return sum(p.metrics().sum(name, **labels) for p in self.proxies if p.proc.p.poll() is None)

    def owner(self):
        """The replica holding the one parked call."""
        [owner] = [p for p in self.proxies if p.metrics().sum("mrtr_parked_calls") > 0]
        return owner

    def close(self):
        if getattr(self, "nginx", None) is not None:
            self.nginx.stop()
        for p in self.proxies:
            p.kill()
        for u in self.upstreams:
            u.kill()


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    yield c
    c.close()


def test_parallel_two_round_calls_through_round_robin_all_complete_by_forwarding(cluster):
    async def one():
        client = PyClient(cluster.url)
        async with Client(cluster.url, mode="2026-07-28", **client.kwargs) as c:
            result = await asyncio.wait_for(c.call_tool("twice", {}), CALL_TIMEOUT_S)
        return text_of(result), client.counts["elicitation"]

    async def all_calls():
        return await asyncio.gather(*(one() for _ in range(PARALLEL_CALLS)))

    outcomes = asyncio.run(all_calls())
    assert outcomes == [("Ada and Ada", 2)] * PARALLEL_CALLS
    assert cluster.total("mrtr_forwarded_retries_total", result="ok") > 0
    assert cluster.total("mrtr_parked_calls") == 0


def test_the_ts_client_completes_two_round_calls_through_round_robin(cluster):
    ops = [{"op": "callTool", "name": "twice"}, {"op": "callTool", "name": "twice_read_only"}] * 2
    out = run_ts_client(cluster.url, ops)
    texts = [ts_text(r) for r in out["results"]]
    assert texts == ["Grace and Grace", "Grace and Grace, read-only"] * 2
    assert cluster.total("mrtr_forwarded_retries_total", result="ok") > 0


class KillOwnerAt(PyClient):
    """Answers every elicitation, but first, at question `at`, SIGKILLs the replica holding the
    parked call (and its upstream too, when `with_upstream`)."""

    def __init__(self, cluster, at, with_upstream):
        super().__init__(cluster.url)
        self.cluster, self.at, self.with_upstream = cluster, at, with_upstream

    async def _elicit(self, ctx, params):
        if self.counts["elicitation"] + 1 == self.at:
            owner = await asyncio.to_thread(self.cluster.owner)
            owner.proc.p.send_signal(signal.SIGKILL)
            owner.proc.p.wait(timeout=10)
            if self.with_upstream:
                up = self.cluster.upstreams[self.cluster.proxies.index(owner)]
                up.p.send_signal(signal.SIGKILL)
                up.p.wait(timeout=10)
        return await super()._elicit(ctx, params)


@pytest.mark.parametrize("at", [1, 2])
@pytest.mark.parametrize("with_upstream", [False, True])
def test_a_read_only_call_survives_the_loss_of_its_owner_without_asking_again(cluster, at, with_upstream):
    client = KillOwnerAt(cluster, at, with_upstream)
    result = client.run(lambda c: c.call_tool("twice_read_only", {}))
    assert text_of(result) == "Ada and Ada, read-only"
    assert client.counts["elicitation"] == 2, "each question reached the user once"
    assert cluster.total("mrtr_replayed_calls_total") == 1
    assert cluster.total("mrtr_replayed_answers_total") == at


def leaves(e):
    """The exceptions inside (nested) exception groups."""
    if isinstance(e, BaseExceptionGroup):
        return [leaf for inner in e.exceptions for leaf in leaves(inner)]
    return [e]


def test_a_call_that_is_not_replay_safe_gets_the_call_lost_error(cluster):
    client = KillOwnerAt(cluster, 2, False)
    with pytest.raises(BaseException) as raised:
        client.run(lambda c: c.call_tool("twice", {}))
    [err] = [e for e in leaves(raised.value) if "start the call again" in str(e)]
    assert err.error.code == -32602 and err.error.data == {"reason": "call_lost"}, repr(err)
    assert client.counts["elicitation"] == 2
    assert cluster.total("mrtr_replayed_calls_total") == 0


ROLLING_WORKERS = 4
ROLLING_MAX_CALLS = 2000
CALLS_BETWEEN_RESTARTS = 20


def test_a_rolling_restart_of_every_replica_loses_no_read_only_call(cluster):
    """A bounded loop of read-only two-round calls (4 at a time) while each replica in turn is
    stopped (SIGTERM: drain, then exit) and started again; reports the success rate."""
    stop = threading.Event()
    outcomes = []

    async def worker():
        while not stop.is_set() and len(outcomes) < ROLLING_MAX_CALLS:
            client = PyClient(cluster.url)
            try:
                async with Client(cluster.url, mode="2026-07-28", **client.kwargs) as c:
                    r = await asyncio.wait_for(c.call_tool("twice_read_only", {}), CALL_TIMEOUT_S)
                ok = text_of(r) == "Ada and Ada, read-only" and client.counts["elicitation"] == 2
            except Exception as e:  # noqa: BLE001 - every failure counts against the rate
                ok = False
                print("call failed:", repr(e))
            outcomes.append(ok)

    async def load():
        await asyncio.gather(*(worker() for _ in range(ROLLING_WORKERS)))

    def completed_at_least(n):
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while len(outcomes) < n and time.monotonic() < deadline and loader.is_alive():
            time.sleep(0.05)

    loader = threading.Thread(target=lambda: asyncio.run(load()))
    loader.start()
    # Calls complete between restarts, and calls are in flight during each one.
    for i in range(REPLICAS):
        completed_at_least((i + 1) * CALLS_BETWEEN_RESTARTS)
        cluster.restart(i)
    completed_at_least((REPLICAS + 1) * CALLS_BETWEEN_RESTARTS)
    stop.set()
    loader.join(timeout=CALL_TIMEOUT_S * 2)
    assert not loader.is_alive()
    rate = sum(outcomes) / len(outcomes)
    print(f"rolling restart: {sum(outcomes)}/{len(outcomes)} read-only calls completed ({rate:.1%})")
    assert len(outcomes) >= (REPLICAS + 1) * CALLS_BETWEEN_RESTARTS and rate == 1.0


def test_a_stack_whose_probed_port_was_taken_starts_again_on_another(monkeypatch):
    """The harness's answer to a port probed free and taken by another worker's process before it
    was bound (conftest.on_probed_ports, which every cluster here starts through): what was
    started is stopped, and it starts again on other ports."""
    import conftest

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        first = iter([taken.getsockname()[1]])
        probe = conftest.free_port
        monkeypatch.setattr(conftest, "free_port", lambda: next(first, None) or probe())
        tried, stopped = [], []

        def start(ports):
            tried.append(ports[0])
            # No upstream: the proxy listens all the same.
            return Proxy("http://127.0.0.1:9/mcp", listen=f"127.0.0.1:{ports[0]}")

        proxy = conftest.on_probed_ports(1, start, lambda: stopped.append(True))
        try:
            assert tried[0] == taken.getsockname()[1] and len(tried) == 2 and stopped == [True], tried
            assert proxy.url == f"http://127.0.0.1:{tried[1]}/mcp"
        finally:
            proxy.kill()
