//! The caller's say over what a reservation or cleanup may do to the pages.

/// What a reservation may do to the pages held to find room.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PageUpdate {
    /// Anything: a periodic cleanup runs first and may return idle pages,
    /// and a page is allocated when no room is held.
    #[default]
    Allow,
    /// Only add: no page is returned, so every page keeps its address, but
    /// a page is allocated when no room is held.
    AddOnly,
    /// Nothing: only room the pages already hold.
    Forbidden,
}

/// Why a cleanup runs, which decides how much it gives back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cleanup {
    /// On the way to a reservation (or on the service's idle serial): each
    /// pool returns what its own deallocation period says is idle, and
    /// outdated pages that emptied.
    Periodic,
    /// Asked for: every page nothing holds goes back, now.
    Explicit,
}
