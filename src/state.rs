//! The requestState: everything a token is made of and checked against. `token` signs and
//! verifies the requestState (claims, codec, errors) on `jwt`, the compact JWTs under the key
//! set that peer signatures use too; `digest` makes the principal and request digests
//! it binds and the ids it names; `keys` is the key set (files, kids, reload); `replay` is the
//! journal a replay-safe call's token carries, sealed; `spent` the tokens used here (each once).
//! None of it knows whether a call is parked: the call registry checks that.

mod digest;
mod jwt;
pub mod keys;
pub(crate) mod replay;
mod spent;
#[cfg(test)]
pub(crate) mod testing;
mod token;

pub(crate) use digest::{principal_digest, random_id, request_digest, unix};
pub(crate) use spent::SpentTokens;
pub(crate) use token::{Claims, TokenCodec, TokenError};
