//! The shape of `src/`, checked: no cycle between modules (neither between files nor between
//! top-level modules), no long function on the request path, and no long file outside the tests.
//!
//! A module depends on another when its code names it: `crate::a::b` paths, `super::…` paths,
//! `self::…` and paths through its own child modules (`rounds::Rounds`), `use` trees included.
//! `mod` declarations are not dependencies, nor are comments or `#[cfg(test)]` code (everything
//! from the first `#[cfg(test)]` line of a file on). Calling a method defined in a child's `impl`
//! block is invisible here, which is fine: that is one type split over files, not a dependency.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Longest function allowed outside `src/demo/` (the built-in example server and client).
const MAX_FN_LINES: usize = 60;
/// Longest file (its in-file unit tests included) allowed in `src/`, `benches/` and `fuzz/`:
/// past it a file holds more than one concern and is split (`foo.rs` + `foo/bar.rs`).
const MAX_FILE_LINES: usize = 500;

#[test]
fn no_module_depends_on_itself_through_others() {
    let sources = read_src();
    let graph = dependencies(&sources);
    assert!(
        graph.values().map(BTreeSet::len).sum::<usize>() > 20,
        "the scanner found almost no dependencies: it is broken, not the code"
    );
    if let Some(cycle) = find_cycle(&graph) {
        panic!("module cycle between files: {}", cycle.join(" → "));
    }
    if let Some(cycle) = find_cycle(&top_level(&graph)) {
        panic!(
            "module cycle between top-level modules: {}",
            cycle.join(" → ")
        );
    }
}

#[test]
fn the_cycle_check_finds_cycles() {
    let src = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(m, s)| ((*m).to_owned(), (*s).to_owned()))
            .collect()
    };
    // Through `use crate::…` and a re-export.
    let g = dependencies(&src(&[
        ("a", "use crate::b::X;"),
        ("b", "mod c;\npub use c::Y;"),
        ("b::c", "fn f() { crate::a::g() }"),
    ]));
    assert_eq!(find_cycle(&g).map(|c| c.len()), Some(4), "{g:?}");
    // Through `super::` and a grouped `use` from the crate root.
    let g = dependencies(&src(&[
        ("x", "mod y;\nuse crate::{z, w::V};\nfn f(v: y::T) {}"),
        ("x::y", "use super::Thing;"),
        ("z", ""),
        ("w", ""),
    ]));
    assert!(find_cycle(&g).is_some(), "{g:?}");
    // Only between top-level modules.
    let g = dependencies(&src(&[
        ("p", "mod q;\nuse crate::r::S;"),
        ("p::q", ""),
        ("r", "use crate::p::q::T;"),
    ]));
    assert!(find_cycle(&g).is_none(), "{g:?}");
    assert!(find_cycle(&top_level(&g)).is_some(), "{g:?}");
    // Comments and test code do not count.
    let g = dependencies(&src(&[
        (
            "m",
            "// see crate::n::N\nfn f() {}\n#[cfg(test)]\nmod tests { use crate::n::N; }",
        ),
        ("n", "use crate::m::M;"),
    ]));
    assert!(find_cycle(&g).is_none(), "{g:?}");
}

#[test]
fn no_file_outside_the_tests_is_long() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["src", "benches", "fuzz"] {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(
        files.len() > 50,
        "the walk found almost no files: {files:?}"
    );
    let long: Vec<String> = files
        .iter()
        .filter_map(|path| {
            let lines = std::fs::read_to_string(path).unwrap().lines().count();
            let rel = path.strip_prefix(root).unwrap().display();
            (lines > MAX_FILE_LINES).then(|| format!("{rel} ({lines} lines)"))
        })
        .collect();
    assert!(
        long.is_empty(),
        "files over {MAX_FILE_LINES} lines: {long:?}"
    );
}

// Every `.rs` file under `dir` (build output and installed dependencies left out).
fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy();
        if path.is_dir() && !matches!(name.as_ref(), "target" | "corpus" | "artifacts") {
            rust_files(&path, out);
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

#[test]
fn request_path_functions_stay_short() {
    let long: Vec<String> = read_src()
        .iter()
        .filter(|(module, _)| !module.starts_with("demo"))
        .flat_map(|(module, text)| {
            long_functions(text)
                .into_iter()
                .map(move |(name, lines)| format!("{module}::{name} ({lines} lines)"))
        })
        .collect();
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines: {long:?}"
    );
    assert_eq!(
        long_functions("fn f() {\n    a();\n}\n").len(),
        0,
        "a short function passes"
    );
    let body = "    x();\n".repeat(MAX_FN_LINES);
    assert_eq!(
        long_functions(&format!("    pub(crate) async fn g() {{\n{body}    }}\n")).len(),
        1
    );
}

/// Module path → source (up to the first `#[cfg(test)]`), for every file under `src/` but the
/// crate roots.
fn read_src() -> BTreeMap<String, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = BTreeMap::new();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let rel = path.strip_prefix(&root).unwrap().with_extension("");
            let module = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("::");
            if module == "lib" || module == "main" {
                continue;
            }
            out.insert(module, std::fs::read_to_string(&path).unwrap());
        }
    }
    out
}

fn code_of(text: &str) -> String {
    text.lines()
        .take_while(|l| !l.trim_start().starts_with("#[cfg(test)]"))
        .filter(|l| !l.trim_start().starts_with("//"))
        .map(|l| l.split(" // ").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Module → the modules it names (never itself).
fn dependencies(sources: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    let known: BTreeSet<&str> = sources.keys().map(String::as_str).collect();
    let mut graph = BTreeMap::new();
    for (module, text) in sources {
        let code = code_of(text);
        let children: BTreeSet<String> = code
            .lines()
            .filter_map(|l| {
                let l = l
                    .trim()
                    .trim_start_matches("pub ")
                    .trim_start_matches("pub(crate) ");
                l.strip_prefix("mod ")?.strip_suffix(';').map(str::to_owned)
            })
            .collect();
        let mut deps = BTreeSet::new();
        for path in paths(&code) {
            let mut segs: Vec<&str> = path.split("::").collect();
            let mut base: Vec<&str> = module.split("::").collect();
            match segs[0] {
                "crate" => {
                    base.clear();
                    segs.remove(0);
                }
                "super" => {
                    while segs.first() == Some(&"super") {
                        segs.remove(0);
                        base.pop();
                    }
                }
                "self" => {
                    segs.remove(0);
                }
                first if children.contains(first) => {}
                _ => continue,
            }
            // The longest prefix of base + segs that is a module.
            let mut full: Vec<&str> = base.clone();
            full.extend(segs);
            let target = (1..=full.len())
                .rev()
                .map(|n| full[..n].join("::"))
                .find(|m| known.contains(m.as_str()));
            if let Some(t) = target.filter(|t| t != module) {
                deps.insert(t);
            }
        }
        graph.insert(module.clone(), deps);
    }
    graph
}

/// Every `a::b::c` path in the code, with `use` trees (`a::{b, c::d}`) expanded.
fn paths(code: &str) -> Vec<String> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let starts =
            is_ident(chars[i]) && (i == 0 || !(is_ident(chars[i - 1]) || chars[i - 1] == ':'));
        if !starts {
            i += 1;
            continue;
        }
        let (tree, next) = use_tree(&chars, i);
        out.extend(tree.into_iter().filter(|p| p.contains("::")));
        i = next.max(i + 1);
    }
    out
}

// Parses `ident(::ident)*` optionally followed by `::{…}` (nested), from `i`.
fn use_tree(chars: &[char], mut i: usize) -> (Vec<String>, usize) {
    let mut prefix = String::new();
    loop {
        let start = i;
        while i < chars.len() && is_ident(chars[i]) {
            i += 1;
        }
        prefix.extend(&chars[start..i]);
        if chars.get(i) == Some(&':') && chars.get(i + 1) == Some(&':') {
            i += 2;
            prefix.push_str("::");
            if chars.get(i) == Some(&'{') {
                let mut out = Vec::new();
                i += 1;
                loop {
                    while i < chars.len() && (chars[i].is_whitespace() || chars[i] == ',') {
                        i += 1;
                    }
                    match chars.get(i) {
                        None => return (out, i),
                        Some('}') => return (out, i + 1),
                        Some(c) if is_ident(*c) => {
                            let (inner, next) = use_tree(chars, i);
                            out.extend(inner.into_iter().map(|p| format!("{prefix}{p}")));
                            i = next;
                        }
                        Some(_) => i += 1,
                    }
                }
            }
            if !chars.get(i).is_some_and(|c| is_ident(*c)) {
                return (vec![prefix], i);
            }
        } else {
            return (vec![prefix], i);
        }
    }
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The same graph between top-level modules (`call::rounds` counts as `call`).
fn top_level(graph: &BTreeMap<String, BTreeSet<String>>) -> BTreeMap<String, BTreeSet<String>> {
    let top = |m: &str| m.split("::").next().unwrap_or(m).to_owned();
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, deps) in graph {
        let entry = out.entry(top(m)).or_default();
        entry.extend(deps.iter().map(|d| top(d)).filter(|d| *d != top(m)));
    }
    out
}

/// A cycle `a → b → … → a`, if there is one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        done: &mut BTreeSet<String>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|n| n == node) {
            let mut cycle = stack[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, graph, done, stack) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut done, &mut Vec::new()))
}

/// Functions longer than [`MAX_FN_LINES`] (rustfmt layout: a function ends at the first `}` at
/// its own indentation), as (name, lines).
fn long_functions(text: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = text
        .lines()
        .take_while(|l| !l.trim_start().starts_with("#[cfg(test)]"))
        .collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        let sig = ["pub(crate) ", "pub(super) ", "pub ", "async ", "const "]
            .iter()
            .fold(trimmed, |s, p| s.strip_prefix(p).unwrap_or(s));
        let sig = sig.strip_prefix("async ").unwrap_or(sig);
        let Some(name) = sig.strip_prefix("fn ") else {
            continue;
        };
        if trimmed.ends_with('}') || trimmed.ends_with(';') {
            continue;
        }
        let name: String = name.chars().take_while(|c| is_ident(*c)).collect();
        let close = format!("{indent}}}");
        if let Some(end) = lines[i + 1..].iter().position(|l| *l == close) {
            let n = end + 2;
            if n > MAX_FN_LINES {
                out.push((name, n));
            }
        }
    }
    out
}
