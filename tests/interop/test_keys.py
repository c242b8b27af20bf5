"""Key rotation by SIGHUP on the real binary, with a call parked: a real Python (mcp 1.30.0)
upstream behind the proxy and the official Python modern client (pinned to 2026-07-28) in front.
The key file goes ES256 → EdDSA while the round is out; the retry (its token signed by the old
key) completes, later calls are signed by the new key, and a broken file changes nothing.
"""

import asyncio
import signal
import threading

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from conftest import Proxy, start_py_upstream
from test_modern_clients import PyClient, text_of

RELOAD_TIMEOUT_S = 20


def pkcs8(key):
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


class RotateOnElicit(PyClient):
    """While the call is parked (inside the elicitation callback), rewrites the key file, sends
    SIGHUP and waits for the proxy to log the reload; only then answers."""

    def __init__(self, proxy, key_file):
        super().__init__(proxy.url)
        self.proxy = proxy
        self.key_file = key_file

    async def _elicit(self, ctx, params):
        self.key_file.write_bytes(pkcs8(ed25519.Ed25519PrivateKey.generate()))
        self.proxy.proc.p.send_signal(signal.SIGHUP)
        await asyncio.to_thread(self.proxy.proc.wait_for, r"state keys reloaded", RELOAD_TIMEOUT_S)
        return await super()._elicit(ctx, params)


def reloads(proxy, result):
    return proxy.metrics().sum("mrtr_key_reloads_total", result=result)


def test_sighup_rotates_the_key_with_a_call_parked_and_a_broken_file_changes_nothing(tmp_path):
    key_file = tmp_path / "state-key.pem"
    key_file.write_bytes(pkcs8(ec.generate_private_key(ec.SECP256R1())))
    config = tmp_path / "proxy.toml"
    config.write_text(f'[state]\nsecret_file = "{key_file}"\ngather_window = "250ms"\n')
    up, url = start_py_upstream()
    proxy = Proxy(url, config=config, log="mrtr_proxy=info")
    try:
        client = RotateOnElicit(proxy, key_file)
        result = client.run(lambda c: c.call_tool("ask_name", {}))
        assert text_of(result) == "Hello, Ada!"
        assert client.counts["elicitation"] == 1, "the user was asked once"
        assert reloads(proxy, "ok") == 1

        # A broken file: refused, logged, and calls keep working with the keys in use.
        key_file.write_text("-----BEGIN PRIVATE KEY-----\nbroken\n-----END PRIVATE KEY-----\n")
        proxy.proc.p.send_signal(signal.SIGHUP)
        proxy.proc.wait_for(r"state keys not reloaded", RELOAD_TIMEOUT_S)
        assert "broken" not in proxy.proc.output(), "key material never reaches the log"
        plain = PyClient(proxy.url)
        assert text_of(plain.run(lambda c: c.call_tool("ask_name", {}))) == "Hello, Ada!"
        assert reloads(proxy, "error") == 1
        assert proxy.proc.p.poll() is None, "SIGHUP does not stop the proxy"
    finally:
        proxy.kill()
        up.kill()
