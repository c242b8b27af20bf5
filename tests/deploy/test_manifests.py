"""deploy/kubernetes/ as written: every manifest passes strict schema validation (kubernetes-validate,
offline, Kubernetes 1.37 schemas; the PrometheusRule custom resource against its own schema
below), the ConfigMap's config.toml passes `mrtr-proxy check-config`, and the Deployment agrees
with that config (ports, probes, secret path, grace period)."""

import os
import subprocess
import tomllib
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent.parent
MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
BIN = os.environ.get("MRTR_PROXY_BIN") or str(ROOT / "target" / "debug" / "mrtr-proxy")

# kubernetes-validate knows the built-in kinds only: a custom resource gets a strict schema here,
# written after its CRD (PrometheusRule: prometheus-operator's monitoring.coreos.com/v1), with
# additionalProperties false at every level as kubernetes-validate's strict mode has.
DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
PROMETHEUS_RULE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": {
            "type": "object",
            "additionalProperties": False,
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", "maxLength": 253},
                "namespace": {"type": "string"},
                "labels": STRINGS,
                "annotations": STRINGS,
            },
        },
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["groups"],
            "properties": {"groups": {"type": "array", "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name", "rules"],
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "interval": DURATION,
                    "query_offset": DURATION,
                    "limit": {"type": "integer"},
                    "labels": STRINGS,
                    "partial_response_strategy": {"type": "string"},
                    "rules": {"type": "array", "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["expr"],
                        # Exactly one of alert and record.
                        "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                        "properties": {
                            "alert": {"type": "string", "minLength": 1},
                            "record": {"type": "string", "pattern": r"^[a-zA-Z_:][a-zA-Z0-9_:]*$"},
                            "expr": {"type": ["string", "integer"]},
                            "for": DURATION,
                            "keep_firing_for": DURATION,
                            "labels": STRINGS,
                            "annotations": STRINGS,
                        },
                    }},
                },
            }}},
        },
    },
}
CUSTOM_RESOURCES = {("monitoring.coreos.com/v1", "PrometheusRule"): PROMETHEUS_RULE}


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
        schema = CUSTOM_RESOURCES.get((doc.get("apiVersion"), doc.get("kind")))
        if schema is None:
            kubernetes_validate.validate(doc, "1.37.0", strict=True)
        else:
            jsonschema.validate(doc, schema)


def test_the_custom_resource_schema_is_strict():
    rule = one("PrometheusRule")
    jsonschema.validate(rule, PROMETHEUS_RULE)
    broken = [
        {**rule, "spec": {"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "up", "fro": "5m"}]}]}},
        {**rule, "spec": {"groups": [{"name": "g", "rules": [{"alert": "A", "record": "a:b", "expr": "up"}]}]}},
        {**rule, "spec": {"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "up", "for": "5 minutes"}]}]}},
        {**rule, "spec": {"groups": [{"rules": []}]}},
        {**rule, "apiVersion": "monitoring.coreos.com/v1beta1"},
    ]
    for doc in broken:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(doc, PROMETHEUS_RULE)


def test_the_configmap_config_is_valid(tmp_path):
    # check-config reads what start-up reads (the state key, the task store's password): the
    # mounted Secret's files get stand-ins here.
    text = one("ConfigMap", "mrtr-proxy")["data"]["config.toml"]
    stand_ins = {"state-secret": "a-stand-in-key-of-at-least-32-bytes!!\n", "store-password": "stand-in\n"}
    for name, content in stand_ins.items():
        mounted = f"/etc/mrtr-proxy/secret/{name}"
        assert mounted in text
        (tmp_path / name).write_text(content)
        text = text.replace(mounted, str(tmp_path / name))
    cfg = tmp_path / "config.toml"
    cfg.write_text(text)
    out = subprocess.run([BIN, "check-config", str(cfg)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr


def test_the_deployment_matches_its_config():
    config = tomllib.loads(one("ConfigMap", "mrtr-proxy")["data"]["config.toml"])
    pod = one("Deployment", "legacy-mcp")["spec"]["template"]["spec"]
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
    for svc in (r for r in resources() if r["kind"] == "Service" and r["metadata"]["name"] != "mrtr-task-store"):
        assert [p["targetPort"] for p in svc["spec"]["ports"]] == ["mcp"], svc["metadata"]["name"]
    peers = one("Service", "legacy-mcp-peers")["spec"]
    assert peers["clusterIP"] == "None" and peers["publishNotReadyAddresses"] is True


def test_the_task_store_is_the_one_the_config_names_with_the_secrets_password():
    config = tomllib.loads(one("ConfigMap", "mrtr-proxy")["data"]["config.toml"])
    store = one("Service", "mrtr-task-store")
    port = store["spec"]["ports"][0]
    assert config["tasks"]["store"] == f"redis://{store['metadata']['name']}:{port['port']}/0"
    assert port["targetPort"] == "store"
    pod = one("Deployment", "mrtr-task-store")["spec"]["template"]["spec"]
    assert store["spec"]["selector"] == one("Deployment", "mrtr-task-store")["spec"]["selector"]["matchLabels"]
    args = pod["containers"][0]["args"]
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    password = pod["containers"][0]["env"][0]["valueFrom"]["secretKeyRef"]
    proxy = next(c for c in one("Deployment", "legacy-mcp")["spec"]["template"]["spec"]["containers"]
                 if c["name"] == "mrtr-proxy")
    secret_dir = next(m for m in proxy["volumeMounts"] if m["name"] == "state-secret")["mountPath"]
    assert config["tasks"]["store_password_file"] == f"{secret_dir}/{password['key']}"
    assert password["name"] == one("Secret")["metadata"]["name"]
    assert password["key"] in one("Secret")["stringData"]
