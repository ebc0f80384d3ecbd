//! Input that cannot be read twice (a pipe, a FIFO, `/dev/stdin`): read
//! once, copied to an unnamed temporary file as it is validated, and read
//! back from there by offset (SPEC BATCH-1, BATCH-3).
//!
//! A queued item is its line's offset, estimate and hash; a worker reads
//! its body again when it takes it. A regular file is opened again by its
//! path for that (an input edited during the run then stops it); a pipe
//! holds nothing any more once read, so its bytes go to the spool instead
//! and the run reads them from there. Memory stays bounded as with a file.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// An unnamed temporary file holding a copy of the input.
pub(crate) struct Spool {
    file: File,
    /// Where it lies while it has a name (removed on drop; on Unix it is
    /// unlinked at once and this is `None`).
    named: Option<PathBuf>,
    /// The first error writing it.
    error: Option<io::Error>,
}

impl Spool {
    /// A new empty spool in `dir` (the system's temporary directory).
    ///
    /// # Errors
    /// The file cannot be created.
    pub(crate) fn create(dir: &Path) -> io::Result<Spool> {
        static N: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        loop {
            let path = dir.join(format!(
                ".tollgate-batch-input-{}-{nanos}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let mut options = std::fs::OpenOptions::new();
            options.read(true).write(true).create_new(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::OpenOptionsExt;
                options.mode(0o600);
            }
            match options.open(&path) {
                Ok(file) => {
                    let named = if cfg!(unix) {
                        // Open, it stays readable; unnamed, nothing is
                        // left behind whatever ends the process.
                        std::fs::remove_file(&path)?;
                        None
                    } else {
                        Some(path)
                    };
                    return Ok(Spool {
                        file,
                        named,
                        error: None,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// `input`, every byte read from it also written to the spool.
    pub(crate) fn tee<R: Read>(&mut self, input: R) -> Tee<'_, R> {
        Tee { input, spool: self }
    }

    /// The spool to read items from, once the input was read whole.
    ///
    /// # Errors
    /// Writing it failed (the disk is full, say).
    pub(crate) fn finish(mut self) -> io::Result<File> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        self.file.flush()?;
        self.file.try_clone()
    }
}

impl Drop for Spool {
    fn drop(&mut self) {
        if let Some(path) = self.named.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// A reader that copies what it reads to a [`Spool`].
pub(crate) struct Tee<'a, R> {
    input: R,
    spool: &'a mut Spool,
}

impl<R: Read> Read for Tee<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.input.read(buf)?;
        if self.spool.error.is_none()
            && let Err(e) = self.spool.file.write_all(&buf[..n])
        {
            // Reported by `finish`, as the spool's error, not the input's.
            self.spool.error = Some(e);
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Seek, SeekFrom};

    #[test]
    fn what_is_read_through_the_tee_is_read_back_by_offset() {
        let mut spool = Spool::create(&std::env::temp_dir()).expect("spool");
        let mut seen = String::new();
        spool
            .tee(&b"first line\nsecond line\n"[..])
            .read_to_string(&mut seen)
            .expect("read");
        assert_eq!(seen, "first line\nsecond line\n");
        let mut file = spool.finish().expect("finish");
        let mut second = [0; 6];
        file.seek(SeekFrom::Start(11)).expect("seek");
        file.read_exact(&mut second).expect("read back");
        assert_eq!(&second, b"second");
    }
}
