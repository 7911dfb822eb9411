//! Opening the model file for expert reads: direct I/O where the file system allows
//! it (O_DIRECT on Linux, F_NOCACHE on macOS, FILE_FLAG_NO_BUFFERING on Windows),
//! buffered otherwise. Expert streaming only reads; it never writes the model file.

use std::fs::{File, OpenOptions};
use std::path::Path;

use crate::aligned::AlignedBuf;
use crate::error::{IoError, Result};

/// How a handle reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadMode {
    /// Bypassing the page cache.
    Direct,
    /// Through the page cache.
    Buffered,
}

fn open_error(path: &Path, e: &std::io::Error) -> IoError {
    IoError::Open {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

#[cfg(target_os = "linux")]
fn open_direct(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
}

#[cfg(target_os = "macos")]
fn open_direct(path: &Path) -> std::io::Result<File> {
    use std::os::unix::io::AsRawFd;
    let f = File::open(path)?;
    // SAFETY: fcntl on a valid descriptor we own.
    if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_NOCACHE, 1) } == -1 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(f)
}

#[cfg(windows)]
fn open_direct(path: &Path) -> std::io::Result<File> {
    use std::os::windows::fs::OpenOptionsExt;
    const FILE_FLAG_NO_BUFFERING: u32 = 0x2000_0000;
    OpenOptions::new()
        .read(true)
        .custom_flags(FILE_FLAG_NO_BUFFERING)
        .open(path)
}

#[cfg(not(any(target_os = "linux", target_os = "macos", windows)))]
fn open_direct(_path: &Path) -> std::io::Result<File> {
    Err(std::io::ErrorKind::Unsupported.into())
}

/// Set to make every direct open fail as if the file system refused it (exercises the
/// buffered fallback in tests and diagnoses direct-I/O trouble on odd file systems).
pub const REFUSE_DIRECT_ENV: &str = "FLINT_IO_REFUSE_DIRECT";

/// Opens `path` for reads, directly if `direct` and the file system accepts it (probed
/// with one aligned read of the first page), buffered otherwise.
pub fn open_for_reads(path: &Path, direct: bool) -> Result<(File, ReadMode)> {
    if direct && std::env::var_os(REFUSE_DIRECT_ENV).is_none() {
        if let Ok(f) = open_direct(path) {
            let probe = AlignedBuf::new(4096, 4096);
            if let Some(mut buf) = probe {
                if read_at(&f, buf.as_mut_slice(), 0).is_ok() {
                    return Ok((f, ReadMode::Direct));
                }
            }
        }
    }
    let f = File::open(path).map_err(|e| open_error(path, &e))?;
    Ok((f, ReadMode::Buffered))
}

/// Reads as many bytes as the file has at `off`, up to `buf.len()`; returns the count
/// (less than `buf.len()` only at end of file). Retries interrupted and partial reads.
pub fn read_at(file: &File, buf: &mut [u8], off: u64) -> std::io::Result<usize> {
    let mut done = 0usize;
    while done < buf.len() {
        let rest = buf.get_mut(done..).unwrap_or_default();
        #[cfg(unix)]
        let r = std::os::unix::fs::FileExt::read_at(file, rest, off + done as u64);
        #[cfg(windows)]
        let r = std::os::windows::fs::FileExt::seek_read(file, rest, off + done as u64);
        match r {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}
