#![no_main]
//! See `mrtr_proxy::fuzzing::params` for the input format and the invariants checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| mrtr_proxy::fuzzing::params(data));
