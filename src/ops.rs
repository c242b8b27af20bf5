//! What the operator sees and drives, apart from the request path: `metrics` (the registry
//! and what is recorded), `telemetry` (logging), `healthcheck` (the probe command), `shutdown`
//! (the signals that end the process). The admin routes that serve them are `server`'s.

pub mod healthcheck;
pub(crate) mod metrics;
pub mod shutdown;
pub mod telemetry;
