//! Key sets and codecs for the unit tests of the requestState and of what signs with it.

use std::time::Duration;

use super::keys::{hs256, KeySet};
use super::token::TokenCodec;
use crate::config::Secret;

/// A 32-byte HS256 secret.
pub(crate) const KEY: &str = "0123456789abcdef0123456789abcdef";

/// A key set signing with the HS256 secret `active`, verifying with `verify_only` too.
pub(crate) fn keys(active: &str, verify_only: &[&str]) -> KeySet {
    let v = verify_only
        .iter()
        .map(|k| hs256(&Secret::new((*k).into())).1)
        .collect();
    KeySet::new(hs256(&Secret::new(active.into())), v)
}

/// A codec of instance `id` under the HS256 secret `secret`, tokens living 60 s.
pub(crate) fn codec_of(id: &str, secret: &str) -> TokenCodec {
    TokenCodec::new(keys(secret, &[]), id.into(), Duration::from_secs(60))
}
