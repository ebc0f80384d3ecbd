//! The state file: open (checked), restore, save.
//!
//! One process per state directory, enforced: [`StateFile::open`] takes an
//! exclusive lock on `<dir>/tollgate-state.lock` (held until the file is
//! dropped) and refuses with [`StateError::InUse`] while another process
//! holds it; a database another program keeps locked is in use too, never
//! moved aside as unreadable. Each [`StateFile::save`] writes, in one
//! transaction, the scopes whose count changed since the last save (the
//! first save after [`StateFile::rewrite_all`] rewrites the whole table).
//! A scope the running configuration leaves out keeps its rows while they
//! still count something, so a later run that configures it again counts
//! what was spent; a full rewrite drops it once nothing of it counts. WAL mode with `synchronous =
//! NORMAL`: a committed save survives the process being killed; a power
//! loss may also lose the last saves before the OS wrote them out.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use rusqlite::{Connection, OpenFlags, params};
use tollgate::AdmissionController;
use tollgate::config::Limit;
use tollgate::quota::{Counted, SavedLimit, SavedScope};

use crate::codec::{Decoded, Row, decode, encode};
use crate::error::StateError;

/// The file's name in the state directory.
pub const FILE_NAME: &str = "tollgate-state.sqlite3";

/// The lock file's name in the state directory: the process that holds
/// its lock owns the directory.
pub const LOCK_NAME: &str = "tollgate-state.lock";

/// The schema this version writes (`PRAGMA user_version`).
const SCHEMA: i64 = 1;

const CREATE: &str = "CREATE TABLE counted (
    owner TEXT NOT NULL,
    scope TEXT NOT NULL,
    dimension TEXT NOT NULL,
    amount INTEGER NOT NULL,
    window_ns INTEGER NOT NULL,
    period TEXT,
    zone TEXT,
    counted TEXT NOT NULL
);
CREATE INDEX counted_scope ON counted (owner, scope);";

/// The limits whose state is kept: every cost limit, windows of one hour
/// or longer and every calendar window (SPEC DQ-8). Shorter windows of
/// other dimensions refill within minutes of a restart; keeping them would
/// cost a write per call for nothing.
pub fn keep(limit: &Limit) -> bool {
    limit.dimension.is_cost()
        || limit.calendar.is_some()
        || limit.window >= Duration::from_secs(3_600)
}

/// What to do with a state file that cannot be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnUnreadable {
    /// Refuse to start (the default): an operator decides.
    #[default]
    Refuse,
    /// Move it aside (`<file>.unreadable-<unix seconds>`) and start with
    /// no saved state.
    StartEmpty,
}

type Key = (String, String);

/// What this process last wrote, held by a save from start to end.
#[derive(Debug, Default)]
struct Written {
    /// The store version last written of each (owner, scope).
    versions: HashMap<Key, u64>,
}

/// An open state file.
#[derive(Debug)]
pub struct StateFile {
    path: PathBuf,
    conn: Mutex<Connection>,
    /// How many scopes the file held when opened.
    loaded: usize,
    /// What the file holds of each (owner, scope): what it held when
    /// opened, as this process has written it since. Locked only to read
    /// or update it, never across a write: a reload's restore never waits
    /// for the disk.
    on_disk: Mutex<BTreeMap<Key, SavedScope>>,
    /// What was last written; held by a save from start to end (one save
    /// at a time).
    written: Mutex<Written>,
    /// The next save rewrites everything.
    full: AtomicBool,
    /// The directory's lock, held while the file is open (`None` where
    /// the file system has no locks).
    _lock: Option<std::fs::File>,
    /// The limits saved and restored ([`keep`] unless
    /// [`keeping`](Self::keeping) says otherwise).
    keep: fn(&Limit) -> bool,
}

impl StateFile {
    /// Opens (or creates) the state file in `dir`, creating `dir`, and
    /// reads it whole. A file that is not a readable state file is an
    /// [`StateError::Unreadable`] naming it, unless `on_unreadable` says
    /// to start empty (it is then moved aside, with a warning).
    pub fn open(dir: &Path, on_unreadable: OnUnreadable) -> Result<StateFile, StateError> {
        std::fs::create_dir_all(dir).map_err(|source| StateError::Dir {
            path: dir.to_path_buf(),
            source,
        })?;
        let path = dir.join(FILE_NAME);
        // Before anything is read or moved: the directory is this
        // process's, or it is left alone.
        let lock = lock(dir, &path)?;
        let opened = match Self::open_at(&path) {
            Err(StateError::Unreadable { reason, .. })
                if on_unreadable == OnUnreadable::StartEmpty =>
            {
                let aside = set_aside(&path).map_err(|source| StateError::Dir {
                    path: dir.to_path_buf(),
                    source,
                })?;
                tracing::warn!(
                    file = %path.display(),
                    moved_to = %aside.display(),
                    reason,
                    "unreadable state file moved aside; starting with no saved quota state"
                );
                Self::open_at(&path)
            }
            other => other,
        };
        opened.map(|file| StateFile {
            _lock: lock,
            ..file
        })
    }

    fn open_at(path: &Path) -> Result<StateFile, StateError> {
        let unreadable = |reason: String| StateError::Unreadable {
            path: path.to_path_buf(),
            reason,
        };
        // Locked by another program (busy past the timeout): in use, not
        // damaged.
        let sqlite = |e: rusqlite::Error| match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
                StateError::InUse {
                    path: path.to_path_buf(),
                }
            }
            _ => unreadable(e.to_string()),
        };
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags).map_err(sqlite)?;
        conn.busy_timeout(Duration::from_secs(5)).map_err(sqlite)?;
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(sqlite)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(unreadable(format!("cannot use WAL mode (got {mode})")));
        }
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(sqlite)?;
        let check: String = conn
            .query_row("PRAGMA quick_check", [], |r| r.get(0))
            .map_err(sqlite)?;
        if check != "ok" {
            return Err(unreadable(format!("damaged: {check}")));
        }
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(sqlite)?;
        match version {
            0 => {
                conn.execute_batch(CREATE)
                    .and_then(|()| conn.pragma_update(None, "user_version", SCHEMA))
                    .map_err(|e| match sqlite(e) {
                        StateError::Unreadable { reason, .. } => {
                            unreadable(format!("cannot create its table: {reason}"))
                        }
                        in_use => in_use,
                    })?;
            }
            SCHEMA => {}
            newer => {
                return Err(unreadable(format!(
                    "schema {newer} (this version reads {SCHEMA}): written by another tollgate version"
                )));
            }
        }
        let loaded = load(&conn).map_err(|e| match e {
            Bad::Sql(e) => sqlite(e),
            Bad::Row(reason) => unreadable(reason),
        })?;
        Ok(StateFile {
            path: path.to_path_buf(),
            conn: Mutex::new(conn),
            written: Mutex::new(Written {
                versions: HashMap::new(),
            }),
            loaded: loaded.len(),
            on_disk: Mutex::new(loaded),
            full: AtomicBool::new(true),
            _lock: None,
            keep,
        })
    }

    /// Saves and restores only the limits `keep` selects (by default
    /// [`keep`]): a limit that belongs to one run (the batch runner's
    /// `--budget`) is neither written nor read back, whatever an earlier
    /// version wrote.
    #[must_use]
    pub fn keeping(self, keep: fn(&Limit) -> bool) -> Self {
        StateFile { keep, ..self }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many scopes the file held when opened.
    pub fn loaded_scopes(&self) -> usize {
        self.loaded
    }

    /// Counts in `controller` what the file holds for `owner`'s scopes now:
    /// what it held when opened, as this process has written it since (see
    /// [`AdmissionController::restore_quota`]); returns how many scopes
    /// counted something. Scopes the controller lacks, or keeps in a
    /// shared store, take nothing. At start every controller is restored;
    /// after a reload only the new ones (a tenant or scope added back
    /// finds what the file kept of it).
    pub fn restore(&self, owner: &str, controller: &AdmissionController) -> usize {
        self.restore_where(owner, controller, |_| true)
    }

    /// [`restore`](Self::restore) of the scopes `wanted` names only (after
    /// a reload: the scopes a running controller was given by it).
    pub fn restore_where(
        &self,
        owner: &str,
        controller: &AdmissionController,
        wanted: impl Fn(&str) -> bool,
    ) -> usize {
        let on_disk = self.on_disk.lock();
        on_disk
            .range((owner.to_owned(), String::new())..)
            .take_while(|((o, _), _)| o == owner)
            .filter(|((_, scope), _)| wanted(scope))
            .filter(|((_, scope), saved)| {
                let kept;
                let saved = if saved.limits.iter().all(|l| (self.keep)(&l.limit)) {
                    *saved
                } else {
                    kept = SavedScope {
                        limits: (saved.limits.iter())
                            .filter(|l| (self.keep)(&l.limit))
                            .cloned()
                            .collect(),
                    };
                    &kept
                };
                controller.restore_quota(scope, saved)
            })
            .count()
    }

    /// The next [`save`](Self::save) rewrites the whole file (after a
    /// reload: scopes may have gone, controllers may be new).
    pub fn rewrite_all(&self) {
        self.full.store(true, Ordering::SeqCst);
    }

    /// Writes, in one transaction, what the kept limits ([`keep`]) of the
    /// in-process scopes of `owners` count now, skipping scopes unchanged
    /// since their last save. Returns how many scopes were written. On
    /// error nothing of this save is written and the next one rewrites
    /// everything.
    ///
    /// A full rewrite (the first save, the first after
    /// [`rewrite_all`](Self::rewrite_all) or an error) also keeps what the
    /// file holds of scopes none of `owners` saved (no longer configured,
    /// kept in a shared store now) while it still counts something at the
    /// earliest time the owners' clocks read: a later run that configures
    /// them again counts it. What counts nothing is dropped.
    pub fn save(&self, owners: &[(&str, &AdmissionController)]) -> Result<usize, StateError> {
        let full = self.full.swap(false, Ordering::SeqCst);
        let mut written = self.written.lock();
        if full {
            written.versions.clear();
        }
        let mut changed = Vec::new();
        for (owner, controller) in owners {
            let unchanged = |scope: &str, version: u64| {
                written
                    .versions
                    .get(&((*owner).to_owned(), scope.to_owned()))
                    .is_some_and(|v| *v == version)
            };
            for saved in controller.save_quota(self.keep, &unchanged) {
                changed.push(((*owner).to_owned(), saved));
            }
        }
        if !full && changed.is_empty() {
            return Ok(0);
        }
        let (kept, dropped) = if full {
            let now = owners
                .iter()
                .map(|(_, c)| c.wall().utc(c.clock().now()))
                .min()
                .unwrap_or_else(SystemTime::now);
            let saving: HashSet<(&str, &str)> = changed
                .iter()
                .map(|(o, s)| (o.as_str(), s.scope.as_str()))
                .collect();
            let on_disk = self.on_disk.lock();
            let (kept, dropped): (Vec<_>, Vec<_>) = on_disk
                .iter()
                .filter(|((o, s), _)| !saving.contains(&(o.as_str(), s.as_str())))
                .partition(|(_, saved)| counts_something(saved, now));
            let kept: Vec<(Key, SavedScope)> = kept
                .into_iter()
                .map(|(k, s)| (k.clone(), s.clone()))
                .collect();
            let dropped: Vec<Key> = dropped.into_iter().map(|(k, _)| k.clone()).collect();
            (kept, dropped)
        } else {
            (Vec::new(), Vec::new())
        };
        let result = self.write(full, &kept, &changed);
        if let Err(e) = result {
            self.full.store(true, Ordering::SeqCst);
            return Err(StateError::Write {
                path: self.path.clone(),
                source: e,
            });
        }
        let mut on_disk = self.on_disk.lock();
        for key in dropped {
            on_disk.remove(&key);
        }
        for (owner, saved) in changed.iter() {
            let key = (owner.clone(), saved.scope.clone());
            written.versions.insert(key.clone(), saved.version);
            on_disk.insert(key, saved.state.clone());
        }
        Ok(changed.len())
    }

    fn write(
        &self,
        full: bool,
        kept: &[(Key, SavedScope)],
        changed: &[(String, tollgate::SavedQuota)],
    ) -> Result<(), rusqlite::Error> {
        let mut conn = self.conn.lock();
        let tx = conn.transaction()?;
        if full {
            tx.execute("DELETE FROM counted", [])?;
        }
        {
            let mut delete = tx.prepare("DELETE FROM counted WHERE owner = ?1 AND scope = ?2")?;
            let mut insert = tx.prepare(
                "INSERT INTO counted (owner, scope, dimension, amount, window_ns, period, zone, counted)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )?;
            let rows = kept
                .iter()
                .map(|((owner, scope), state)| (owner, scope, state))
                .chain(changed.iter().map(|(o, s)| (o, &s.scope, &s.state)));
            for (owner, scope, state) in rows {
                if !full {
                    delete.execute(params![owner, scope])?;
                }
                for limit in &state.limits {
                    let r = encode(limit);
                    insert.execute(params![
                        owner,
                        scope,
                        r.dimension,
                        r.amount,
                        r.window_ns,
                        r.period,
                        r.zone,
                        r.counted
                    ])?;
                }
            }
        }
        tx.commit()
    }
}

/// Whether a saved scope still counts something at `now` (UTC): worth
/// keeping for a run that configures it again.
fn counts_something(saved: &SavedScope, now: SystemTime) -> bool {
    saved.limits.iter().any(|l| !counts_nothing(l, now))
}

/// Whether a saved limit counts nothing any more at `now`: a window's
/// amounts all expired, or a bucket refilled at its saved rate since.
fn counts_nothing(saved: &SavedLimit, now: SystemTime) -> bool {
    match saved.counted {
        Counted::Taken { at, taken } => {
            let elapsed = now.duration_since(at).unwrap_or_default().as_nanos();
            let window = saved.limit.window.as_nanos().max(1);
            let refilled = elapsed.saturating_mul(u128::from(saved.limit.amount)) / window;
            refilled >= u128::from(taken)
        }
        _ => saved.counted.is_spent(now),
    }
}

/// Why the rows could not be read.
enum Bad {
    /// SQLite said no (damaged, or busy).
    Sql(rusqlite::Error),
    /// A row, located, that does not parse.
    Row(String),
}

/// Every row, by (owner, scope); a malformed row is an error naming it.
fn load(conn: &Connection) -> Result<BTreeMap<Key, SavedScope>, Bad> {
    let mut stmt = conn
        .prepare(
            "SELECT rowid, owner, scope, dimension, amount, window_ns, period, zone, counted
             FROM counted ORDER BY rowid",
        )
        .map_err(Bad::Sql)?;
    let rows = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                Row {
                    dimension: r.get(3)?,
                    amount: r.get(4)?,
                    window_ns: r.get(5)?,
                    period: r.get(6)?,
                    zone: r.get(7)?,
                    counted: r.get(8)?,
                },
            ))
        })
        .map_err(Bad::Sql)?;
    let mut out: BTreeMap<Key, SavedScope> = BTreeMap::new();
    for row in rows {
        let (rowid, owner, scope, row) = row.map_err(|e| match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
                Bad::Sql(e)
            }
            _ => Bad::Row(format!("table counted: {e}")),
        })?;
        match decode(&row) {
            Ok(Decoded::Limit(limit)) => out.entry((owner, scope)).or_default().limits.push(limit),
            Ok(Decoded::Unknown(what)) => {
                tracing::warn!(
                    rowid,
                    owner,
                    scope,
                    what,
                    "saved state of an unknown kind ignored"
                );
            }
            Err(why) => {
                return Err(Bad::Row(format!(
                    "table counted, row {rowid} (owner {owner:?}, scope {scope:?}, {}): {why}",
                    row.dimension
                )));
            }
        }
    }
    Ok(out)
}

/// Takes the lock of the state directory `dir` (the file `path` in it):
/// [`StateError::InUse`] while another process holds it. A file system
/// without locks is used unlocked, with a warning.
fn lock(dir: &Path, path: &Path) -> Result<Option<std::fs::File>, StateError> {
    let lock_path = dir.join(LOCK_NAME);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|source| StateError::Dir {
            path: dir.to_path_buf(),
            source,
        })?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Err(StateError::InUse {
            path: path.to_path_buf(),
        }),
        Err(std::fs::TryLockError::Error(e)) if e.kind() == std::io::ErrorKind::Unsupported => {
            tracing::warn!(
                file = %lock_path.display(),
                "the file system cannot lock the state directory; make sure one process uses it"
            );
            Ok(None)
        }
        Err(std::fs::TryLockError::Error(source)) => Err(StateError::Dir {
            path: dir.to_path_buf(),
            source,
        }),
    }
}

/// Moves `path` and its WAL companions aside; returns the new name.
fn set_aside(path: &Path) -> std::io::Result<PathBuf> {
    let secs = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let aside = PathBuf::from(format!("{}.unreadable-{secs}", path.display()));
    std::fs::rename(path, &aside)?;
    for companion in ["-wal", "-shm"] {
        let from = PathBuf::from(format!("{}{companion}", path.display()));
        if from.exists() {
            std::fs::rename(&from, format!("{}{companion}", aside.display()))?;
        }
    }
    Ok(aside)
}
