//! Plain strings, read fast: where a run of a string's bytes that needs no decoding ends (eight
//! bytes at a time), and a whole string without an escape taken as a span of its text. Shared
//! by the params' scanner (`scan`) and the one-pass reader of a request (`envelope`); what a
//! string with an escape decodes to is left to them (and to serde_json).

/// Where the first byte from `at` that ends a plain run of a string is (a quote, a backslash, a
/// control character), eight bytes at a time; within the last eight bytes, the caller reads on.
pub(super) fn plain_run(bytes: &[u8], mut at: usize) -> usize {
    const ONES: u64 = u64::from_le_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_le_bytes([0x80; 8]);
    const QUOTE: u64 = u64::from_le_bytes([b'"'; 8]);
    const SLASH: u64 = u64::from_le_bytes([b'\\'; 8]);
    const SPACE: u64 = u64::from_le_bytes([0x20; 8]);
    while let Some(chunk) = bytes.get(at..at + 8) {
        let mut word = [0; 8];
        word.copy_from_slice(chunk);
        // Little-endian: the first byte is the lowest, so the lowest flag is the first special
        // byte (a borrow only ever flags bytes above a true one, never below).
        let w = u64::from_le_bytes(word);
        let zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGH;
        let special = zero(w ^ QUOTE) | zero(w ^ SLASH) | (w.wrapping_sub(SPACE) & !w & HIGH);
        if special != 0 {
            return at + (special.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    at
}

/// The string whose opening quote is at `at` in `text`, when it holds no escape and no control
/// character: its contents, and where it ends (past its closing quote). `None` for any other
/// string, for no string, and for one that does not end.
pub(super) fn plain_string(text: &str, at: usize) -> Option<(&str, usize)> {
    let bytes = text.as_bytes();
    if bytes.get(at) != Some(&b'"') {
        return None;
    }
    let mut end = plain_run(bytes, at + 1);
    loop {
        match bytes.get(end)? {
            b'"' => break,
            b'\\' | 0..=0x1f => return None,
            _ => end += 1,
        }
    }
    Some((text.get(at + 1..end)?, end + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_run_stops_at_the_first_special_byte() {
        for at in 0..20 {
            for special in [b'"', b'\\', 0x1f, 0] {
                let mut bytes = vec![b'a'; 24];
                bytes[at] = special;
                assert_eq!(plain_run(&bytes, 0), at, "{special} at {at}");
            }
        }
        // A byte one above a special one, right after it (a borrow flags it too): the first
        // still wins.
        assert_eq!(plain_run(b"ab\"#\"#abcdef", 0), 2);
        assert_eq!(plain_run(b"abcd\\]\\]xyz", 0), 4);
        assert_eq!(plain_run(b"abcdef\x00\x01zzzz", 0), 6);
        assert_eq!(plain_run("ééééé\u{7f}".as_bytes(), 0), 8);
    }

    #[test]
    fn a_plain_string_is_a_span_and_any_other_is_none() {
        let text = r#"x"a string past eight bytes, é" "#;
        assert_eq!(
            plain_string(text, 1),
            Some(("a string past eight bytes, é", text.len() - 1))
        );
        assert_eq!(plain_string(r#""""#, 0), Some(("", 2)));
        for other in [
            r#""a\"b""#,
            r#""a\u0062""#,
            "\"tab\there\"",
            r#""open"#,
            "5",
            "",
        ] {
            assert_eq!(plain_string(other, 0), None, "{other}");
        }
    }
}
