//! `cargo bench --bench token`: one requestState minted, signed (HS256) and verified, as every
//! round does once each way. Criterion reports the time per sign + verify.

use criterion::{criterion_group, criterion_main, Criterion};
use mrtr_proxy::benching::TokenBench;

fn sign_and_verify(c: &mut Criterion) {
    let bench = TokenBench::new();
    c.bench_function("requestState sign + verify (HS256)", |b| {
        b.iter(|| bench.sign_and_verify());
    });
}

criterion_group!(benches, sign_and_verify);
criterion_main!(benches);
