//! docs/CONFIG.md and config/mrtr-proxy.toml against the configuration types: every key the types
//! accept is documented (and nothing else), every documented default is the built-in one, and
//! the example file names every key.

use std::collections::BTreeSet;

use mrtr_proxy::config::Config;

const DOC: &str = include_str!("../../docs/CONFIG.md");
const EXAMPLE: &str = include_str!("../../config/mrtr-proxy.toml");

/// (key, default literal or `None` for "unset") of every row of the doc's tables.
fn documented() -> Vec<(String, Option<String>)> {
    DOC.lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let key = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            let default = cells.get(3)?;
            let default = (*default != "—").then(|| default.trim_matches('`').to_owned());
            Some((key.to_owned(), default))
        })
        .collect()
}

/// The fields serde expects where `toml` puts an unknown one (from its error message).
fn expected_fields(toml: &str) -> BTreeSet<String> {
    let err = Config::from_toml_str(toml).unwrap_err().to_string();
    let (_, expected) = err.split_once("expected").expect(&err);
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// Every `table.key` the configuration types accept; a key that is a table of known keys
/// itself (`auth.jwt`) stands for its keys (`auth.jwt.issuer`, ...).
fn accepted() -> BTreeSet<String> {
    expected_fields("zz_probe = 1\n")
        .into_iter()
        .flat_map(|table| {
            expected_fields(&format!("[{table}]\nzz_probe = 1\n"))
                .into_iter()
                .flat_map(move |k| nested(&format!("{table}.{k}")))
        })
        .collect()
}

/// `key`'s own keys when it is a table with known keys, else `key`.
fn nested(key: &str) -> Vec<String> {
    let probe = format!("[{key}]\nzz_probe = 1\n");
    match Config::from_toml_str(&probe) {
        Err(e) if e.to_string().contains("unknown field") => expected_fields(&probe)
            .into_iter()
            .map(|k| format!("{key}.{k}"))
            .collect(),
        _ => vec![key.to_owned()],
    }
}

#[test]
fn every_accepted_key_is_documented_and_nothing_else() {
    let accepted = accepted();
    assert!(accepted.len() > 20, "{accepted:?}");
    let doc: BTreeSet<String> = documented().into_iter().map(|(k, _)| k).collect();
    let missing: Vec<_> = accepted.difference(&doc).collect();
    let unknown: Vec<_> = doc.difference(&accepted).collect();
    assert!(
        missing.is_empty(),
        "keys missing from docs/CONFIG.md: {missing:?}"
    );
    assert!(
        unknown.is_empty(),
        "docs/CONFIG.md lists keys that do not exist: {unknown:?}"
    );
}

#[test]
fn documented_defaults_are_the_built_in_ones() {
    let defaults = format!("{:?}", Config::defaults().unwrap());
    for (key, default) in documented() {
        let Some(value) = default else { continue };
        let (table, field) = key.split_once('.').unwrap();
        let text = format!("[{table}]\n{field} = {value}\n");
        let parsed = Config::from_toml_str(&text).unwrap_or_else(|e| panic!("{key}: {e}"));
        assert_eq!(
            format!("{parsed:?}"),
            defaults,
            "{key} = {value} is not the default"
        );
    }
}

#[test]
fn the_example_file_names_every_key() {
    let mut table = "";
    let mut named = BTreeSet::new();
    for line in EXAMPLE.lines() {
        let l = line.trim_start_matches('#').trim();
        if let Some(t) = l.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
            table = t;
        } else if let Some((k, _)) = l.split_once(" = ") {
            if !k.contains(' ') {
                named.insert(format!("{table}.{k}"));
            }
        }
    }
    let missing: Vec<_> = accepted().difference(&named).cloned().collect();
    assert!(
        missing.is_empty(),
        "config/mrtr-proxy.toml leaves out {missing:?}"
    );
}
