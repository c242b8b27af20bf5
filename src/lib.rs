//! mrtr-proxy: a sidecar that makes a legacy (2025-06-18 / 2025-11-25) MCP Streamable HTTP server
//! a correct 2026-07-28 server, turning its inline elicitation / sampling / roots requests into
//! multi round-trip (`input_required`) results with a signed `requestState`.
//!
//! ```text
//! client ─POST /mcp─▶ proxy::handle ── Origin check (403)
//!   │  Mcp-Session-Id / initialize / legacy version ──▶ relay (bytes, streamed both ways)
//!   │  modern: front::validate (-32020 / -32022 / -32602 → 400, unknown method → 404)
//!   ├─ server/discover      ─▶ pool lease ─▶ rewrite::discover_result (from InitializeResult)
//!   ├─ subscriptions/listen ─▶ listen (subscribe on a session, pin it; the pool's change feed
//!   │                          from every session of the principal, filtered and tagged)
//!   ├─ requestState present ─▶ state_token::verify ─▶ parked::claim ─▶ Resume ─▶ call actor
//!   └─ other forwards       ─▶ call::spawn: pool lease ─▶ upstream POST (JSON | SSE)
//!                                 server request ─▶ gather ─▶ park (input_required + token)
//!                                 final ─▶ rewrite::rewrite_result ─▶ call::respond (JSON | SSE)
//!   failures: upstream → 502/504 (401/403 + its challenge passed through), limits → 503 +
//!             Retry-After, client faults → 4xx, all JSON-RPC
//! GET /.well-known/… ─▶ relay to the upstream's origin (OAuth metadata); /healthz /readyz /metrics
//! ```
//!
//! Modules: [`config`] and [`cli`] (settings), [`server`] (listener, `App`, admin routes),
//! [`proxy`] (the pipeline), [`front`] (modern validation), [`relay`] (legacy pass-through),
//! [`call`] (call actor), [`parked`] (registry), [`input`] (input requests), [`state_token`]
//! (JWT), [`rewrite`] (results), [`listen`], [`upstream`] (client, sessions, pool), [`sse`],
//! [`jsonrpc`], [`metrics`], [`body`], [`error`], [`demo`], [`telemetry`], [`shutdown`].

pub mod body;
pub mod call;
pub mod cli;
pub mod config;
pub mod demo;
pub mod error;
pub mod front;
pub mod input;
pub mod jsonrpc;
pub mod listen;
pub mod metrics;
pub mod parked;
pub mod proxy;
pub mod relay;
pub mod rewrite;
pub mod server;
pub mod shutdown;
pub mod sse;
pub mod state_token;
pub mod telemetry;
pub mod upstream;
