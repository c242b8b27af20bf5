//! mrtr-proxy: a sidecar that makes a legacy (2025-06-18 / 2025-11-25) MCP Streamable HTTP server
//! a correct 2026-07-28 server, turning its inline elicitation / sampling / roots requests into
//! multi round-trip (`input_required`) results with a signed `requestState`.
//!
//! ```text
//! client ─POST /mcp─▶ front::handle ── Origin check (403), CORS preflight
//!   │  Mcp-Session-Id / initialize / legacy version ──▶ front::relay (bytes, streamed both ways)
//!   │  modern: front::validate (-32020 / -32022 / -32602 → 400, unknown method → 404)
//!   ├─ server/discover      ─▶ pool lease ─▶ rewrite::discover_result (from InitializeResult)
//!   ├─ subscriptions/listen ─▶ front::listen (subscribe on a session, pin it; the pool's change
//!   │                          feed from every session of the principal, filtered and tagged)
//!   ├─ requestState present ─▶ state_token::verify ─▶ call::registry claim ─▶ Retry ─▶ the actor
//!   └─ other forwards       ─▶ call::spawn: the call actor (one Phase enum)
//!                                 Running: pool lease ─▶ upstream POST (JSON | SSE)
//!                                 server request ─▶ Gathering ─▶ Parked (input_required + token)
//!                                 retry ─▶ Resuming (answers upstream) ─▶ Running | Parked
//!                                 final ─▶ rewrite::rewrite_result ─▶ Done
//!   every answer ◀── edge (JSON, or SSE with keep-alives; each failure logged once, by side)
//!   failures: upstream → 502/504 (401/403 + its challenge passed through), limits → 503 +
//!             Retry-After, client faults → 4xx, all JSON-RPC
//! GET /.well-known/… ─▶ relay to the upstream's origin (OAuth metadata); /healthz /readyz /metrics
//! ```
//!
//! Modules, each depending only on those below it (a test fails on any cycle):
//! - `fuzzing`: entry points of the `cargo fuzz` targets (`fuzz/`); `benching`: what the
//!   benchmarks measure below HTTP
//! - [`server`]: listener, accept loop (`conns`: the connection table; `accept`: the pause
//!   after a failed accept; `descriptors`: the limit raised at start), admin routes, shutdown;
//!   [`demo`]: the built-in walkthrough
//! - `front`: the front door (`validate`, `cors`, `listen`, `relay` beneath it)
//! - `edge`: every response built, the SSE writer, failure logging
//! - [`app`]: the shared state
//! - `call`: the call actor (`send`, `notify`, `park`, `rounds` pure bookkeeping, `registry` of
//!   parked calls, `leg`, `end`)
//! - `rewrite` (results), `input` (input requests), `state_token` (JWT), [`keys`] (the key set:
//!   files, kids, reload), `upstream` (client, sessions, pool), `metrics`
//! - `limits` (per-principal concurrency), `error`, `jsonrpc`, [`sse`], [`body`], [`config`],
//!   [`cli`], `protocol` (constants, depends on nothing), [`telemetry`], [`shutdown`],
//!   [`healthcheck`]
//!
//! The public surface is what the binary, the tests and the benchmark use: [`app::App`],
//! [`server::run`], [`config::Config`], [`cli`], [`demo`], [`sse`], [`body`], [`telemetry`],
//! [`shutdown`].

pub mod app;
#[doc(hidden)]
pub mod benching;
pub mod body;
mod call;
pub mod cli;
mod cluster;
pub mod config;
pub mod demo;
mod edge;
mod error;
mod front;
#[doc(hidden)]
pub mod fuzzing;
pub mod healthcheck;
mod http_client;
mod input;
mod jsonrpc;
mod limits;
mod metrics;
mod protocol;
mod rewrite;
pub mod server;
pub mod shutdown;
pub mod sse;
pub mod state;
pub mod telemetry;
mod upstream;
