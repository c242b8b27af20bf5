#!/usr/bin/env bash
# Runs every fuzz target for a bounded time each and prints runs per target. The default, 15 s
# a target, keeps a CI run of the 13 targets under 6 minutes with the build (5.6 measured on a
# shared 2-core machine: 1.9 of incremental `cargo fuzz build`, 3.7 of fuzzing); a longer run
# (`FUZZ_SECONDS=600 bash fuzz/run.sh`; docs/SECURITY.md § Fuzzing record has the last one) is
# the way to trust a change to a parser. Stable Rust works through RUSTC_BOOTSTRAP=1 (cargo fuzz
# passes nightly -Z sanitizer flags). Installs the pinned cargo-fuzz when it is missing.
#
# A crash stops the run with the input under fuzz/artifacts/<target>/: copy it to
# fuzz/regressions/<target>/ with the fix, so `cargo nextest` replays it for good
# (tests/it/fuzz_regressions.rs).
set -euo pipefail
cd "$(dirname "$0")"
seconds="${FUZZ_SECONDS:-15}"
targets=(sse_decoder jsonrpc_envelope modern_headers request_state answer params tasks_update
  approval_answer bearer jwks introspection sse_messages trace_context)
export RUSTC_BOOTSTRAP=1
if ! cargo fuzz --version 2>/dev/null | grep -q '^cargo-fuzz 0.13.2$'; then
  cargo install cargo-fuzz --version 0.13.2 --locked -q
fi
cargo fuzz build -O
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  log="$(mktemp)"
  # -max_len bounds each input (the proxy's own bounds are larger, the parsers linear);
  # -rss_limit_mb turns runaway memory into a failure, -timeout an input that stalls a parser
  # (the slowest seen take well under a second, under AddressSanitizer).
  if ! cargo fuzz run -O "$t" "corpus/$t" "seeds/$t" -- \
      -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -timeout=10 \
      -print_final_stats=1 >"$log" 2>&1; then
    tail -40 "$log"
    echo "fuzz: $t FAILED (input saved under fuzz/artifacts/$t/)"
    exit 1
  fi
  runs="$(grep -o 'Done [0-9]* runs in [0-9]* second' "$log" | tail -1)"
  echo "fuzz: $t ok: ${runs:-?}"
  rm -f "$log"
done
