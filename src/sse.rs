//! Server-Sent Events: an incremental, pure decoder and the encoder for what we send.
//!
//! The decoder never touches a socket: feed it bytes as they arrive, take events out. It follows the
//! WHATWG event-stream rules that matter for MCP: `\n`, `\r\n` and `\r` line ends, comments, `id:`,
//! `retry:`, multi-line `data:`, and empty (priming) events. Event size is bounded.

use std::borrow::Cow;

use bytes::{Buf, Bytes, BytesMut};

/// One dispatched event. Only `data` matters to MCP; `event` and `id` are kept for tests and logs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Event {
    /// The `event:` field, if any (`message` when absent per spec).
    pub event: Option<String>,
    /// The `id:` field, if any.
    pub id: Option<String>,
    /// All `data:` lines joined by `\n`.
    pub data: String,
}

/// The stream broke the decoder's bounds.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SseError {
    /// A single event (or line) grew beyond the configured bound.
    #[error("sse event exceeds {limit} bytes")]
    EventTooLarge {
        /// The configured bound in bytes.
        limit: usize,
    },
}

/// Incremental SSE decoder.
#[derive(Debug)]
pub struct SseDecoder {
    buf: BytesMut,
    // How many bytes at the front of `buf` are known to hold no line end: each byte is scanned
    // once, so a large event costs linear time however finely it is chunked.
    scanned: usize,
    max_event_bytes: usize,
    // The event being assembled.
    data: String,
    has_data: bool,
    event: Option<String>,
    id: Option<String>,
    // A `\r` ended the last line; a following `\n` belongs to it.
    skip_lf: bool,
}

impl SseDecoder {
    /// A decoder that rejects events larger than `max_event_bytes`.
    pub fn new(max_event_bytes: usize) -> Self {
        Self {
            buf: BytesMut::new(),
            scanned: 0,
            max_event_bytes,
            data: String::new(),
            has_data: false,
            event: None,
            id: None,
            skip_lf: false,
        }
    }

    /// Feeds bytes; returns every event completed by them (empty events are dropped).
    ///
    /// # Errors
    /// [`SseError::EventTooLarge`] when an event or line exceeds the bound; the decoder should then
    /// be discarded.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<Vec<Event>, SseError> {
        let mut out = Vec::new();
        if self.buf.is_empty() {
            // Nothing held over: the chunk's whole lines are read where they are, and only a
            // line it leaves open is kept.
            let taken = self.lines(chunk, 0, &mut out)?;
            self.buf.extend_from_slice(&chunk[taken..]);
        } else {
            self.buf.extend_from_slice(chunk);
            let mut buf = std::mem::take(&mut self.buf);
            let taken = self.lines(&buf, self.scanned, &mut out)?;
            buf.advance(taken);
            self.buf = buf;
        }
        self.scanned = self.buf.len();
        if self.buf.len() + self.data.len() > self.max_event_bytes {
            return Err(SseError::EventTooLarge {
                limit: self.max_event_bytes,
            });
        }
        Ok(out)
    }

    // Reads the whole lines at the front of `bytes` (the first one's end searched from
    // `scanned` on: the bytes before it hold none) into `out`; returns how many bytes they took.
    fn lines(
        &mut self,
        bytes: &[u8],
        mut scanned: usize,
        out: &mut Vec<Event>,
    ) -> Result<usize, SseError> {
        let mut start = 0;
        loop {
            if self.skip_lf && start < bytes.len() {
                if bytes[start] == b'\n' {
                    start += 1;
                }
                self.skip_lf = false;
                scanned = scanned.max(start);
            }
            let Some(end) = memchr::memchr2(b'\n', b'\r', &bytes[scanned..]).map(|p| p + scanned)
            else {
                return Ok(start);
            };
            self.skip_lf = bytes[end] == b'\r';
            if let Some(ev) = self.line(&bytes[start..end])? {
                out.push(ev);
            }
            start = end + 1;
            scanned = start;
        }
    }

    fn line(&mut self, line: &[u8]) -> Result<Option<Event>, SseError> {
        if line.is_empty() {
            return Ok(self.dispatch());
        }
        if line[0] == b':' {
            return Ok(None); // comment / keep-alive
        }
        // The field is ASCII: it is split off before the value is read as text.
        let (field, value) = match line.iter().position(|b| *b == b':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(&text(value));
                self.has_data = true;
                if self.data.len() > self.max_event_bytes {
                    return Err(SseError::EventTooLarge {
                        limit: self.max_event_bytes,
                    });
                }
            }
            b"event" => self.event = Some(text(value).into_owned()),
            b"id" if !value.contains(&0) => self.id = Some(text(value).into_owned()),
            _ => {} // retry: and unknown fields are ignored
        }
        Ok(None)
    }

    fn dispatch(&mut self) -> Option<Event> {
        let has_data = std::mem::take(&mut self.has_data);
        let data = std::mem::take(&mut self.data);
        let event = self.event.take();
        let id = self.id.take();
        // Priming events (an id and empty data) and bare id lines carry nothing for MCP.
        (has_data && !data.is_empty()).then_some(Event { event, id, data })
    }
}

// A field value as text: invalid UTF-8 replaced (U+FFFD), as the event-stream rules decode it.
// Valid text, the rule, is checked without the replacing decoder's per-chunk walk.
fn text(value: &[u8]) -> Cow<'_, str> {
    match std::str::from_utf8(value) {
        Ok(text) => Cow::Borrowed(text),
        Err(_) => String::from_utf8_lossy(value),
    }
}

/// Encodes one `message` event carrying a JSON-RPC message.
pub fn encode_message(json: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(json.len() + 24);
    out.extend_from_slice(b"event: message\ndata: ");
    // JSON we emit never holds raw newlines, but be safe: split into several data lines.
    for (i, part) in json.split(|b| *b == b'\n').enumerate() {
        if i > 0 {
            out.extend_from_slice(b"\ndata: ");
        }
        out.extend_from_slice(part);
    }
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// The keep-alive comment sent while the upstream is quiet.
pub fn keepalive() -> Bytes {
    Bytes::from_static(b": keep-alive\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(input: &[u8]) -> Vec<Event> {
        let mut d = SseDecoder::new(1 << 20);
        d.feed(input).unwrap()
    }

    fn assert_split_invariant(fixture: &[u8], expected: &[Event]) {
        for cut in 0..=fixture.len() {
            let mut d = SseDecoder::new(1 << 20);
            let mut got = d.feed(&fixture[..cut]).unwrap();
            got.extend(d.feed(&fixture[cut..]).unwrap());
            assert_eq!(got, expected, "split at {cut}");
        }
        // And one byte at a time.
        let mut d = SseDecoder::new(1 << 20);
        let mut got = Vec::new();
        for b in fixture {
            got.extend(d.feed(std::slice::from_ref(b)).unwrap());
        }
        assert_eq!(got, expected, "byte by byte");
    }

    fn ev(data: &str) -> Event {
        Event {
            event: Some("message".into()),
            id: None,
            data: data.into(),
        }
    }

    #[test]
    fn python_crlf_stream() {
        let f = b"event: message\r\ndata: {\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"elicitation/create\"}\r\n\r\nevent: message\r\ndata: {\"id\":1,\"result\":{}}\r\n\r\n";
        let want = vec![
            ev(r#"{"jsonrpc":"2.0","id":0,"method":"elicitation/create"}"#),
            ev(r#"{"id":1,"result":{}}"#),
        ];
        assert_eq!(decode_all(f), want);
        assert_split_invariant(f, &want);
    }

    #[test]
    fn server_everything_priming_ids_and_keepalive() {
        let f = b"id: 1b2\ndata: \n\n: keepalive\n\nretry: 1000\nid: 3c4\nevent: message\ndata: {\"a\":1}\n\n";
        let want = vec![Event {
            event: Some("message".into()),
            id: Some("3c4".into()),
            data: r#"{"a":1}"#.into(),
        }];
        assert_eq!(decode_all(f), want);
        assert_split_invariant(f, &want);
    }

    #[test]
    fn multi_line_data_and_bare_cr() {
        let f = b"data: {\"a\":\rdata: 1}\r\rdata:no-space\n\n";
        let want = vec![
            Event {
                event: None,
                id: None,
                data: "{\"a\":\n1}".into(),
            },
            Event {
                event: None,
                id: None,
                data: "no-space".into(),
            },
        ];
        assert_eq!(decode_all(f), want);
        assert_split_invariant(f, &want);
    }

    #[test]
    fn invalid_utf8_is_replaced_in_values_and_unmatched_in_fields() {
        let f = b"data: a\xffb\nda\xffta: x\nevent: m\xc3\n\n";
        let want = vec![Event {
            event: Some("m\u{fffd}".into()),
            id: None,
            data: "a\u{fffd}b".into(),
        }];
        assert_eq!(decode_all(f), want);
        assert_split_invariant(f, &want);
    }

    #[test]
    fn incomplete_event_is_held_back() {
        let mut d = SseDecoder::new(1024);
        assert!(d.feed(b"data: {\"a\"").unwrap().is_empty());
        assert!(d.feed(b":1}\n").unwrap().is_empty());
        assert_eq!(
            d.feed(b"\n").unwrap(),
            vec![Event {
                event: None,
                id: None,
                data: "{\"a\":1}".into()
            }]
        );
    }

    #[test]
    fn bounds_event_size() {
        let mut d = SseDecoder::new(16);
        assert_eq!(
            d.feed(b"data: 0123456789012345678\n"),
            Err(SseError::EventTooLarge { limit: 16 })
        );
        let mut d = SseDecoder::new(16);
        assert!(
            d.feed(b"data: 0123456789012345678").is_err(),
            "an unterminated line is bounded too"
        );
    }

    #[test]
    fn encodes_messages() {
        assert_eq!(
            &encode_message(b"{\"a\":1}")[..],
            b"event: message\ndata: {\"a\":1}\n\n"
        );
        let round = decode_all(&encode_message(b"{\"a\":1}"));
        assert_eq!(round, vec![ev("{\"a\":1}")]);
    }
}
