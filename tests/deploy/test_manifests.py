"""deploy/kubernetes/ as written: every manifest passes strict schema validation (kubernetes-validate,
offline, Kubernetes 1.37 schemas), the ConfigMap's config.toml passes `mrtr-proxy check-config`,
and the Deployment agrees with that config (ports, probes, secret path, grace period)."""

import os
import subprocess
import tomllib
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent.parent
MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
BIN = os.environ.get("MRTR_PROXY_BIN") or str(ROOT / "target" / "debug" / "mrtr-proxy")


def resources():
    return [doc for path in MANIFESTS for doc in yaml.safe_load_all(path.read_text()) if doc]


def one(kind, name=None):
    found = [r for r in resources() if r["kind"] == kind and (name is None or r["metadata"]["name"] == name)]
    assert len(found) == 1, (kind, name, found)
    return found[0]


def seconds(duration):
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    for suffix in ("ms", "s", "m", "h"):
        if duration.endswith(suffix):
            return float(duration[: -len(suffix)]) * units[suffix]
    raise ValueError(duration)


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_is_valid_kubernetes(path):
    for doc in yaml.safe_load_all(path.read_text()):
        kubernetes_validate.validate(doc, "1.37.0", strict=True)


def test_the_configmap_config_is_valid(tmp_path):
    # check-config reads the key files too: the mounted Secret's path gets a stand-in key here.
    text = one("ConfigMap", "mrtr-proxy")["data"]["config.toml"]
    mounted = "/etc/mrtr-proxy/secret/state-secret"
    assert mounted in text
    key = tmp_path / "state-secret"
    key.write_text("a-stand-in-key-of-at-least-32-bytes!!\n")
    cfg = tmp_path / "config.toml"
    cfg.write_text(text.replace(mounted, str(key)))
    out = subprocess.run([BIN, "check-config", str(cfg)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr


def test_the_deployment_matches_its_config():
    config = tomllib.loads(one("ConfigMap", "mrtr-proxy")["data"]["config.toml"])
    pod = one("Deployment")["spec"]["template"]["spec"]
    proxy = next(c for c in pod["containers"] if c["name"] == "mrtr-proxy")
    ports = {p["name"]: p["containerPort"] for p in proxy["ports"]}
    assert ports["mcp"] == int(config["server"]["listen"].rsplit(":", 1)[1])
    assert ports["admin"] == int(config["admin"]["listen"].rsplit(":", 1)[1])
    assert proxy["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert proxy["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    secret_dir = next(m for m in proxy["volumeMounts"] if m["name"] == "state-secret")["mountPath"]
    assert config["state"]["secret_file"].startswith(secret_dir + "/")
    key = config["state"]["secret_file"].rsplit("/", 1)[1]
    assert key in one("Secret")["stringData"]
    grace = seconds(config["server"]["shutdown_grace"]) + seconds(config["server"]["shutdown_cancel_timeout"])
    assert pod["terminationGracePeriodSeconds"] > grace
    # The legacy server outlives the proxy: a native sidecar, stopped after the main containers.
    legacy = pod["initContainers"][0]
    assert legacy["restartPolicy"] == "Always"
    assert config["upstream"]["url"].startswith("http://127.0.0.1:")


def test_the_services_target_the_proxy_only():
    for svc in (r for r in resources() if r["kind"] == "Service"):
        assert [p["targetPort"] for p in svc["spec"]["ports"]] == ["mcp"], svc["metadata"]["name"]
    peers = one("Service", "legacy-mcp-peers")["spec"]
    assert peers["clusterIP"] == "None" and peers["publishNotReadyAddresses"] is True
