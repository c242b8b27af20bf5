#![no_main]
//! See `mrtr_proxy::fuzzing::introspection` for the input format and the invariants checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| mrtr_proxy::fuzzing::introspection(data));
