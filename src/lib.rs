//! mrtr-proxy: a sidecar that makes a legacy (2025-06-18 / 2025-11-25) MCP server — Streamable
//! HTTP, HTTP+SSE or stdio — a correct 2026-07-28 server, turning its inline elicitation /
//! sampling / roots requests into multi round-trip (`input_required`) results with a signed
//! `requestState`.
//!
//! The request pipeline and the module map are drawn once, in docs/ARCHITECTURE.md; each
//! module's own doc says what it owns. From the top floor down: [`server`] (listeners, admin
//! routes, shutdown) and [`demo`]; `front` (the front door: validate, retry, start, listen,
//! relay); `edge` (every response built); [`app`] (the shared state); `cluster` (peers); `call`
//! (the call actor); `rewrite`, `input`, [`state`] (the requestState), `upstream` (the legacy
//! client side), `http_client` (the one outbound client); `error`, `jsonrpc`, [`sse`], [`body`],
//! `limits`, `memo` (the bounded memo by text), [`ops`] (metrics, logging, probe, signals),
//! [`config`], [`cli`], `protocol` (constants, depends on nothing). `fuzzing` and `benching`
//! are the entry points of the fuzz targets and the benchmarks.
//!
//! The public surface is what the binary, the tests and the benchmarks use: [`app::App`],
//! [`server::serve`], [`config::Config`], [`cli`], [`demo`], [`sse`], [`body`], [`state::keys`],
//! [`ops`].

pub mod app;
mod auth;
#[doc(hidden)]
pub mod benching;
pub mod body;
mod bridge;
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
mod http_client;
mod inline_asks;
mod input;
mod jsonrpc;
mod limits;
mod memo;
pub mod ops;
mod protocol;
mod rewrite;
pub mod server;
pub mod sse;
pub mod state;
mod sync;
mod tasks;
mod trace_context;
mod upstream;
