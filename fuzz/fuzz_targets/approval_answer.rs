#![no_main]
//! See `mrtr_proxy::fuzzing::approval_answer` for the input format and the invariants checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| mrtr_proxy::fuzzing::approval_answer(data));
