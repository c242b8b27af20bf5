//! A table keyed by tool name or glob (`delete_*`), as `[auth.scopes]` is written: exact names
//! win over globs, and among globs the longer (more specific) pattern wins.

use super::error::{invalid, ConfigError};

/// Values keyed by tool name or glob.
#[derive(Debug, Clone)]
pub struct ToolTable<T> {
    entries: Vec<(String, Option<glob::Pattern>, T)>,
}

impl<T> Default for ToolTable<T> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
        }
    }
}

impl<T> ToolTable<T> {
    /// The table of `entries` (pattern → value); `key` names the table in errors.
    pub(super) fn new(
        key: &'static str,
        entries: impl IntoIterator<Item = (String, T)>,
    ) -> Result<Self, ConfigError> {
        let mut entries = entries
            .into_iter()
            .map(|(pattern, value)| {
                let glob = if pattern.contains(['*', '?', '[']) {
                    let g = glob::Pattern::new(&pattern)
                        .map_err(|e| invalid(key, format!("`{pattern}`: {e}")))?;
                    Some(g)
                } else {
                    None
                };
                Ok((pattern, glob, value))
            })
            .collect::<Result<Vec<_>, ConfigError>>()?;
        entries.sort_by_key(|(p, g, _)| (g.is_some(), std::cmp::Reverse(p.len())));
        Ok(Self { entries })
    }

    /// The value for `tool`, if a name or glob matches it.
    pub fn get(&self, tool: &str) -> Option<&T> {
        self.entries
            .iter()
            .find(|(p, g, _)| g.as_ref().map_or(p == tool, |g| g.matches(tool)))
            .map(|(_, _, v)| v)
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_names_win_then_longer_globs() {
        let t = ToolTable::new(
            "t",
            [
                ("*".to_owned(), 1),
                ("delete_*".to_owned(), 2),
                ("delete_all".to_owned(), 3),
            ],
        )
        .unwrap();
        assert_eq!(t.get("delete_all"), Some(&3));
        assert_eq!(t.get("delete_one"), Some(&2));
        assert_eq!(t.get("read"), Some(&1));
        assert!(ToolTable::new("t", [("[".to_owned(), 0)]).is_err());
    }
}
