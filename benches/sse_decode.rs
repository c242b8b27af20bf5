//! `cargo bench --bench sse_decode`: CPU time of decoding one large SSE event fed in 16 KiB
//! chunks (as a socket delivers it). Linear is the goal: twice the event, twice the time.

#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    reason = "a benchmark reports on stdout and fails loudly"
)]

use std::time::Instant;

use mrtr_proxy::sse::SseDecoder;

const CHUNK: usize = 16 * 1024;

fn main() {
    for mib in [1usize, 2, 4, 7] {
        let data = "x".repeat(mib << 20);
        let event = format!("event: message\ndata: {data}\n\n").into_bytes();
        let start = Instant::now();
        let mut decoder = SseDecoder::new(8 << 20);
        let mut events = 0;
        for chunk in event.chunks(CHUNK) {
            events += decoder.feed(chunk).unwrap().len();
        }
        assert_eq!(events, 1);
        println!(
            "{mib} MiB event in {CHUNK}-byte chunks: {:.1} ms",
            start.elapsed().as_secs_f64() * 1e3
        );
    }
}
