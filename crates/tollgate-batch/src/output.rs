//! The output file: OpenAI Batch output lines, appended one per finished
//! item, and the resume scan of an existing file (SPEC BATCH-1, BATCH-3).
//!
//! Each line is written with one `write` of the whole line and its `\n`
//! on a file opened for appending, under a lock; no user-space buffer holds
//! it, so a finished line survives the process being killed (`--fsync`
//! also survives a power loss). A crash in the middle of a `write` can
//! leave only a last line without its `\n`: the resume scan cuts it off.
//! A write that fails (a full disk) is undone at once: the file is cut
//! back to its length before it, and the writer refuses every later line,
//! so no line can follow a fragment (another worker's, once space is
//! back) and the file resumes as it was.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One line of the output, in the OpenAI Batch output format, plus the
/// `tollgate` object this runner needs to resume (readers of the OpenAI
/// format ignore it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputLine {
    /// This result's id (`batch_req_` and a digest of the `custom_id`).
    pub id: String,
    /// The input line's `custom_id`.
    pub custom_id: String,
    /// The provider's HTTP answer, when there was one.
    pub response: Option<ResponseRecord>,
    /// Why the item failed, when it did.
    pub error: Option<ErrorRecord>,
    /// What the runner keeps to resume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tollgate: Option<Meta>,
}

/// `response` of an output line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResponseRecord {
    /// The HTTP status.
    pub status_code: u16,
    /// The provider's request id, when the client saw it.
    pub request_id: Option<String>,
    /// The response body (for an error status, an OpenAI error object).
    pub body: Value,
}

/// `error` of an output line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorRecord {
    /// The error class (see [`crate::ErrorClass`]).
    pub code: String,
    /// What happened (never a key or the prompt).
    pub message: String,
}

/// The runner's own fields of an output line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    /// The [`crate::input::request_hash`] of the request that produced it.
    pub input_hash: String,
    /// Attempts made.
    #[serde(default)]
    pub attempts: u32,
}

impl OutputLine {
    /// Whether the item failed (an `error`, or a response status of 400 or
    /// above).
    pub fn failed(&self) -> bool {
        self.error.is_some() || self.response.as_ref().is_some_and(|r| r.status_code >= 400)
    }
}

/// A result found in an existing output file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// Its 1-based line in the output.
    pub line: usize,
    /// The input hash it was made from, if recorded.
    pub input_hash: Option<String>,
    /// Whether it is a failure.
    pub failed: bool,
}

/// What an existing output file holds.
#[derive(Debug, Default)]
pub struct Existing {
    /// Results by `custom_id`.
    pub records: HashMap<String, Recorded>,
    /// Bytes of the torn last line that were cut off (0 if none).
    pub torn_bytes: u64,
    /// Length of the file's valid part.
    pub valid_len: u64,
}

/// An output file the runner cannot resume from.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// The file cannot be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: io::Error,
    },
    /// A complete line is not an output line (not a torn write: edited or
    /// not this runner's file).
    #[error(
        "{path}: line {line}: corrupt_output: not a batch output line ({reason}); fix or move the file"
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The 1-based line.
        line: usize,
        /// Why it was refused.
        reason: String,
    },
    /// Another run holds the output's lock (two runs appending to one
    /// output would send and record every item twice).
    #[error(
        "{path}: output_in_use: another run is writing this output (its lock {lock} is held); wait for it to end or stop it"
    )]
    InUse {
        /// The output file.
        path: PathBuf,
        /// The lock file.
        lock: PathBuf,
    },
    /// The output file was removed or replaced while the run wrote it: the
    /// lines written since are not in the file at `path`.
    #[error(
        "{path}: output_replaced: the file was removed or replaced during the run; results written since are not in it (re-run to resume from what the file holds)"
    )]
    Replaced {
        /// The output file.
        path: PathBuf,
    },
    /// Appending a line failed (e.g. the disk is full). The file was cut
    /// back to its length before the line, unless `restored` is false (the
    /// resume scan then cuts the fragment off).
    #[error("{path}: {source}{}", if *restored { "; the line was not written" } else { "; a fragment of the line may remain at the end (the next run cuts it off)" })]
    WriteFailed {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: io::Error,
        /// Whether the file is back at its length before the line.
        restored: bool,
    },
    /// An earlier append failed: the writer takes no more lines (one
    /// after a fragment would be glued to it).
    #[error(
        "{path}: output_closed: an earlier line could not be written ({first}); no line is written after it"
    )]
    Closed {
        /// The file.
        path: PathBuf,
        /// The first failure.
        first: String,
    },
    /// Two lines for one `custom_id`.
    #[error(
        "{path}: line {line}: duplicate_output: custom_id `{custom_id}` already has a result on line {first}"
    )]
    Duplicate {
        /// The file.
        path: PathBuf,
        /// The second line.
        line: usize,
        /// The first line.
        first: usize,
        /// The id.
        custom_id: String,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> OutputError + '_ {
    move |source| OutputError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Reads `path` (a missing file is empty). With `repair`, a torn last line
/// (bytes after the last `\n`) is cut off the file; without it the file is
/// only read.
///
/// # Errors
/// I/O errors, a complete line that is not an output line, or two lines
/// for one `custom_id`.
pub fn scan(path: &Path, repair: bool) -> Result<Existing, OutputError> {
    let data = match std::fs::read(path) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Existing::default()),
        Err(e) => return Err(io_err(path)(e)),
    };
    let existing = parse_existing(&data, path)?;
    if repair && existing.torn_bytes > 0 {
        let file = OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(io_err(path))?;
        file.set_len(existing.valid_len).map_err(io_err(path))?;
        file.sync_all().map_err(io_err(path))?;
    }
    Ok(existing)
}

/// What the contents `data` of the output file `path` hold (see [`scan`];
/// `path` only names the file in errors).
///
/// # Errors
/// A complete line that is not an output line, or two lines for one
/// `custom_id`.
pub fn parse_existing(data: &[u8], path: &Path) -> Result<Existing, OutputError> {
    let valid_len = data.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let mut existing = Existing {
        records: HashMap::new(),
        torn_bytes: (data.len() - valid_len) as u64,
        valid_len: valid_len as u64,
    };
    let complete = data.get(..valid_len).unwrap_or_default();
    for (index, raw) in complete.split(|&b| b == b'\n').enumerate() {
        let line = index + 1;
        if raw.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let parsed: OutputLine = serde_json::from_slice(raw).map_err(|e| OutputError::Corrupt {
            path: path.to_owned(),
            line,
            reason: e.to_string(),
        })?;
        let failed = parsed.failed();
        let record = Recorded {
            line,
            input_hash: parsed.tollgate.map(|m| m.input_hash),
            failed,
        };
        if let Some(first) = existing.records.get(&parsed.custom_id) {
            return Err(OutputError::Duplicate {
                path: path.to_owned(),
                line,
                first: first.line,
                custom_id: crate::input::printable(&parsed.custom_id),
            });
        }
        existing.records.insert(parsed.custom_id, record);
    }
    Ok(existing)
}

/// Rewrites `path` without the lines of the ids in `drop` (so that they
/// can be run again and still have one line each). The new file is written
/// next to it, synced and renamed over it: a crash leaves the old file or
/// the new one, never a mix. The name is resolved first, as the lock's is
/// ([`OutputLock`]): through a symbolic link the file it names is
/// rewritten (the new one written in that file's directory, with its
/// permissions) and the link stays a link.
///
/// # Errors
/// I/O errors.
pub fn remove_records(
    path: &Path,
    drop: &std::collections::HashSet<String>,
) -> Result<(), OutputError> {
    let path = &resolved(path).map_err(io_err(path))?;
    let data = std::fs::read(path).map_err(io_err(path))?;
    let permissions = std::fs::metadata(path).map_err(io_err(path))?.permissions();
    let mut kept = Vec::with_capacity(data.len());
    for raw in data.split_inclusive(|&b| b == b'\n') {
        let id = serde_json::from_slice::<IdOnly>(raw.trim_ascii_end())
            .ok()
            .map(|l| l.custom_id);
        if id.is_some_and(|id| drop.contains(&id)) {
            continue;
        }
        kept.extend_from_slice(raw);
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tollgate-tmp");
    let tmp = PathBuf::from(tmp);
    {
        let mut f = File::create(&tmp).map_err(io_err(&tmp))?;
        f.set_permissions(permissions).map_err(io_err(&tmp))?;
        f.write_all(&kept).map_err(io_err(&tmp))?;
        f.sync_all().map_err(io_err(&tmp))?;
    }
    std::fs::rename(&tmp, path).map_err(io_err(path))?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && let Ok(d) = File::open(dir)
    {
        let _ = d.sync_all();
    }
    Ok(())
}

#[derive(Deserialize)]
struct IdOnly {
    custom_id: String,
}

/// The lock of one output, held for a whole run: `<output>.lock`, created
/// next to the output and locked exclusively (`flock`; the kernel drops it
/// when the process ends, however it ends). The file itself stays. The
/// output's name is resolved first (symbolic links, `..`), so every name
/// of one file that goes through links shares one lock; a second hard link
/// to the output is a name of its own and is not covered.
#[derive(Debug)]
pub struct OutputLock {
    _file: File,
}

impl OutputLock {
    /// Takes the lock of `output`, without waiting.
    ///
    /// # Errors
    /// [`OutputError::InUse`] when another run (in this process or another)
    /// holds it; I/O errors creating the lock file.
    pub fn take(output: &Path) -> Result<Self, OutputError> {
        let mut name = resolved(output).map_err(io_err(output))?.into_os_string();
        name.push(".lock");
        let lock = PathBuf::from(name);
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock)
            .map_err(io_err(&lock))?;
        match file.try_lock() {
            Ok(()) => Ok(OutputLock { _file: file }),
            Err(std::fs::TryLockError::WouldBlock) => Err(OutputError::InUse {
                path: output.to_owned(),
                lock,
            }),
            Err(std::fs::TryLockError::Error(e)) => Err(io_err(&lock)(e)),
        }
    }
}

/// `path` with its links resolved: the file's own if it exists, else its
/// directory's joined with its name. A symbolic link to a file that does
/// not exist yet is followed by hand (the output is created through it),
/// so it resolves to the name the file will have.
fn resolved(path: &Path) -> io::Result<PathBuf> {
    let mut path = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        match std::fs::canonicalize(&path) {
            Ok(p) => return Ok(p),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
                    // A relative target is relative to the link's folder; an
                    // absolute one replaces the whole path.
                    let target = std::fs::read_link(&path)?;
                    path = match path.parent() {
                        Some(dir) => dir.join(target),
                        None => target,
                    };
                    continue;
                }
                let name = path.file_name().ok_or(e)?;
                let dir = match path.parent() {
                    Some(d) if !d.as_os_str().is_empty() => d,
                    _ => Path::new("."),
                };
                return Ok(std::fs::canonicalize(dir)?.join(name));
            }
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::other("too many levels of symbolic links"))
}

/// The most symbolic links [`resolved`] follows by hand (Linux's own
/// bound).
const MAX_LINKS: usize = 40;

/// Appends output lines, one `write` per line.
#[derive(Debug)]
pub struct OutputWriter {
    state: Mutex<WriterState>,
    path: PathBuf,
    fsync: bool,
}

/// The file and whether an append has failed, under one lock: every
/// append reads the length, writes and (on failure) cuts back under it.
#[derive(Debug)]
struct WriterState {
    file: File,
    /// The first failed append's error; once set, nothing more is written.
    failed: Option<String>,
}

impl OutputWriter {
    /// Opens `path` for appending (created if missing).
    ///
    /// # Errors
    /// I/O errors.
    pub fn open(path: &Path, fsync: bool) -> Result<Self, OutputError> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(io_err(path))?;
        Ok(OutputWriter {
            state: Mutex::new(WriterState { file, failed: None }),
            path: path.to_owned(),
            fsync,
        })
    }

    /// Appends one line and hands it to the kernel (and to the disk with
    /// `fsync`) before returning. A write (or sync) that fails cuts the
    /// file back to its length before the line, and every later append is
    /// refused.
    ///
    /// # Errors
    /// [`OutputError::WriteFailed`] when the line could not be written,
    /// [`OutputError::Closed`] after such a failure, [`OutputError::Replaced`]
    /// when the path no longer names the file; other I/O errors.
    pub fn append(&self, line: &OutputLine) -> Result<(), OutputError> {
        let mut buf = serde_json::to_vec(line).map_err(|e| OutputError::Io {
            path: self.path.clone(),
            source: io::Error::other(e),
        })?;
        buf.push(b'\n');
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(first) = &state.failed {
            return Err(OutputError::Closed {
                path: self.path.clone(),
                first: first.clone(),
            });
        }
        let result = self.write_line(&mut state.file, &buf);
        if let Err(e) = &result {
            state.failed = Some(e.to_string());
        }
        result
    }

    /// One line, cut off again if it cannot be written whole.
    fn write_line(&self, file: &mut File, buf: &[u8]) -> Result<(), OutputError> {
        // Only this writer appends (the output's lock), so the length read
        // here is where the line starts.
        let before = file.metadata().map_err(io_err(&self.path))?.len();
        let written = file
            .write_all(buf)
            .and_then(|()| if self.fsync { file.sync_data() } else { Ok(()) });
        if let Err(source) = written {
            let restored = file
                .set_len(before)
                .and_then(|()| if self.fsync { file.sync_data() } else { Ok(()) })
                .is_ok();
            return Err(OutputError::WriteFailed {
                path: self.path.clone(),
                source,
                restored,
            });
        }
        self.still_there(file)
    }

    /// Checks that the output's path still names the file written to (one
    /// `stat` of each).
    ///
    /// # Errors
    /// [`OutputError::Replaced`] when the file was removed, renamed away or
    /// replaced; I/O errors.
    pub fn verify(&self) -> Result<(), OutputError> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.still_there(&state.file)
    }

    fn still_there(&self, file: &File) -> Result<(), OutputError> {
        let written = file.metadata().map_err(io_err(&self.path))?;
        let named = match std::fs::metadata(&self.path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(OutputError::Replaced {
                    path: self.path.clone(),
                });
            }
            Err(e) => return Err(io_err(&self.path)(e)),
        };
        if same_file(&written, &named) {
            Ok(())
        } else {
            Err(OutputError::Replaced {
                path: self.path.clone(),
            })
        }
    }
}

#[cfg(unix)]
fn same_file(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    a.dev() == b.dev() && a.ino() == b.ino()
}

/// Elsewhere only a removed file is noticed.
#[cfg(not(unix))]
fn same_file(_: &std::fs::Metadata, _: &std::fs::Metadata) -> bool {
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    // proves: BATCH-3 (one lock per output, whatever name reaches it: a
    // symbolic link to an output that does not exist yet, direct, chained
    // or relative, takes the lock of the file it will create). Found by a
    // review: such a link was locked under its own name, two runs wrote
    // one file and every result was recorded twice.
    #[cfg(unix)]
    #[test]
    fn a_link_to_an_output_not_yet_made_shares_its_lock() {
        use std::os::unix::fs::symlink;
        let dir = std::env::temp_dir().join(format!("tollgate-lock-links-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sub")).expect("mkdir");
        let real = dir.join("sub").join("real.jsonl");
        symlink(&real, dir.join("abs.jsonl")).expect("ln -s");
        symlink("sub/real.jsonl", dir.join("rel.jsonl")).expect("ln -s");
        symlink("rel.jsonl", dir.join("chain.jsonl")).expect("ln -s");
        for name in ["abs.jsonl", "rel.jsonl", "chain.jsonl"] {
            let held = OutputLock::take(&dir.join(name)).expect("the first lock");
            let second = OutputLock::take(&real);
            assert!(
                matches!(second, Err(OutputError::InUse { .. })),
                "{name}: the real name took a second lock: {second:?}"
            );
            drop(held);
            OutputLock::take(&real).expect("free again once dropped");
        }
        assert!(!real.exists(), "taking a lock creates no output");
        symlink("loop.jsonl", dir.join("loop.jsonl")).expect("ln -s");
        assert!(
            OutputLock::take(&dir.join("loop.jsonl")).is_err(),
            "a loop is an error"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn line(id: &str, failed: bool) -> OutputLine {
        OutputLine {
            id: format!("batch_req_{id}"),
            custom_id: id.to_owned(),
            response: Some(ResponseRecord {
                status_code: if failed { 400 } else { 200 },
                request_id: None,
                body: serde_json::json!({"ok": true}),
            }),
            error: None,
            tollgate: Some(Meta {
                input_hash: format!("sha256:{id}"),
                attempts: 1,
            }),
        }
    }

    // proves: BATCH-3 (a torn last line is cut off, finished lines are kept)
    #[test]
    fn torn_last_line_is_cut_and_failures_can_be_removed() {
        let dir = std::env::temp_dir().join(format!("tollgate-batch-out-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("out.jsonl");
        let _ = std::fs::remove_file(&path);
        let w = OutputWriter::open(&path, false).expect("open");
        w.append(&line("a", false)).expect("a");
        w.append(&line("b", true)).expect("b");
        drop(w);
        let mut f = OpenOptions::new().append(true).open(&path).expect("open");
        f.write_all(br#"{"id":"batch_req_c","custom_id":"#)
            .expect("torn");
        drop(f);

        let read_only = scan(&path, false).expect("scan");
        assert!(read_only.torn_bytes > 0);
        let before = std::fs::metadata(&path).expect("meta").len();
        assert!(before > read_only.valid_len);

        let e = scan(&path, true).expect("scan");
        assert_eq!(e.records.len(), 2);
        assert!(!e.records["a"].failed);
        assert!(e.records["b"].failed);
        assert_eq!(std::fs::metadata(&path).expect("meta").len(), e.valid_len);

        let drop: std::collections::HashSet<String> = ["b".to_owned()].into();
        remove_records(&path, &drop).expect("rewrite");
        let e = scan(&path, false).expect("scan");
        assert_eq!(e.records.keys().collect::<Vec<_>>(), vec!["a"]);
        assert_eq!(e.torn_bytes, 0);

        std::fs::write(&path, b"{\"nope\":1}\n").expect("write");
        assert!(matches!(
            scan(&path, true),
            Err(OutputError::Corrupt { line: 1, .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
