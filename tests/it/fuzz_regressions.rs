//! Every seed and every saved crash input of the fuzz targets (`fuzz/seeds/<target>/`,
//! `fuzz/regressions/<target>/`) replayed through the same entry points, so that a crash found
//! once stays fixed without running the fuzzer.

use std::path::Path;

type Target = fn(&[u8]);

const TARGETS: [(&str, Target); 5] = [
    ("sse_decoder", mrtr_proxy::fuzzing::sse_decoder),
    ("jsonrpc_envelope", mrtr_proxy::fuzzing::jsonrpc_envelope),
    ("modern_headers", mrtr_proxy::fuzzing::modern_headers),
    ("request_state", mrtr_proxy::fuzzing::request_state),
    ("answer", mrtr_proxy::fuzzing::answer),
];

#[test]
fn every_seed_and_saved_crash_input_passes_its_target() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut seeds = 0;
    for (name, target) in TARGETS {
        for dir in ["seeds", "regressions"] {
            let Ok(entries) = std::fs::read_dir(root.join(dir).join(name)) else {
                continue;
            };
            for entry in entries {
                let path = entry.unwrap().path();
                if path.file_name().is_some_and(|n| n == ".keep") {
                    continue;
                }
                let data = std::fs::read(&path).unwrap();
                target(&data);
                if dir == "seeds" {
                    seeds += 1;
                }
            }
        }
        // The target handles the empty input and one byte too.
        target(b"");
        target(b"\n");
    }
    assert!(
        seeds >= TARGETS.len(),
        "every target has seeds ({seeds} found)"
    );
}
