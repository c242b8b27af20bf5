#![no_main]
//! See `mrtr_proxy::fuzzing::bearer` for the input format and the invariants checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| mrtr_proxy::fuzzing::bearer(data));
