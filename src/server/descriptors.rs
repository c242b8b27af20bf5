//! The file-descriptor limit, raised at start: every client connection, upstream connection and
//! stdio pipe is a descriptor, and the soft limit a process often starts with (1024) runs out
//! long before memory does. What the accept loops do once out of descriptors anyway is
//! `accept`'s.

/// Descriptors a parked call holds: its client's connection, and its upstream session's two
/// connections (the call's stream and the session's GET stream).
const DESCRIPTORS_PER_PARKED_CALL: u64 = 3;
/// The soft limit is raised at most this far: stdio children inherit it, and some programs
/// walk every possible descriptor (to close them before an exec), which a hard limit of a
/// billion turns into minutes.
const MAX_DESCRIPTORS: u64 = 1 << 20;

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (at most 2^20) and logs, once, the limit
/// and about how many parked calls it allows. A limit that cannot be read or raised is a
/// warning, never fatal: the proxy serves within whatever limit it has.
pub fn raise_descriptor_limit() {
    let before = match rlimit::getrlimit(rlimit::Resource::NOFILE) {
        Ok((soft, _)) => soft,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the file-descriptor limit");
            return;
        }
    };
    match rlimit::increase_nofile_limit(MAX_DESCRIPTORS) {
        Ok(descriptors) => tracing::info!(
            before,
            descriptors,
            parked_calls = descriptors / DESCRIPTORS_PER_PARKED_CALL,
            "file-descriptor limit raised to the hard limit (a parked call holds about three)"
        ),
        Err(e) => tracing::warn!(
            error = %e,
            descriptors = before,
            parked_calls = before / DESCRIPTORS_PER_PARKED_CALL,
            "file-descriptor limit not raised (a parked call holds about three)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Elsewhere (macOS) the kernel may cap the soft limit below a hard one that is unlimited.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_soft_limit_ends_at_the_hard_one_or_the_cap() {
        raise_descriptor_limit();
        let (soft, hard) = rlimit::getrlimit(rlimit::Resource::NOFILE).unwrap();
        assert_eq!(soft, hard.min(MAX_DESCRIPTORS));
    }
}
