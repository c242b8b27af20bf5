//! What principals may hold: `quota` counts held things (parked calls, tasks) against their
//! bounds; and here, per-principal concurrency: how many requests of one principal are being
//! answered at once (streams included, until their body ends). A permit rides on the response
//! body, so an SSE answer or a listen stream holds it for as long as it is open.

use std::sync::Arc;

use dashmap::DashMap;

mod quota;

pub(crate) use quota::Quota;

use crate::body::Body;

/// Requests in flight per principal digest, bounded. Hashed with foldhash (seeded per
/// process): the keys are digests, and every request looks its own up three times.
#[derive(Debug)]
pub(crate) struct PrincipalGate {
    in_flight: DashMap<String, usize, foldhash::fast::RandomState>,
    max: usize,
}

/// One request's place in its principal's count; released when dropped.
#[derive(Debug)]
pub(crate) struct Permit {
    gate: Arc<PrincipalGate>,
    principal: String,
}

impl PrincipalGate {
    /// A gate letting `max` requests of each principal through at once.
    pub(crate) fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            in_flight: DashMap::default(),
            max,
        })
    }

    /// A permit for one more request of `principal`, or `None` at the bound.
    pub(crate) fn enter(self: &Arc<Self>, principal: &str) -> Option<Permit> {
        let mut n = self.in_flight.entry(principal.to_owned()).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(Permit {
            gate: Arc::clone(self),
            principal: principal.to_owned(),
        })
    }

    /// Principals with a request in flight now.
    pub(crate) fn principals(&self) -> usize {
        self.in_flight.len()
    }
}

impl Permit {
    /// `body`, holding this permit until it ends or is dropped.
    pub(crate) fn hold_through(self, body: Body) -> Body {
        crate::body::hold(body, self)
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let gate = &self.gate;
        let empty = match gate.in_flight.get_mut(&self.principal) {
            Some(mut n) => {
                *n = n.saturating_sub(1);
                *n == 0
            }
            None => false,
        };
        if empty {
            gate.in_flight.remove_if(&self.principal, |_, n| *n == 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[test]
    fn a_principal_is_bounded_alone_and_its_entry_goes_with_its_last_request() {
        let gate = PrincipalGate::new(2);
        let a1 = gate.enter("a").unwrap();
        let a2 = gate.enter("a").unwrap();
        assert!(gate.enter("a").is_none(), "a third request of a waits");
        let b = gate.enter("b").unwrap();
        drop(a1);
        let a3 = gate.enter("a").unwrap();
        drop((a2, a3, b));
        assert_eq!(gate.principals(), 0);
    }

    #[tokio::test]
    async fn a_body_holds_its_permit_until_it_is_dropped() {
        let gate = PrincipalGate::new(1);
        let body = gate
            .enter("a")
            .unwrap()
            .hold_through(crate::body::full("x"));
        assert!(gate.enter("a").is_none());
        let bytes = body.collect().await.unwrap().to_bytes();
        assert_eq!(&bytes[..], b"x");
        assert!(gate.enter("a").is_some(), "released with the body");
    }
}
