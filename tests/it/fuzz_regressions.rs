//! Every seed and every saved crash input of the fuzz targets (`fuzz/seeds/<target>/`,
//! `fuzz/regressions/<target>/`) replayed through the same entry points, so that a crash found
//! once stays fixed without running the fuzzer.

use std::path::Path;

type Target = fn(&[u8]);

const TARGETS: [(&str, Target); 13] = [
    ("sse_decoder", mrtr_proxy::fuzzing::sse_decoder),
    ("jsonrpc_envelope", mrtr_proxy::fuzzing::jsonrpc_envelope),
    ("modern_headers", mrtr_proxy::fuzzing::modern_headers),
    ("request_state", mrtr_proxy::fuzzing::request_state),
    ("answer", mrtr_proxy::fuzzing::answer),
    ("params", mrtr_proxy::fuzzing::params),
    ("tasks_update", mrtr_proxy::fuzzing::tasks_update),
    ("approval_answer", mrtr_proxy::fuzzing::approval_answer),
    ("bearer", mrtr_proxy::fuzzing::bearer),
    ("jwks", mrtr_proxy::fuzzing::jwks),
    ("introspection", mrtr_proxy::fuzzing::introspection),
    ("sse_messages", mrtr_proxy::fuzzing::sse_messages),
    ("trace_context", mrtr_proxy::fuzzing::trace_context),
];

#[test]
fn every_seed_and_saved_crash_input_passes_its_target() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut unseeded = Vec::new();
    for (name, target) in TARGETS {
        let mut seeds = 0;
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
        if seeds == 0 {
            unseeded.push(name);
        }
        // The target handles the empty input and one byte too.
        target(b"");
        target(b"\n");
    }
    assert!(unseeded.is_empty(), "targets without seeds: {unseeded:?}");
}

#[test]
fn every_target_is_built_and_run_by_the_fuzz_crate() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let run = std::fs::read_to_string(root.join("run.sh")).unwrap();
    for (name, _) in TARGETS {
        assert!(
            manifest.contains(&format!("name = \"{name}\"")),
            "{name} is not a [[bin]] of fuzz/Cargo.toml"
        );
        assert!(
            run.split(|c: char| c.is_whitespace() || "()=".contains(c))
                .any(|w| w == name),
            "{name} is not in fuzz/run.sh's targets"
        );
    }
}
