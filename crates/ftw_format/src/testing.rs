//! Test and fuzz helpers (feature `testing`): re-sealing a mutated file so its checksums
//! and footer agree again, which lets a fuzzer reach the validation behind them.

use crate::consts::HEADER_STRUCT_SIZE;
use crate::header::{Extent, Header};

fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    if let Some(s) = b.get(off..off + 8) {
        a.copy_from_slice(s);
    }
    u64::from_le_bytes(a)
}

fn sum(b: &[u8], off: u64, len: u64) -> u64 {
    let (Ok(s), Ok(n)) = (usize::try_from(off), usize::try_from(len)) else {
        return 0;
    };
    s.checked_add(n)
        .and_then(|e| b.get(s..e))
        .map(crate::checksum)
        .unwrap_or(0)
}

/// Recomputes the section checksums, header checksum, file size and footer of `b` from
/// whatever offsets its header holds, leaving every other byte as it is.
pub fn reseal(b: &mut [u8]) {
    let hs = HEADER_STRUCT_SIZE;
    if b.len() < 2 * hs {
        return;
    }
    let mut h = Header::new();
    let mut v = [0u32; 2];
    for (i, x) in v.iter_mut().enumerate() {
        let mut a = [0u8; 4];
        a.copy_from_slice(b.get(8 + 4 * i..12 + 4 * i).unwrap_or(&[0; 4]));
        *x = u32::from_le_bytes(a);
    }
    (h.version, h.header_page) = (v[0], v[1]);
    h.file_size = b.len() as u64;
    let ext = |o: usize| Extent {
        off: u64_at(b, o),
        len: u64_at(b, o + 8),
    };
    (h.metadata, h.tensor_index, h.expert_index) = (ext(24), ext(48), ext(72));
    (h.dense, h.experts) = (ext(96), ext(112));
    h.metadata_xxh3 = sum(b, h.metadata.off, h.metadata.len);
    h.tensor_index_xxh3 = sum(b, h.tensor_index.off, h.tensor_index.len);
    h.expert_index_xxh3 = sum(b, h.expert_index.off, h.expert_index.len);
    let n = b.len();
    if let Some(s) = b.get_mut(..hs) {
        s.copy_from_slice(&h.encode(false));
    }
    if let Some(s) = b.get_mut(n - hs..) {
        s.copy_from_slice(&h.encode(true));
    }
}
