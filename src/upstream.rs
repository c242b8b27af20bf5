//! Talking to the legacy upstream, as a correct legacy (2025-06-18 / 2025-11-25) client: its
//! client (on the proxy's one `http_client`), the reader of response bodies, legacy sessions (handshake, GET stream, answers) and
//! their bounded pool, and the change feed for `subscriptions/listen`. Knows nothing of modern
//! clients or of calls: the call actor drives a leased session.

mod changes;
mod client;
mod connect;
mod credentials;
mod declared;
mod link;
mod own;
mod pins;
mod pool;
mod session;
mod sse_session;
mod stdio;
mod stream;

pub(crate) use changes::Change;
pub(crate) use client::UpstreamError;
pub(crate) use credentials::Credentials;
pub(crate) use declared::{Declared, ExtensionsTooLarge};
pub(crate) use link::{Link, Owner, SinkFuture};
pub(crate) use own::OwnSession;
pub(crate) use pins::{Pin, PrincipalBound};
pub(crate) use pool::listen::Refused as ListenRefused;
pub(crate) use pool::{Lease, SessionPool};
pub(crate) use session::{base_request, Session};
pub(crate) use stream::{MessageStream, ResponseStream};
