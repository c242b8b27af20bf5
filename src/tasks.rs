//! Tasks of the `io.modelcontextprotocol/tasks` extension, the persistent workflow of SEP-2322:
//! a `tools/call` that runs long is answered with a task the client polls (`tasks/get`), answers
//! (`tasks/update`) and may cancel (`tasks/cancel`) while the upstream call goes on.
//!
//! This module is the record of the tasks on this instance, between the front (which reads and
//! answers through it) and the call actor (which runs each task and writes its status): ids,
//! bounds, lifetime and the wire shapes. The actor hears the client only through [`Control`];
//! the front never sees the actor.

mod store;
mod view;

pub(crate) use store::{Control, TaskGuard, Tasks};
pub(crate) use view::Status;

/// How a task's owner is named in its id: `<instance id>.<128 random bits>`.
const ID_SEPARATOR: char = '.';

/// The instance that owns task `id` (the part before the last separator), when it has one.
pub(crate) fn owner_of(id: &str) -> Option<&str> {
    id.rsplit_once(ID_SEPARATOR)
        .map(|(owner, _)| owner)
        .filter(|o| !o.is_empty())
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
