//! Positioned reads (`pread`) that work from several threads on one handle.

use std::fs::File;

/// Fills `buf` from `file` at `offset`; a short file is an `UnexpectedEof` error.
pub(crate) fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
    }
    #[cfg(windows)]
    {
        let (mut done, mut buf) = (0u64, buf);
        while !buf.is_empty() {
            let n = std::os::windows::fs::FileExt::seek_read(file, buf, offset + done)?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            buf = &mut buf[n..];
            done += n as u64;
        }
        Ok(())
    }
}
