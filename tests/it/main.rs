#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers fail loudly, like the tests that call them"
)]
#![allow(
    unreachable_pub,
    reason = "test support items are pub for sibling modules of this test binary"
)]
//! In-process integration tests: the proxy on port 0 in front of a scripted legacy upstream
//! (`support::mock`) or the built-in demo upstream.

mod approval;
mod architecture;
mod auth;
mod bridge;
mod changes;
mod cluster;
mod config_docs;
mod demo;
// Reads CPU time from /proc.
#[cfg(target_os = "linux")]
#[cfg(target_os = "linux")]
mod descriptors;
mod docs_links;
mod extensions;
mod front;
mod fuzz_regressions;
mod gather;
mod hostile;
mod keys;
mod lifetimes;
mod metrics;
mod park;
mod passthrough;
mod security;
mod smoke;
mod sse_front;
mod sse_upstream;
mod stdio;
mod support;
mod tasks;
mod tasks_addresses;
mod tasks_cluster;
mod tasks_lifecycle;
mod tasks_store;
mod tasks_store_tls;
mod tasks_transports;
mod trace_context;
