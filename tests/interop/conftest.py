"""Process fixtures for the real-peer interop tests.

Every peer listens on 127.0.0.1 with a port it chose itself (port 0) and announces it on a line we
wait for; server-everything only takes a PORT, so it gets a probed free port and we wait until it
accepts connections. Every process is killed on teardown.
"""

import json
import os
import re
import socket
import sys
import time
import urllib.request
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE.parent))
from procs import STARTUP_TIMEOUT_S, Proc  # noqa: E402  (tests/procs.py, shared with tests/deploy)

import drivers  # noqa: E402
from drivers import NODE, PY_LEGACY  # noqa: E402  (re-exported: the tests import them from here)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# How many times a stack whose ports were probed free starts again on other ports.
PORT_ATTEMPTS = 3


def on_probed_ports(n, start, stop):
    """`start(ports)` with `n` ports probed free, for peers that must know their ports before they
    start (cluster peers, a balancer, a resource URL naming the proxy's port). Another worker's
    process may take a probed port before it is bound: then `stop()` stops what was started and
    it all starts again on other ports, up to PORT_ATTEMPTS times."""
    for attempt in range(PORT_ATTEMPTS):
        try:
            return start([free_port() for _ in range(n)])
        except RuntimeError as e:
            stop()
            if "Address already in use" not in str(e) or attempt == PORT_ATTEMPTS - 1:
                raise


def wait_tcp(port, proc, timeout=STARTUP_TIMEOUT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.p.poll() is not None:
            raise RuntimeError("process exited:\n" + proc.output())
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"port {port} never opened:\n" + proc.output())


def proxy_binary():
    path = os.environ.get("MRTR_PROXY_BIN") or str(ROOT / "target" / "debug" / "mrtr-proxy")
    if not Path(path).exists():
        raise RuntimeError(f"proxy binary {path} missing: run `cargo build` first (tests/run.sh does)")
    return path


class Proxy:
    """The proxy in front of `upstream`: a URL, or a stdio server's command line (a list)."""

    def __init__(self, upstream, *extra, config=None, log="warn", listen="127.0.0.1:0"):
        config = str(config or HERE / "proxy.toml")
        self.listen = listen
        cmd = [proxy_binary(), "--config", config, "--listen", listen]
        if isinstance(upstream, list):
            tail = ["--", *upstream]
        else:
            cmd += ["--upstream", upstream]
            tail = []
        self.proc = Proc([*cmd, *extra, *tail],
                         env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", log)})
        m = self.proc.wait_for(r"listening on (http://\S+)")
        self.url = m.group(1)
        self.base = self.url.rsplit("/", 1)[0]

    def metrics(self):
        """Every sample of a scrape: series (name plus labels, as exposed) → value."""
        text = urllib.request.urlopen(self.base + "/metrics", timeout=10).read().decode()
        return Samples({k: float(v) for k, v in re.findall(r"^(mrtr_\w+(?:\{[^}]*\})?) (\S+)$", text, re.M)})

    def kill(self):
        self.proc.kill()


class Samples(dict):
    def sum(self, name, **labels):
        """The sum of `name`'s samples whose labels include `labels`."""
        total = 0.0
        for series, value in self.items():
            base, _, rest = series.partition("{")
            if base != name:
                continue
            have = dict(re.findall(r'(\w+)="([^"]*)"', rest))
            if all(have.get(k) == v for k, v in labels.items()):
                total += value
        return total


def sse_messages(raw):
    """The JSON-RPC messages of a whole `text/event-stream` body, in order (multi-line `data:`
    joined, events without data skipped)."""
    messages = []
    for event in raw.replace("\r\n", "\n").split("\n\n"):
        data = "\n".join(l[5:].lstrip(" ") for l in event.split("\n") if l.startswith("data:"))
        if data.strip():
            messages.append(json.loads(data))
    return messages


def start_py_upstream(*flags):
    proc = Proc([str(PY_LEGACY), str(HERE / "servers" / "py_legacy_server.py"), *flags])
    port = proc.wait_for(r"READY (\d+)").group(1)
    return proc, f"http://127.0.0.1:{port}/mcp"


def start_py_sse_upstream():
    proc = Proc([str(PY_LEGACY), str(HERE / "servers" / "py_legacy_server.py"), "--sse"])
    port = proc.wait_for(r"READY (\d+)").group(1)
    return proc, f"http://127.0.0.1:{port}/sse"


def start_ts_sse_upstream():
    proc = Proc([NODE, str(HERE / "servers" / "ts_legacy_server.mjs"), "--sse"], cwd=str(HERE))
    port = proc.wait_for(r"READY (\d+)").group(1)
    return proc, f"http://127.0.0.1:{port}/sse"


def py_stdio_command():
    """The Python test server as a stdio child of the proxy (no process of its own to start)."""
    return None, [str(PY_LEGACY), str(HERE / "servers" / "py_legacy_server.py"), "--stdio"]


def ts_stdio_command():
    return None, [NODE, str(HERE / "servers" / "ts_legacy_server.mjs"), "--stdio"]


def start_py_auth_upstream():
    proc = Proc([str(PY_LEGACY), str(HERE / "servers" / "py_auth_server.py")])
    port = proc.wait_for(r"READY (\d+)").group(1)
    return proc, f"http://127.0.0.1:{port}/mcp"


def start_ts_upstream(*flags):
    proc = Proc([NODE, str(HERE / "servers" / "ts_legacy_server.mjs"), *flags], cwd=str(HERE))
    port = proc.wait_for(r"READY (\d+)").group(1)
    return proc, f"http://127.0.0.1:{port}/mcp"


def start_ts_json_upstream():
    return start_ts_upstream("--json")


def start_everything_upstream():
    port = free_port()
    entry = HERE / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
    proc = Proc([NODE, str(entry), "streamableHttp"], env={**os.environ, "PORT": str(port)}, cwd=str(HERE))
    wait_tcp(port, proc)
    return proc, f"http://127.0.0.1:{port}/mcp"


UPSTREAMS = {
    "py": start_py_upstream,
    "py-auth": start_py_auth_upstream,
    "ts": start_ts_upstream,
    "ts-json": start_ts_json_upstream,
    "everything": start_everything_upstream,
    "py-sse": start_py_sse_upstream,
    "ts-sse": start_ts_sse_upstream,
    "py-stdio": py_stdio_command,
    "ts-stdio": ts_stdio_command,
}

# The same Python and TypeScript servers on each legacy transport.
TRANSPORTS = ["py", "ts", "py-sse", "ts-sse", "py-stdio", "ts-stdio"]


# Fixture scopes wider than one test: what such a fixture starts serves every test that shares
# its instance.
SHARED_SCOPES = ("class", "module", "package", "session")


def pytest_collection_modifyitems(config, items):
    """For pytest-xdist's `--dist loadgroup` (tests/run.sh): the tests that share an instance of a
    module-scoped fixture (a stack started once per module and parameter) form one group, which
    runs whole on one worker, so the stack still starts once; groups and the other tests spread
    over the workers. Without xdist the marks change nothing."""
    for item in items:
        shared = sorted(
            name for name, defs in item._fixtureinfo.name2fixturedefs.items()
            if defs and defs[-1].scope in SHARED_SCOPES
        )
        if not shared:
            continue
        params = getattr(item, "callspec", None)
        params = params.params if params is not None else {}
        key = [item.module.__name__, *(f"{n}={params[n]}" for n in shared if n in params)]
        item.add_marker(pytest.mark.xdist_group(name="|".join(key)))


@pytest.fixture(scope="module")
def stack(request):
    """(upstream kind) → a running legacy upstream with a proxy in front of it."""
    kind = request.param
    up, url = UPSTREAMS[kind]()
    proxy = Proxy(url)
    # `impl`: which SDK's server it is, whatever the transport.
    yield {"kind": kind, "impl": kind.split("-")[0], "upstream_url": url, "proxy": proxy}
    proxy.kill()
    if up is not None:
        up.kill()


def run_ts_client(url, ops, capabilities=None, timeout=60):
    """Runs the modern TS client (clients/ts_modern_client.mjs) in this worker's Node driver
    (drivers.py); its result."""
    argv = [url, json.dumps(ops)]
    if capabilities is not None:
        argv.append(json.dumps(capabilities))
    return drivers.start("node", "ts_modern_client", argv, "ts modern client").result(timeout)
