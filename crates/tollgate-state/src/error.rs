//! Why the state file could not be used.

use std::path::PathBuf;

/// Why the state file could not be opened, read or written.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The state directory could not be created or entered.
    #[error("state directory {path}: {source}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file exists but is not a state file this version can read
    /// (damaged, not a database, written by a newer version, unreadable
    /// permissions): located by its path and, for a bad row, the row.
    #[error("state file {path}: {reason}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// What is wrong, and where.
        reason: String,
    },
    /// Another process holds the state directory (one process per
    /// directory), or another program holds the file locked: it is left
    /// as it is, whatever `on_unreadable_state` says.
    #[error(
        "state file {path}: in use by another process (one tollgate process per state directory)"
    )]
    InUse {
        /// The file.
        path: PathBuf,
    },
    /// Writing the saved state failed (disk full, I/O error).
    #[error("state file {path}: cannot write: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: rusqlite::Error,
    },
}
