//! README.md and docs/*.md against the tree: every relative link names a file or directory that
//! exists, and every `#anchor` names a heading of its page (GitHub's slug of it), so a moved
//! heading or file breaks the build, not the reader. Links out of the repository (`https:` …)
//! are not fetched.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// What a link may point at: `None` when nothing is there, `Some(None)` a directory or a file
/// whose headings are not read, `Some(Some(text))` a Markdown page.
type Lookup<'a> = dyn Fn(&str) -> Option<Option<String>> + 'a;

#[test]
fn every_relative_link_and_anchor_resolves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages = BTreeMap::new();
    pages.insert("README.md".to_owned(), read(&root.join("README.md")));
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name.ends_with(".md") {
            pages.insert(format!("docs/{name}"), read(&root.join("docs").join(&name)));
        }
    }
    assert!(pages.len() >= 8, "{:?}", pages.keys());
    let on_disk = |path: &str| -> Option<Option<String>> {
        let p = root.join(path);
        if p.is_dir() {
            Some(None)
        } else if p.is_file() {
            Some(path.ends_with(".md").then(|| read(&p)))
        } else {
            None
        }
    };
    let links: usize = pages.values().map(|t| links(t).len()).sum();
    assert!(
        links > 60,
        "the scanner found almost no links: it is broken"
    );
    let dead = dead_links(&pages, &on_disk);
    assert!(dead.is_empty(), "dead links:\n{}", dead.join("\n"));
}

#[test]
fn a_missing_file_an_unknown_anchor_and_a_moved_heading_are_found() {
    let mut pages = BTreeMap::new();
    pages.insert(
        "README.md".to_owned(),
        "# Top\n\n[ok](docs/A.md#the-a-part) [gone](docs/B.md) [moved](docs/A.md#old-name)\n\
         [self](#top) [nope](#bottom) [out](https://example.com/x#y) `[code](nowhere.md)`\n\
         ```text\n[fenced](nowhere.md)\n```\n"
            .to_owned(),
    );
    pages.insert(
        "docs/A.md".to_owned(),
        "# A\n\n## The `a` part\n\n[up](../README.md#top) [dir](../docs/)\n".to_owned(),
    );
    let lookup = |path: &str| match path {
        "docs" => Some(None),
        p => pages.get(p).map(|t| Some(t.clone())),
    };
    let dead = dead_links(&pages, &lookup);
    assert_eq!(
        dead,
        [
            "README.md: docs/B.md (no such file)",
            "README.md: docs/A.md#old-name (no such heading in docs/A.md)",
            "README.md: #bottom (no such heading in README.md)",
        ]
    );
}

#[test]
fn slugs_are_github_s() {
    let headings = [
        "# `[server]`",
        "## Behaviour worth knowing (and deliberate choices)",
        "## Tracing: what export costs",
        "### Per principal",
        "## Who can send what",
        "## Who can send what",
        "## a — b",
    ];
    let slugs = slugs(&headings.join("\n"));
    let want = [
        "server",
        "behaviour-worth-knowing-and-deliberate-choices",
        "tracing-what-export-costs",
        "per-principal",
        "who-can-send-what",
        "who-can-send-what-1",
        "a--b",
    ];
    assert_eq!(slugs, want.iter().map(|s| (*s).to_owned()).collect());
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Each dead link of `pages` (path → text), as `page: target (why)`, in page order.
fn dead_links(pages: &BTreeMap<String, String>, lookup: &Lookup<'_>) -> Vec<String> {
    let mut dead = Vec::new();
    for (page, text) in pages {
        for target in links(text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let resolved = if path.is_empty() {
                Some(page.clone())
            } else {
                resolve(page, path)
            };
            let found = resolved.as_deref().and_then(lookup);
            let why = match (resolved, found) {
                (Some(_), Some(_)) if anchor.is_empty() => None,
                (Some(r), Some(Some(text))) => {
                    (!slugs(&text).contains(anchor)).then(|| format!("no such heading in {r}"))
                }
                (Some(r), Some(None)) => Some(format!("no such heading in {r}")),
                _ => Some("no such file".to_owned()),
            };
            if let Some(why) = why {
                dead.push(format!("{page}: {target} ({why})"));
            }
        }
    }
    dead
}

/// `target` relative to the directory of `page`, as a path from the repository root (no
/// trailing slash); `None` when it climbs out of the repository.
fn resolve(page: &str, target: &str) -> Option<String> {
    let mut parts: Vec<&str> = page.split('/').collect();
    parts.pop();
    for part in target.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            p => parts.push(p),
        }
    }
    Some(parts.join("/"))
}

/// The targets of the inline links (`[text](target)`, images too) of a Markdown text, outside
/// fenced blocks and code spans.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Code spans dropped: every other backtick-delimited piece.
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].split_whitespace().next().unwrap_or("");
            out.push(target.to_owned());
            rest = &after[end..];
        }
    }
    out
}

/// GitHub's anchor of every heading of a Markdown text (outside fenced blocks): lowercased,
/// punctuation dropped, each space a hyphen, `-1`, `-2` … after a repeated one.
fn slugs(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#');
        if !title.starts_with(' ') {
            continue;
        }
        let base: String = title
            .trim()
            .trim_end_matches('#')
            .trim()
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        let n = seen.entry(base.clone()).or_insert(0);
        let slug = if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        };
        *n += 1;
        out.insert(slug);
    }
    out
}
