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

pub(crate) use store::{owner_of, unknown, Control, TaskGuard, Tasks};
