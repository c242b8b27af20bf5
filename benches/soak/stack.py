"""The soak's processes: the legacy upstream (restartable on its port), two proxy replicas sharing
a state key (restartable on theirs), and the trace collector in front of the test suite's OTLP
receiver, switchable between up, down and hung. All on 127.0.0.1."""

import asyncio
import os
import re
import signal

from conftest import HERE, PY_LEGACY, Proc, Proxy, free_port
from otlp_receiver import OtlpReceiver
from wire import AUDIENCE, ISSUER

SECRET = "soak-state-key-shared-by-both-replicas-0123456789"
SERVER = HERE / "servers" / "py_legacy_server.py"


def replica_toml(ports, collector_port, jwks_path, state_ttl_s, task_ttl_s):
    peers = ", ".join(f'"http://127.0.0.1:{p}/mcp"' for p in ports)
    return f"""
[server]
shutdown_grace = "1s"
[state]
secret = "{SECRET}"
ttl = "{state_ttl_s}s"
[pool]
idle_timeout = "3s"
[cluster]
peers = [{peers}]
[tasks]
ttl = "{task_ttl_s}s"
after = "300ms"
poll_interval = "200ms"
[tasks.tools]
slow_ask = "always"
wait_forever = "always"
[approval.tools.summarize]
message = "Summarize {{text}}?"
on_decline = "Not approved: nothing summarized."
[auth]
principal = "jwt"
require = true
resource = "{AUDIENCE}"
authorization_servers = ["{ISSUER}"]
subject_header = "x-mcp-subject"
[auth.jwt]
issuer = "{ISSUER}"
jwks_file = "{jwks_path}"
algorithms = ["RS256"]
[telemetry]
otlp_endpoint = "http://127.0.0.1:{collector_port}"
export_timeout = "1s"
"""


class Upstream:
    """py_legacy_server.py (mcp==1.30.0) on a port of its own, started again on the same port."""

    def __init__(self):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.start()

    def start(self):
        env = {**os.environ, "MRTR_SERVE_PORT": str(self.port)}
        self.proc = Proc([str(PY_LEGACY), str(SERVER)], env=env)
        self.proc.wait_for(r"READY (\d+)")

    def kill(self):
        self.proc.kill()


class Replica:
    """One proxy replica on a fixed port (so that a restart keeps its place among the peers)."""

    def __init__(self, upstream_url, config, port):
        self.upstream_url, self.config, self.port = upstream_url, config, port
        self.exits = []  # exit codes of the processes restarted
        self.start()

    def start(self):
        self.proxy = Proxy(self.upstream_url, config=self.config, listen=f"127.0.0.1:{self.port}")

    def restart(self, timeout=30):
        """SIGTERM (graceful drain), wait for the exit, start again."""
        p = self.proxy.proc.p
        p.send_signal(signal.SIGTERM)
        self.exits.append(p.wait(timeout=timeout))
        self.logs_before = self.proxy.proc.output()
        self.start()

    @property
    def pid(self):
        return self.proxy.proc.p.pid

    def usage(self):
        """(open descriptors, RSS in KiB) of the running process."""
        fds = len(os.listdir(f"/proc/{self.pid}/fd"))
        with open(f"/proc/{self.pid}/status") as f:
            rss = int(re.search(r"^VmRSS:\s+(\d+) kB", f.read(), re.M).group(1))
        return fds, rss

    def panicked(self):
        logs = getattr(self, "logs_before", "") + self.proxy.proc.output()
        return "panicked" in logs


class Collector:
    """The OTLP endpoint the replicas export to, on a fixed port: `up` relays to a real receiver,
    `down` listens nowhere (connection refused), `hung` accepts and never answers."""

    def __init__(self):
        self.receiver = OtlpReceiver().__enter__()
        self.port = free_port()
        self.server = None
        self.conns = []  # the exporters' connections of this mode, closed when it ends
        self.mode = "down"

    async def switch(self, mode):
        if self.server is not None:
            self.server.close()
            for w in self.conns:
                w.close()
            self.conns = []
            await self.server.wait_closed()
            self.server = None
        self.mode = mode
        if mode != "down":
            handler = self._relay if mode == "up" else self._hang
            self.server = await asyncio.start_server(handler, "127.0.0.1", self.port, reuse_address=True)

    async def _hang(self, reader, writer):
        self.conns.append(writer)
        try:
            while await reader.read(65536):  # never answered, until the exporter gives up
                pass
        except (ConnectionError, OSError):
            pass

    async def _relay(self, reader, writer):
        self.conns.append(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.receiver.port)
        except OSError:
            writer.close()
            return
        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        except asyncio.CancelledError:
            pass  # the collector's server closed under it: the connection is gone either way

    async def close(self):
        await self.switch("down")
        self.receiver.close()


async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()
