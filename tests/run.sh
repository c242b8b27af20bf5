#!/usr/bin/env bash
# The one test command: unit + in-process integration tests (cargo nextest), then the real-peer
# interop tests (in parallel), then the deployment checks. Installs what the interop tests need
# (pinned, cached under tests/interop/ and tests/deploy/). Says what runs and how long each part
# took. MRTR_INTEROP_WORKERS sets the interop suite's workers (0: one process, no xdist).
#
# `--ci` (what CI runs) adds the slow suites a developer does not wait for: every fuzz target for
# a bounded time (started first, in the background, while the peers install and the tests
# build), then a smoke of the benchmark harness and a smoke of the soak.
set -euo pipefail
cd "$(dirname "$0")/.."

ci=false
for arg in "$@"; do
  case "$arg" in
    --ci) ci=true ;;
    *) echo "usage: bash tests/run.sh [--ci]" >&2; exit 64 ;;
  esac
done

interop=tests/interop

# Each part is announced, and timed until the next one starts; the times are summed up at the
# end, also when a part fails.
part_name=""
part_start=$SECONDS
summary=()
part() {
  if [ -n "$part_name" ]; then
    local took=$((SECONDS - part_start))
    echo "   ($part_name: ${took}s)"
    summary+=("$(printf '   %5ds  %s' "$took" "$part_name")")
  fi
  part_name=$1
  part_start=$SECONDS
  if [ -n "$part_name" ]; then echo "== $part_name"; fi
}
# Work begun in the background (the build, CI's fuzzing), each in a process group of its own
# (setsid) so that a run that fails first stops all of it: its pid, and a file holding its output,
# shown when it is waited for.
declare -A bg_pid bg_log
background() {
  local name=$1
  shift
  bg_log[$name]="$(mktemp)"
  setsid "$@" >"${bg_log[$name]}" 2>&1 &
  bg_pid[$name]=$!
}
await_background() {
  local name=$1 status=0
  wait "${bg_pid[$name]}" || status=$?
  unset "bg_pid[$name]"
  cat "${bg_log[$name]}"
  rm -f "${bg_log[$name]}"
  if [ "$status" -ne 0 ]; then exit "$status"; fi
}

report() {
  local status=$?
  # A part that failed leaves background work running: it stops with the run.
  for pid in "${bg_pid[@]}"; do kill -- "-$pid" 2>/dev/null || true; done
  part ""
  echo "== times"
  printf '%s\n' "${summary[@]}"
  printf '   %5ds  %s\n' "$SECONDS" "total"
  if [ "$status" -ne 0 ]; then echo "== FAILED (exit $status)"; fi
}
trap report EXIT

if $ci; then
  # The fuzzing is CPU for one core once built: it overlaps the installs and the build.
  background fuzzing bash -c 'start=$SECONDS; status=0; bash fuzz/run.sh || status=$?
    echo "   (fuzzing took $((SECONDS - start))s in the background)"; exit "$status"'
fi

# A Python venv holding exactly the pinned packages given, made once: a stamp in it names them,
# so a second run checks one file instead of asking pip.
pinned_venv() {
  local dir=$1
  shift
  if [ "$(cat "$dir/.pinned" 2>/dev/null)" != "$*" ]; then
    rm -rf "$dir"
    python3 -m venv "$dir"
    "$dir/bin/pip" install -q "$@"
    echo "$*" >"$dir/.pinned"
  fi
}

# The build begins at once, beside the installs below (which wait on the network more than on
# the CPU); its output is shown when the build part is reached.
background build cargo build --locked --tests --bins

part "installing real peers (pinned; cached when present)"
pinned_venv "$interop/.venv/mcp1" 'mcp==1.30.0'
# cryptography makes the ES256 / EdDSA key files of test_keys.py; opentelemetry-proto decodes
# OTLP/HTTP protobuf in the test trace receiver (tests/interop/otlp_receiver.py); pytest-xdist
# runs the suite in parallel.
pinned_venv "$interop/.venv/mcp2" 'mcp==2.3.0' 'pytest==9.2.0' 'pytest-xdist==3.8.0' \
  'cryptography==50.0.2' 'opentelemetry-proto==1.45.2' 'protobuf==7.36.2'
# FastMCP's tasks client (tests/interop/clients/py_tasks_client.py): a second ecosystem's client
# of the tasks extension; it pins fastmcp-slim 4.1.4 itself.
pinned_venv "$interop/.venv/fastmcp" 'fastmcp-tasks==4.1.4' 'mcp==2.3.0'
deploy_venv=tests/deploy/.venv
pinned_venv "$deploy_venv" 'kubernetes-validate==1.37.0' 'pytest==9.2.0'
if [ ! -d "$interop/node_modules/@modelcontextprotocol/client" ] || [ "$interop/package-lock.json" -nt "$interop/node_modules/.package-lock.json" ]; then
  (cd "$interop" && npm ci --no-audit --no-fund --loglevel=error)
fi
# The MCP Apps peers (tests/interop/test_mcp_apps.py): ext-apps 1.x on the legacy SDK, and the
# official example app server, pinned in a package of their own.
apps="$interop/apps"
if [ ! -d "$apps/node_modules/@modelcontextprotocol/server-basic-vanillajs" ] || [ "$apps/package-lock.json" -nt "$apps/node_modules/.package-lock.json" ]; then
  (cd "$apps" && npm ci --no-audit --no-fund --loglevel=error)
fi
# The MCP Inspector's CLI (tests/interop/test_inspector.py), in a directory of its own.
if [ ! -d "$interop/inspector/node_modules/@modelcontextprotocol/inspector" ] || [ "$interop/inspector/package-lock.json" -nt "$interop/inspector/node_modules/.package-lock.json" ]; then
  (cd "$interop/inspector" && npm ci --no-audit --no-fund --loglevel=error)
fi

# nginx is the round-robin balancer of the cluster tests (tests/interop/test_cluster.py).
if ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q nginx-light >/dev/null \
    || { apt-get update -q >/dev/null && apt-get install -y -q nginx-light >/dev/null; }
fi

# redis-server (redis-cli comes with it) is the shared task store of tests/it/tasks_store.rs and
# tests/interop/test_task_store.py (each test starts its own on a free loopback port, without
# persistence).
if ! command -v redis-server >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends redis-server >/dev/null \
    || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends redis-server >/dev/null; }
fi

# openssl makes the private CA and certificates of the TLS store tests (tests/it/tasks_store_tls.rs).
if ! command -v openssl >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends openssl >/dev/null \
    || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends openssl >/dev/null; }
fi

# promtool checks and unit-tests the alert rules (tests/deploy/test_monitoring.py).
if ! command -v promtool >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends prometheus >/dev/null \
    || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends prometheus >/dev/null; }
fi

# The test runner itself, pinned, on a machine that has cargo but not cargo-nextest.
if ! cargo nextest --version >/dev/null 2>&1; then
  echo "   installing cargo-nextest 0.9.143 (pinned; a few minutes, once)"
  cargo install --locked cargo-nextest@0.9.143
fi

# One build of everything the tests run: the test binaries and target/debug/mrtr-proxy, which
# the in-process smoke tests and the interop suite both use.
part "build (binary and test binaries, once; begun beside the installs)"
await_background build
# Finds nothing left to build. (No separate `cargo build --bins`: without the tests' dev-dependencies
# the features of tokio and others differ, and it would build the crate and those again.)
cargo nextest run --locked --no-run
bin="$(cd "${CARGO_TARGET_DIR:-target}" && pwd)/debug/mrtr-proxy"

part "cargo nextest (unit + in-process integration)"
cargo nextest run --locked --no-fail-fast
cargo test --locked --doc

# The interop tests spend much of their time waiting on the peers they start: three workers per
# core. The tests that share a module-scoped stack go to one worker together (conftest.py marks
# them), so each stack still starts once; each worker runs its SDK clients in one Python and one
# Node driver (tests/interop/drivers.py) instead of a process per client.
workers=${MRTR_INTEROP_WORKERS:-$(( $(nproc) * 3 ))}
part "interop: official SDK peers through the proxy ($workers workers)"
parallel=()
if [ "$workers" -gt 0 ]; then parallel=(-n "$workers" --dist loadgroup); fi
MRTR_PROXY_BIN="$bin" "$interop/.venv/mcp2/bin/python" -m pytest -q -p no:cacheprovider \
  "${parallel[@]}" "$interop"

part "deployment: Kubernetes manifests and their config; monitoring rules and dashboard"
MRTR_PROXY_BIN="$bin" "$deploy_venv/bin/python" -m pytest -q -p no:cacheprovider tests/deploy

if $ci; then
  part "fuzzing: every target 15 s (started in the background at the beginning)"
  await_background fuzzing

  # A seconds-long smoke of the benchmark harness (no thresholds, writes nowhere) so it cannot rot.
  part "benchmark harness smoke"
  MRTR_BENCH_SMOKE=1 cargo bench --locked --bench sidecar

  # A smoke of the soak (issue 34): every feature at once over two replicas while the upstream,
  # a replica and the trace collector fail; the same checks as the minutes-long run
  # (docs/BENCHMARKS.md, "Soak").
  part "soak smoke (release build)"
  cargo build --release --locked --bins
  MRTR_PROXY_BIN="$(cd "${CARGO_TARGET_DIR:-target}" && pwd)/release/mrtr-proxy" \
    "$interop/.venv/mcp2/bin/python" benches/soak/soak.py --smoke
fi
