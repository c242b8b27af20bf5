//! A modern request's body read in one pass, envelope and params together (issue 35), when it
//! has the common shape: one object whose keys are among `jsonrpc` (the plain string `"2.0"`),
//! `id` (an integer or a string without an escape), `method` (a string without an escape) and
//! `params` (an object, scanned by `scan` as it scans params alone), each named once, and no
//! escape in a key. Any other body is declined, not judged: `Message::parse` then
//! `Params::parse` read it the general way and say what is wrong with it.

use super::plain::plain_string;
use super::scan::{self, Member};

/// What the one pass read of a request body: spans of it, and the params' members (as spans of
/// the params' text).
#[derive(Debug)]
pub(super) struct Read<'a> {
    /// The id's text (a string with its quotes).
    pub(super) id: &'a str,
    /// The method.
    pub(super) method: &'a str,
    /// The params' text.
    pub(super) params: &'a str,
    /// The params' members but `_meta`, sorted by key.
    pub(super) members: Vec<Member>,
    /// `_meta`'s members, when it is an object.
    pub(super) meta: Option<Vec<Member>>,
}

/// The params as the pass found them: their text, their members and `_meta`'s.
type Scanned<'a> = (&'a str, Vec<Member>, Option<Vec<Member>>);

/// Reads `body` when it is a request of the common shape (the module's); `None` for any other.
pub(super) fn read(body: &str) -> Option<Read<'_>> {
    let bytes = body.as_bytes();
    let mut at = space(bytes, 0);
    if bytes.get(at) != Some(&b'{') {
        return None;
    }
    let (mut version, mut id, mut method) = (false, None, None);
    let mut params: Option<Scanned<'_>> = None;
    loop {
        let (key, after) = plain_string(body, space(bytes, at + 1))?;
        at = space(bytes, after);
        if bytes.get(at) != Some(&b':') {
            return None;
        }
        at = space(bytes, at + 1);
        // Each key once: a second one is declined (serde's derive refuses it in its own words).
        at = match key {
            "jsonrpc" if !version => {
                let (v, end) = plain_string(body, at)?;
                version = v == "2.0";
                version.then_some(end)?
            }
            "id" if id.is_none() => {
                let end = id_end(body, at)?;
                id = Some(body.get(at..end)?);
                end
            }
            "method" if method.is_none() => {
                let (m, end) = plain_string(body, at)?;
                method = Some(m);
                end
            }
            "params" if params.is_none() => {
                let rest = body.get(at..)?;
                let ((members, meta), len) = scan::scan_object(rest).ok()?;
                params = Some((rest.get(..len)?, members, meta));
                at + len
            }
            _ => return None,
        };
        at = space(bytes, at);
        match bytes.get(at)? {
            b',' => {}
            b'}' => break,
            _ => return None,
        }
    }
    if space(bytes, at + 1) != bytes.len() || !version {
        return None;
    }
    let (params, members, meta) = params?;
    Some(Read {
        id: id?,
        method: method?,
        params,
        members,
        meta,
    })
}

/// Past the JSON whitespace from `at`.
fn space(bytes: &[u8], mut at: usize) -> usize {
    while matches!(bytes.get(at), Some(b' ' | b'\n' | b'\t' | b'\r')) {
        at += 1;
    }
    at
}

/// Where the id at `at` ends, when it is a string without an escape or an integer (kept as
/// written, as the envelope's raw value keeps it); `None` for any other id (`null`, a fraction).
fn id_end(body: &str, at: usize) -> Option<usize> {
    let bytes = body.as_bytes();
    if bytes.get(at) == Some(&b'"') {
        return plain_string(body, at).map(|(_, end)| end);
    }
    let int = at + usize::from(bytes.get(at) == Some(&b'-'));
    let digits = bytes.get(int..)?.iter().take_while(|b| b.is_ascii_digit());
    let end = int + digits.count();
    let plain = end > int && (bytes.get(int) != Some(&b'0') || end == int + 1);
    (plain && !matches!(bytes.get(end), Some(b'.' | b'e' | b'E'))).then_some(end)
}
