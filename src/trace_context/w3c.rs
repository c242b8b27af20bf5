//! The W3C formats of the three values, checked and bounded: `traceparent` and `tracestate`
//! (W3C Trace Context, <https://www.w3.org/TR/trace-context-2/> §3.2, §3.3) and `baggage`
//! (W3C Baggage, <https://www.w3.org/TR/baggage/> §3). Pure functions over text: what a request
//! may send on, nothing about where it came from.

use std::borrow::Cow;

/// Most `tracestate` list members (the grammar's `0*31` after the first).
const MAX_TRACESTATE_MEMBERS: usize = 32;
/// Longest `tracestate` sent on: the 512 characters W3C asks every vendor to propagate; past
/// them whole members are cut.
const MAX_TRACESTATE_BYTES: usize = 512;
/// A `tracestate` member longer than this is cut first (W3C, "tracestate Limits").
const LONG_TRACESTATE_MEMBER_BYTES: usize = 128;
/// Most `baggage` list members (the grammar's `0*179` after the first).
const MAX_BAGGAGE_MEMBERS: usize = 180;
/// Longest `baggage` sent on (W3C Baggage's 8192 bytes).
const MAX_BAGGAGE_BYTES: usize = 8192;
/// Length of a version `00` `traceparent`, and the part of a later version that is read.
const TRACEPARENT_BYTES: usize = 55;

/// What of a list (`tracestate`, `baggage`) may be sent on.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Checked {
    /// The value to send.
    pub(super) kept: Kept,
    /// Some of it did not parse.
    pub(super) invalid: bool,
    /// Some of it was past the bounds.
    pub(super) oversized: bool,
}

/// The value to send on.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Kept {
    /// The value as it came: valid and within the bounds.
    Whole,
    /// The members left once the others were cut, joined by commas.
    Part(String),
    /// Nothing: no member is left (or there was none).
    Nothing,
}

/// A `traceparent` that may be sent on: itself (version `00`), or a later version read as W3C
/// says (its first four fields, the `sampled` flag) and sent as version `00`; `None` when it
/// does not parse (lowercase hex only, ids not all zero, version `ff` forbidden).
pub(super) fn traceparent(value: &str) -> Option<Cow<'_, str>> {
    let b = value.as_bytes();
    let version = b.get(..2)?;
    // A later version may add fields after the four; version 00 has exactly four.
    let fits = match version {
        b"00" => b.len() == TRACEPARENT_BYTES,
        b"ff" => false,
        _ => b.len() == TRACEPARENT_BYTES || b.get(TRACEPARENT_BYTES) == Some(&b'-'),
    };
    let fields = fits
        && hex(version)
        && b[2] == b'-'
        && hex(&b[3..35])
        && nonzero(&b[3..35])
        && b[35] == b'-'
        && hex(&b[36..52])
        && nonzero(&b[36..52])
        && b[52] == b'-'
        && hex(&b[53..55]);
    if !fields {
        return None;
    }
    if version == b"00" {
        return Some(Cow::Borrowed(value));
    }
    let sampled = u8::from_str_radix(&value[53..55], 16).ok()? & 1;
    Some(Cow::Owned(format!("00{}{sampled:02x}", &value[2..53])))
}

/// A `tracestate`, checked: one member that does not parse (or a key named twice) makes the
/// whole of it invalid, and nothing is sent; past 32 members or 512 characters, whole members
/// are cut (those over 128 characters first, then from the end), as W3C says.
pub(super) fn tracestate(value: &str) -> Checked {
    let members: Vec<&str> = value
        .split(',')
        .map(ows)
        .filter(|m| !m.is_empty())
        .collect();
    if !members.iter().all(|m| tracestate_member(m)) {
        return Checked::dropped(true, false);
    }
    let mut kept: Vec<&str> = members
        .iter()
        .copied()
        .take(MAX_TRACESTATE_MEMBERS)
        .collect();
    if (1..kept.len()).any(|i| kept[..i].iter().any(|k| key(k) == key(kept[i]))) {
        return Checked::dropped(true, false);
    }
    if members.is_empty() {
        return Checked::dropped(false, false);
    }
    if members.len() <= MAX_TRACESTATE_MEMBERS && value.len() <= MAX_TRACESTATE_BYTES {
        return Checked::whole();
    }
    let oversized = members.len() > MAX_TRACESTATE_MEMBERS || joined(&kept) > MAX_TRACESTATE_BYTES;
    while joined(&kept) > MAX_TRACESTATE_BYTES {
        let long = kept
            .iter()
            .rposition(|m| m.len() > LONG_TRACESTATE_MEMBER_BYTES);
        kept.remove(long.unwrap_or(kept.len().saturating_sub(1)));
    }
    if kept.is_empty() {
        return Checked::dropped(false, true);
    }
    Checked::part(&kept, false, oversized)
}

/// A `baggage`, checked: a member that does not parse is left out, the others kept; past 180
/// members or 8192 bytes, the members that do not fit are left out.
pub(super) fn baggage(value: &str) -> Checked {
    let mut kept = Vec::new();
    let (mut invalid, mut oversized) = (false, false);
    let mut bytes = 0;
    for member in value.split(',').map(ows).filter(|m| !m.is_empty()) {
        if !baggage_member(member) {
            invalid = true;
            continue;
        }
        let more = member.len() + usize::from(!kept.is_empty());
        if kept.len() == MAX_BAGGAGE_MEMBERS || bytes + more > MAX_BAGGAGE_BYTES {
            oversized = true;
            continue;
        }
        bytes += more;
        kept.push(member);
    }
    if kept.is_empty() {
        return Checked::dropped(invalid, oversized);
    }
    if !invalid && !oversized && value.len() <= MAX_BAGGAGE_BYTES {
        return Checked::whole();
    }
    Checked::part(&kept, invalid, oversized)
}

impl Checked {
    fn whole() -> Self {
        Self {
            kept: Kept::Whole,
            invalid: false,
            oversized: false,
        }
    }

    fn dropped(invalid: bool, oversized: bool) -> Self {
        Self {
            kept: Kept::Nothing,
            invalid,
            oversized,
        }
    }

    fn part(members: &[&str], invalid: bool, oversized: bool) -> Self {
        Self {
            kept: Kept::Part(members.join(",")),
            invalid,
            oversized,
        }
    }
}

// `key=value`: a key of lowercase letters, digits and `_-*/@` (starting with a letter or a
// digit, at most 256), a value of at most 256 printable characters but `,` and `=`, not ending
// in a space (the member's optional whitespace is already trimmed).
fn tracestate_member(member: &str) -> bool {
    let Some((key, value)) = member.split_once('=') else {
        return false;
    };
    let key_ok = matches!(key.as_bytes().first(), Some(b'a'..=b'z' | b'0'..=b'9'))
        && key.len() <= 256
        && key
            .bytes()
            .all(|c| matches!(c, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'*' | b'/' | b'@'));
    let value_ok = !value.is_empty()
        && value.len() <= 256
        && !value.ends_with(' ')
        && value
            .bytes()
            .all(|c| (0x20..=0x7e).contains(&c) && c != b',' && c != b'=');
    key_ok && value_ok
}

// `key OWS "=" OWS value *(OWS ";" OWS property)`: the key a token (RFC 7230), the value (and
// a property's) baggage octets; a property is `key` or `key=value`.
fn baggage_member(member: &str) -> bool {
    let mut parts = member.split(';');
    let pair = parts.next().unwrap_or("");
    let pair_ok = pair
        .split_once('=')
        .is_some_and(|(k, v)| token(ows(k)) && ows(v).bytes().all(baggage_octet));
    pair_ok
        && parts.all(|p| match p.split_once('=') {
            Some((k, v)) => token(ows(k)) && ows(v).bytes().all(baggage_octet),
            None => token(ows(p)),
        })
}

// RFC 7230 §3.2.6 `token`.
fn token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes().all(|c| {
            c.is_ascii_alphanumeric()
                || matches!(
                    c,
                    b'!' | b'#'
                        | b'$'
                        | b'%'
                        | b'&'
                        | b'\''
                        | b'*'
                        | b'+'
                        | b'-'
                        | b'.'
                        | b'^'
                        | b'_'
                        | b'`'
                        | b'|'
                        | b'~'
                )
        })
}

// US-ASCII but controls, whitespace, `"`, `,`, `;` and `\`.
fn baggage_octet(c: u8) -> bool {
    matches!(c, 0x21 | 0x23..=0x2b | 0x2d..=0x3a | 0x3c..=0x5b | 0x5d..=0x7e)
}

// Optional whitespace (space, tab) trimmed.
fn ows(s: &str) -> &str {
    s.trim_matches(|c| c == ' ' || c == '\t')
}

fn hex(b: &[u8]) -> bool {
    b.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
}

fn nonzero(b: &[u8]) -> bool {
    b.iter().any(|c| *c != b'0')
}

// A `tracestate` member's key.
fn key(member: &str) -> &str {
    member.split_once('=').map_or(member, |(k, _)| k)
}

// The length of `members` joined by commas.
fn joined(members: &[&str]) -> usize {
    members.iter().map(|m| m.len()).sum::<usize>() + members.len().saturating_sub(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn a_version_00_traceparent_is_itself_and_anything_off_is_refused() {
        assert_eq!(traceparent(TP), Some(Cow::Borrowed(TP)));
        for bad in [
            "",
            "00",
            "00-zzzz",
            "00-zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz-b7ad6b7169203331-01",
            // All-zero ids.
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            // Upper case hex, anywhere.
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-B7AD6B7169203331-01",
            "0A-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0F",
            // Version ff, a fifth field on 00, fields too short or too long, other separators.
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
            "00-0af7651916cd43dd8448eb211c8031-b7ad6b7169203331-0100",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b71692033310-1",
            "00_0af7651916cd43dd8448eb211c80319c_b7ad6b7169203331_01",
            " 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01 ",
            "0é-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ] {
            assert_eq!(traceparent(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_later_version_is_read_as_w3c_says_and_sent_as_00() {
        let later = "cc-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-09-what-comes-next";
        let sent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        assert_eq!(traceparent(later).as_deref(), Some(sent));
        let bare = "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-02";
        assert_eq!(
            traceparent(bare).as_deref(),
            Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00")
        );
        let glued = "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01x";
        assert_eq!(traceparent(glued), None);
    }

    #[test]
    fn a_valid_tracestate_is_kept_whole_and_one_bad_member_drops_it() {
        for ok in [
            "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE",
            "congo=t61rcWkgMzE , rojo=00f067aa0ba902b7,",
            "tenant@vendor=v, 0k=a b",
            "k= leading",
        ] {
            assert_eq!(tracestate(ok), Checked::whole(), "{ok}");
        }
        for bad in [
            "Rojo=1",
            "rojo",
            "rojo=",
            "rojo=a=b",
            "rojo=1,congo=é",
            "_k=1",
            "rojo =1",
            "rojo=1\t\u{1}",
            "rojo=1,rojo=2",
        ] {
            assert_eq!(tracestate(bad), Checked::dropped(true, false), "{bad}");
        }
        let long_key = format!("{}=1", "k".repeat(257));
        assert_eq!(tracestate(&long_key), Checked::dropped(true, false));
        let long_value = format!("k={}", "v".repeat(257));
        assert_eq!(tracestate(&long_value), Checked::dropped(true, false));
        assert_eq!(tracestate(" , "), Checked::dropped(false, false));
    }

    #[test]
    fn a_tracestate_past_its_bounds_loses_whole_members_long_ones_first() {
        let many: Vec<String> = (0..40).map(|i| format!("k{i}=v")).collect();
        let checked = tracestate(&many.join(","));
        assert!(checked.oversized && !checked.invalid);
        assert_eq!(checked.kept, Kept::Part(many[..32].join(",")));
        // Over 512 characters: the long member goes first, then members from the end.
        let long = format!("long={}", "x".repeat(200));
        let small: Vec<String> = (0..10)
            .map(|i| format!("s{i}={}", "y".repeat(47)))
            .collect();
        let value = format!("a=1,{long},{}", small.join(","));
        let Kept::Part(kept) = tracestate(&value).kept else {
            panic!("cut")
        };
        assert!(kept.len() <= MAX_TRACESTATE_BYTES, "{}", kept.len());
        assert!(
            kept.starts_with("a=1,s0=") && !kept.contains("long="),
            "{kept}"
        );
        assert_eq!(kept.split(',').count(), 1 + 9, "{kept}");
        let widest = format!("{}={}", "k".repeat(256), "v".repeat(256));
        assert_eq!(tracestate(&widest), Checked::dropped(false, true));
        // 64 KiB: cut to its bounds, never sent whole.
        let huge: Vec<String> = (0..2000)
            .map(|i| format!("k{i}={}", "v".repeat(30)))
            .collect();
        let checked = tracestate(&huge.join(","));
        let Kept::Part(kept) = checked.kept else {
            panic!("cut")
        };
        assert!(checked.oversized && kept.len() <= MAX_TRACESTATE_BYTES);
    }

    #[test]
    fn baggage_keeps_its_valid_members_within_its_bounds() {
        for ok in [
            "userId=alice",
            "key1=value1;property1;property2, key2 = value2, key3=value3; propertyKey=propertyValue",
            "serverNode=DF%2028,isProduction=false",
            "k=a=b",
            "k=",
        ] {
            assert_eq!(baggage(ok), Checked::whole(), "{ok}");
        }
        let checked = baggage("good=1,bad key=2,\"q\"=3,also=ok,v=a\\b,p=1;bad prop");
        assert_eq!(checked.kept, Kept::Part("good=1,also=ok".into()));
        assert!(checked.invalid && !checked.oversized);
        assert_eq!(baggage("nokey,=v"), Checked::dropped(true, false));
        let many: Vec<String> = (0..200).map(|i| format!("k{i}=v")).collect();
        let checked = baggage(&many.join(","));
        assert_eq!(checked.kept, Kept::Part(many[..180].join(",")));
        assert!(checked.oversized && !checked.invalid);
        let big: Vec<String> = (0..40)
            .map(|i| format!("k{i}={}", "v".repeat(1000)))
            .collect();
        let checked = baggage(&big.join(","));
        let Kept::Part(kept) = checked.kept else {
            panic!("cut")
        };
        assert!(checked.oversized && kept.len() <= MAX_BAGGAGE_BYTES);
        assert_eq!(kept.split(',').count(), 8);
        let one_huge = format!("k={}", "v".repeat(MAX_BAGGAGE_BYTES));
        assert_eq!(baggage(&one_huge), Checked::dropped(false, true));
    }
}
