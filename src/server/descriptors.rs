//! The file-descriptor limit, raised at start: every client connection, upstream connection and
//! stdio pipe is a descriptor, and the soft limit a process often starts with (1024) runs out
//! long before memory does. What the accept loops do once out of descriptors anyway is
//! `accept`'s.

/// The soft limit is raised at most this far: stdio children inherit it, and some programs
/// walk every possible descriptor (to close them before an exec), which a hard limit of a
/// billion turns into minutes.
const MAX_DESCRIPTORS: u64 = 1 << 20;

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (at most 2^20) and returns the limit the
/// proxy has then (`None` when it cannot be read). A limit that cannot be read or raised is a
/// warning, never fatal: the proxy serves within whatever limit it has (and sizes its bounds
/// to it: `Config::fit_descriptors`).
pub fn raise_descriptor_limit() -> Option<u64> {
    let before = match rlimit::getrlimit(rlimit::Resource::NOFILE) {
        Ok((soft, _)) => soft,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the file-descriptor limit");
            return None;
        }
    };
    match rlimit::increase_nofile_limit(MAX_DESCRIPTORS) {
        Ok(descriptors) => {
            tracing::info!(
                before,
                descriptors,
                "file-descriptor limit raised to the hard limit"
            );
            Some(descriptors)
        }
        Err(e) => {
            tracing::warn!(error = %e, descriptors = before, "file-descriptor limit not raised");
            Some(before)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Elsewhere (macOS) the kernel may cap the soft limit below a hard one that is unlimited.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_soft_limit_ends_at_the_hard_one_or_the_cap() {
        let raised = raise_descriptor_limit();
        let (soft, hard) = rlimit::getrlimit(rlimit::Resource::NOFILE).unwrap();
        assert_eq!(soft, hard.min(MAX_DESCRIPTORS));
        assert_eq!(raised, Some(soft));
    }
}
