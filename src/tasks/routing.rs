//! Task ids and where a request for a task goes: an id names the instance that created it,
//! and a request is served here, by the holder, or after adopting the task.

use super::adopt::Rerun;
use crate::error::ProxyError;

/// How a task's owner is named in its id: `<instance id>.<128 random bits>`.
pub(super) const ID_SEPARATOR: char = '.';

/// The instance that created task `id` (the part before the last separator), when it has one.
pub(crate) fn owner_of(id: &str) -> Option<&str> {
    id.rsplit_once(ID_SEPARATOR)
        .map(|(owner, _)| owner)
        .filter(|o| !o.is_empty())
}

/// An unknown task, an expired one and another principal's look the same (-32602).
pub(crate) fn unknown() -> ProxyError {
    ProxyError::InvalidParams("unknown or expired taskId".into())
}

/// Where a `tasks/*` request for a task is served.
#[derive(Debug)]
pub(crate) enum Route {
    /// This instance holds it (or nobody does: then it is unknown here).
    Here,
    /// Another instance holds it.
    Holder(String),
    /// This instance adopted it just now, and runs its replay-safe call again (then serves it).
    Rerun(Box<Rerun>),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_owner_is_everything_before_the_last_separator() {
        assert_eq!(owner_of("inst-1.abc"), Some("inst-1"));
        assert_eq!(owner_of("a.b.c"), Some("a.b"));
        assert_eq!(owner_of("nodot"), None);
        assert_eq!(owner_of(".abc"), None);
    }
}
