"""deploy/monitoring/ and deploy/kubernetes/prometheusrule.yaml: promtool checks and unit-tests the
alert rules, the PrometheusRule holds the same groups, every PromQL expression of the rules and
the Grafana dashboard parses, and every metric name they use is one that real proxies export
(the binary, driven until every metric family has a series: families without one are not
exposed at all)."""

import contextlib
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from procs import STARTUP_TIMEOUT_S, Proc  # noqa: E402  (tests/procs.py, shared with tests/interop)

ROOT = Path(__file__).resolve().parent.parent.parent
MONITORING = ROOT / "deploy" / "monitoring"
RULES = MONITORING / "alerts.rules.yml"
RULE_TESTS = MONITORING / "tests.yml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
PROMETHEUS_RULE = ROOT / "deploy" / "kubernetes" / "prometheusrule.yaml"
BIN = os.environ.get("MRTR_PROXY_BIN") or str(ROOT / "target" / "debug" / "mrtr-proxy")
STDIO_SERVER = ROOT / "tests" / "fixtures" / "stdio" / "scripted_server.py"

# The parked-call gauges and the bounds in force they are compared with (alerts, dashboard).
PARKED_BOUNDS = {"mrtr_parked_calls": "mrtr_parked_calls_limit",
                 "mrtr_parked_memory_bytes": "mrtr_parked_memory_limit_bytes"}
# Series that are Prometheus's own, not the proxy's: the only non-mrtr names allowed.
PROMETHEUS_NAMES = {"up"}
# Grafana's built-in interval variables, and a value for each kind of dashboard variable, so that
# its queries become plain PromQL.
GRAFANA_INTERVALS = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}
PROMQL_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
                   "group_right", "inf", "nan"}
ALL_CAPABILITIES = {"elicitation": {"form": {}, "url": {}}, "sampling": {"tools": {}}, "roots": {}}


def promtool():
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is missing: install the Debian package `prometheus` "
                    "(apt-get install --no-install-recommends prometheus; tests/run.sh does)", pytrace=False)
    return path


def run_promtool(*args):
    out = subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"promtool {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}"
    return out.stdout


def rule_groups():
    return yaml.safe_load(RULES.read_text())["groups"]


def rule_exprs():
    return {rule.get("alert") or rule["record"]: str(rule["expr"]) for group in rule_groups() for rule in group["rules"]}


def dashboard():
    return json.loads(DASHBOARD.read_text())


def all_panels(panels):
    for panel in panels:
        yield panel
        yield from all_panels(panel.get("panels", []))


def variable_values(board):
    """A stand-in for each dashboard variable: a query variable matches anything, a textbox is
    its default."""
    values = dict(GRAFANA_INTERVALS)
    for var in board["templating"]["list"]:
        if var["type"] in ("textbox", "constant"):
            values[var["name"]] = var["query"]
        elif var["type"] in ("query", "custom", "interval"):
            values[var["name"]] = ".*"
    return values


def substitute(expr, values):
    def one(m):
        name = m.group(1) or m.group(2)
        assert name in values, f"unknown dashboard variable ${name} in {expr!r}"
        return values[name]
    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", one, expr)


def dashboard_exprs():
    """Every PromQL expression of the dashboard, variables replaced: panel queries, and the
    series selector of each `label_values(selector, label)` variable."""
    board = dashboard()
    values = variable_values(board)
    exprs = {}
    for panel in all_panels(board["panels"]):
        for target in panel.get("targets", []):
            exprs[f"panel {panel['id']} ({panel['title']}) {target['refId']}"] = substitute(target["expr"], values)
    for var in board["templating"]["list"]:
        if var["type"] != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        m = re.fullmatch(r"label_values\((.+),\s*\w+\)", query)
        assert m, f"variable {var['name']}: want label_values(selector, label), got {query!r}"
        exprs[f"variable {var['name']}"] = substitute(m.group(1), values)
    return exprs


def metric_names(expr):
    """The metric names of a PromQL expression: identifiers left once strings, label matchers,
    ranges, grouping clauses, function calls and keywords are taken out."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\boffset\s+\S+", " ", text)
    names = set()
    # Whole identifiers only (not the `e3` of 1e3, not a prefix of a function name).
    for m in re.finditer(r"(?<![\w.:])([a-zA-Z_:][\w:]*)(?![\w:]|\s*\()", text):
        if m.group(1).lower() not in PROMQL_KEYWORDS:
            names.add(m.group(1))
    return names


# ---------------------------------------------------------------------------------------------
# The rules: checked and unit-tested by promtool, the same in the PrometheusRule.


def test_promtool_checks_the_rules():
    out = run_promtool("check", "rules", str(RULES))
    assert "SUCCESS" in out, out


def test_promtool_unit_tests_pass():
    # promtool resolves rule_files relative to the test file's directory.
    out = run_promtool("test", "rules", str(RULE_TESTS))
    assert "SUCCESS" in out, out


def test_every_alert_has_a_unit_test_that_fires_it_and_one_that_does_not():
    alerts = {rule["alert"] for group in rule_groups() for rule in group["rules"] if "alert" in rule}
    fired, quiet = set(), set()
    for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        series = [dict(re.findall(r'(\w+)="([^"]*)"', s["series"])) for s in case["input_series"]]
        for check in case.get("alert_rule_test", []):
            expected = [{k: v for k, v in a["exp_labels"].items() if k != "severity"} for a in check.get("exp_alerts") or []]
            if expected:
                fired.add(check["alertname"])
            # Quiet: an evaluation with no alert, or series that no expected alert covers (a
            # healthy instance, another label value, a rate under the threshold).
            if not expected or any(not any(e.items() <= s.items() for e in expected) for s in series):
                quiet.add(check["alertname"])
    assert alerts - fired == set(), "alerts no test fires"
    assert alerts - quiet == set(), "alerts no test shows quiet"
    assert (fired | quiet) - alerts == set(), "tests of alerts that do not exist"


def test_the_parked_alerts_compare_with_the_exported_limits():
    # No hard-coded threshold: 80% of the bound each instance reports, matched on all labels (both
    # series come from the same target; the live scrapes show they have no labels of their own).
    exprs = rule_exprs()
    assert exprs["MrtrProxyParkedCallsNearLimit"] == "mrtr_parked_calls > 0.8 * mrtr_parked_calls_limit"
    assert exprs["MrtrProxyParkedMemoryNearLimit"] == "mrtr_parked_memory_bytes > 0.8 * mrtr_parked_memory_limit_bytes"


def test_the_prometheusrule_holds_the_same_groups():
    rule = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert rule["spec"]["groups"] == rule_groups()
    # And it is the generated text (so the comments agree too); its header says how to make it.
    text = PROMETHEUS_RULE.read_text()
    header = text[: text.index("\nspec:\n") + len("\nspec:\n")]
    body = RULES.read_text()
    body = body[body.index("groups:\n"):]
    # As `sed 's/^./  &/'`: every line but the empty ones indented.
    expected = header + "".join("  " + line if line.strip("\n") else line for line in body.splitlines(keepends=True))
    assert text == expected, "deploy/kubernetes/prometheusrule.yaml is stale: regenerate it (see its header)"


# ---------------------------------------------------------------------------------------------
# PromQL: every expression parses, and names only metrics the proxy exports.


def test_every_dashboard_query_parses(tmp_path):
    # promtool has no offline query parser, but `check rules` parses every expression: the
    # dashboard's queries become recording rules.
    exprs = dashboard_exprs()
    assert len(exprs) >= 20, exprs
    rules = [{"record": f"dashboard:query_{i}", "expr": expr} for i, expr in enumerate(exprs.values())]
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, sort_keys=False))
    out = run_promtool("check", "rules", str(path))
    assert f"SUCCESS: {len(rules)} rules found" in out, out


def test_the_dashboard_is_well_formed():
    board = dashboard()
    panels = list(all_panels(board["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    names = {v["name"] for v in board["templating"]["list"]}
    assert {"datasource", "job", "instance"} <= names
    # No variable stands in for a config value: the bounds are the gauges the proxy exports.
    assert not [v["name"] for v in board["templating"]["list"] if v["type"] in ("textbox", "constant")]
    for p in panels:
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["datasource"] == p["datasource"], p["title"]
    # Each of what OPERATIONS.md says to watch has its panel.
    used = set().union(*(metric_names(e) for e in dashboard_exprs().values()))
    for name in ("mrtr_parked_calls", "mrtr_rounds_total", "mrtr_expired_calls_total", "mrtr_upstream_errors_total",
                 "mrtr_forwarded_retries_total", "mrtr_resume_latency_seconds_bucket", "mrtr_requests_total",
                 "mrtr_request_duration_seconds_bucket", "mrtr_upstream_sessions", "mrtr_accept_errors_total", "up"):
        assert name in used, name
    # Each parked gauge is drawn in one panel with its bound in force, per instance.
    for gauge, limit in PARKED_BOUNDS.items():
        drawn = [p for p in panels if p["type"] != "row"
                 and {gauge, limit} <= set().union(*(metric_names(t["expr"]) for t in p["targets"]))]
        assert drawn, f"no panel draws {gauge} against {limit}"
        bound = [t for p in drawn for t in p["targets"] if metric_names(t["expr"]) == {limit}]
        assert bound and all(re.match(r"max by \(instance\) \(", t["expr"]) for t in bound), bound


def test_metric_names_are_parsed_out_of_promql():
    expr = ('histogram_quantile(0.99, sum by (job, le) (rate(mrtr_a_bucket{era="modern",method=~"x|y"}[5m])))'
            ' / on (job) group_left sum(mrtr_b_total offset 1h) > bool 2 and (up == 0) unless vector(1e3)')
    assert metric_names(expr) == {"mrtr_a_bucket", "mrtr_b_total", "up"}


def test_the_parked_bounds_are_exported_beside_their_gauges(scrapes):
    # The alerts match a gauge and its bound one to one: the same labels (none of their own) on
    # every proxy. The owner sets state.max_parked = 1; the others size it (at least 1).
    for proc, text in scrapes.items():
        for gauge, limit in PARKED_BOUNDS.items():
            assert series_of(text, gauge).keys() == series_of(text, limit).keys() == {""}, (proc, gauge, limit)
            assert series_of(text, limit)[""] >= 1, (proc, limit)
        assert series_of(text, "mrtr_parked_memory_limit_bytes")[""] == 256 * 1024 * 1024, proc
    assert series_of(scrapes["owner"], "mrtr_parked_calls_limit")[""] == 1


def series_of(text, name):
    """Label set (as written) → value of the series `name` in a scrape."""
    return {m.group(1) or "": float(m.group(2))
            for m in re.finditer(rf"^{re.escape(name)}(?:\{{([^}}]*)\}})? (\S+)$", text, re.M)}


def test_every_name_in_the_rules_and_the_dashboard_is_exported(scraped_families):
    referenced = {}
    for where, expr in [*(("rule " + k, v) for k, v in rule_exprs().items()),
                        *(("dashboard " + k, v) for k, v in dashboard_exprs().items())]:
        for name in metric_names(expr):
            referenced.setdefault(name, []).append(where)
    others = {n for n in referenced if not n.startswith("mrtr_")}
    assert others <= PROMETHEUS_NAMES, {n: referenced[n] for n in others - PROMETHEUS_NAMES}
    missing = {n: w for n, w in referenced.items() if n.startswith("mrtr_") and not exported(n, scraped_families)}
    assert not missing, f"not in a live scrape: {missing}\nexported: {sorted(scraped_families)}"


def exported(name, families):
    """Whether `name` is a series name of an exported family: a gauge as it is, a counter with
    `_total`, a histogram with `_bucket`, `_sum` or `_count`."""
    if families.get(name) in ("gauge", "unknown"):
        return True
    for suffix, kind in (("_total", "counter"), ("_bucket", "histogram"), ("_sum", "histogram"), ("_count", "histogram")):
        if name.endswith(suffix) and families.get(name[: -len(suffix)]) == kind:
            return True
    return False


# ---------------------------------------------------------------------------------------------
# Live proxies: a metric family is exposed only once it has a series, so the proxies are driven
# until each has one: a round, a call refused at a parked-call bound and one for a missing
# capability (owner, a stdio upstream); a retry forwarded to the owner, a forged token, an
# unreachable upstream and a key reload (front); accepts out of descriptors (starved).


class ProxyProc(Proc):
    """The proxy binary (warnings only in its log), with its URL once it listens."""

    def __init__(self, args, preexec_fn=None):
        super().__init__([BIN, *args], env={**os.environ, "RUST_LOG": "warn"}, preexec_fn=preexec_fn)
        self.url = self.base = None

    def listening(self):
        self.url = self.wait_for(r"listening on (http://\S+)").group(1)
        self.base = self.url.rsplit("/", 1)[0]
        return self

    def wait_until(self, path, want=200, timeout=STARTUP_TIMEOUT_S):
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(self.base + path, timeout=2) as r:
                    if r.status == want:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline or self.p.poll() is not None:
                raise RuntimeError(f"{self.base}{path} never answered {want}:\n" + "\n".join(self.lines[-40:]))
            time.sleep(0.05)

    def scrape(self):
        with urllib.request.urlopen(self.base + "/metrics", timeout=10) as r:
            return r.read().decode()

    def close(self):
        self.kill()


def families_of(text):
    """Family name → type, from a scrape's `# TYPE` lines."""
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))


def call(url, method, params, capabilities=ALL_CAPABILITIES):
    """A modern request (headers and `_meta` as the 2026-07-28 protocol wants); returns the HTTP
    status and the last JSON-RPC message of the answer (JSON or SSE)."""
    params = {**params, "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                                  "io.modelcontextprotocol/clientCapabilities": capabilities,
                                  "io.modelcontextprotocol/clientInfo": {"name": "test-monitoring", "version": "0"}}}
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream",
               "mcp-protocol-version": "2026-07-28", "mcp-method": method}
    if "name" in params:
        headers["mcp-name"] = params["name"]
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status, text, kind = r.status, r.read().decode(), r.headers.get("content-type", "")
    except urllib.error.HTTPError as e:
        status, text, kind = e.code, e.read().decode(), e.headers.get("content-type", "")
    if kind.startswith("text/event-stream"):
        text = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")][-1]
    return status, json.loads(text)


def hold_connections(port, n):
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            s.connect(("127.0.0.1", port))
        socks.append(s)
    return socks


def starve():
    # The starved proxy raises its soft limit to this hard one: 64 descriptors.
    resource.setrlimit(resource.RLIMIT_NOFILE, (32, 64))


@pytest.fixture(scope="module")
def scraped_families(scrapes):
    families = {}
    for text in scrapes.values():
        for name, kind in families_of(text).items():
            assert families.setdefault(name, kind) == kind, (name, kind)
    return families


@pytest.fixture(scope="module")
def scrapes(tmp_path_factory):
    """The last scrape of each live proxy (owner, front, starved), once it has every family."""
    if not Path(BIN).exists():
        pytest.fail(f"proxy binary {BIN} missing: set MRTR_PROXY_BIN or run `cargo build`", pytrace=False)
    tmp = tmp_path_factory.mktemp("monitoring")
    key = tmp / "state-secret"
    key.write_text("a-shared-test-key-of-at-least-32-bytes!!\n")
    with socket.socket() as s:  # a port nothing listens on: the front's upstream
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]

    def config(name, text):
        path = tmp / f"{name}.toml"
        path.write_text(text)
        return str(path)

    with contextlib.ExitStack() as stack:
        def start(*args, preexec_fn=None):
            proc = ProxyProc(["--listen", "127.0.0.1:0", *args], preexec_fn=preexec_fn)
            stack.callback(proc.close)
            return proc.listening()

        owner = start("--config", config("owner", f'[state]\nsecret_file = "{key}"\ninstance_id = "owner"\nmax_parked = 1\n'),
                      "--", sys.executable, str(STDIO_SERVER))
        front = start("--config", config("front", f'[upstream]\nurl = "http://127.0.0.1:{closed}/mcp"\n'
                                                  f'[state]\nsecret_file = "{key}"\ninstance_id = "front"\n'
                                                  f'[cluster]\npeers = ["{owner.url}"]\n'))
        starved = start("--upstream", f"http://127.0.0.1:{closed}/mcp", preexec_fn=starve)
        owner.wait_until("/readyz")
        front.wait_until("/healthz")
        starved.wait_until("/healthz")

        status, round_ = call(owner.url, "tools/call", {"name": "ask", "arguments": {}})
        assert round_["result"]["resultType"] == "input_required", round_
        status, refused = call(owner.url, "tools/call", {"name": "ask", "arguments": {}})
        assert status == 503, refused
        status, refused = call(owner.url, "tools/call", {"name": "ask", "arguments": {}}, capabilities={})
        assert refused["error"]["code"] == -32021, refused

        answers = {key: {"action": "accept", "content": {"name": "Ada"}} for key in round_["result"]["inputRequests"]}
        status, done = call(front.url, "tools/call", {"name": "ask", "arguments": {}, "inputResponses": answers,
                                                      "requestState": round_["result"]["requestState"]})
        assert done["result"]["content"][0]["text"] == "Hello, Ada!", done
        status, refused = call(front.url, "tools/call", {"name": "ask", "arguments": {}, "inputResponses": {},
                                                         "requestState": "forged"})
        assert status == 400, refused
        status, failed = call(front.url, "tools/list", {})
        assert status == 502, failed
        front.p.send_signal(signal.SIGHUP)

        held = hold_connections(int(starved.base.rsplit(":", 1)[1]), 120)
        try:
            starved.wait_for("accept failed")
        finally:
            for s in held:
                s.close()

        scraped = {}
        for name, proc, last in (("owner", owner, "mrtr_limit_hits"), ("front", front, "mrtr_key_reloads"),
                                 ("starved", starved, "mrtr_accept_errors")):
            # The reload and the listener's recovery happen on their own time: scrape until seen.
            deadline = time.monotonic() + STARTUP_TIMEOUT_S
            while True:
                with contextlib.suppress(urllib.error.URLError, OSError):
                    text = proc.scrape()
                    if last in families_of(text):
                        break
                assert time.monotonic() < deadline, f"{last} never exposed by {proc.url}"
                time.sleep(0.05)
            scraped[name] = text
        return scraped
