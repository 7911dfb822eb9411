//! A plain streaming read of a buffer on the kernels' own threads: the yardstick their
//! effective bandwidth is measured against (`benches/cpu_kernels.py`). torch's `sum`,
//! used before, moved from 53 to 129 GB/s between rows of one run at 16 threads on the
//! GPU box, and the bf16 layer call beat it (docs/benchmarks.md, "Thirteenth session").

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::layer::Kernels;

/// Bytes a thread claims at a time.
const CHUNK: usize = 256 * 1024;

impl Kernels {
    /// The wrapping sum of `bytes` as little-endian u64 words (a last partial word is
    /// left out), read by the calling thread and the pool's workers, woken as for a
    /// layer call, each claiming `CHUNK` (256 KiB) at a time from an atomic counter. The
    /// sum is returned so that the read cannot be optimised away.
    pub fn plain_read(&self, bytes: &[u8]) -> u64 {
        let next = AtomicUsize::new(0);
        let total = AtomicU64::new(0);
        let job = || {
            let mut sum = 0u64;
            loop {
                let start = next.fetch_add(1, Ordering::Relaxed).saturating_mul(CHUNK);
                let end = bytes.len().min(start.saturating_add(CHUNK));
                let Some(chunk) = bytes.get(start..end) else {
                    break;
                };
                if chunk.is_empty() {
                    break;
                }
                sum = sum.wrapping_add(sum_words(chunk));
            }
            total.fetch_add(sum, Ordering::Relaxed);
        };
        match &self.crew {
            Some(crew) => crew.run(&job),
            None => job(),
        }
        total.load(Ordering::Relaxed)
    }
}

/// The wrapping sum of `b`'s whole u64 words, in eight independent lanes (so that it
/// vectorizes and no add waits on the one before).
fn sum_words(b: &[u8]) -> u64 {
    let (words, _) = b.as_chunks::<8>();
    let (groups, rest) = words.as_chunks::<8>();
    let mut acc = [0u64; 8];
    for group in groups {
        for (a, w) in acc.iter_mut().zip(group) {
            *a = a.wrapping_add(u64::from_le_bytes(*w));
        }
    }
    let tail = rest
        .iter()
        .fold(0u64, |s, w| s.wrapping_add(u64::from_le_bytes(*w)));
    acc.iter().fold(tail, |s, a| s.wrapping_add(*a))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::Isa;

    #[test]
    fn plain_read_sums_every_whole_word_on_any_thread_count() {
        let len = 3 * CHUNK + 8 * 13 + 5; // chunks, a partial chunk, a partial word
        let bytes: Vec<u8> = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
        let want = bytes
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().unwrap_or([0; 8])))
            .fold(0u64, u64::wrapping_add);
        for threads in [1, 2, 3] {
            let k = Kernels::new(Isa::Scalar, threads).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(k.plain_read(&bytes), want, "{threads} threads");
            assert_eq!(k.plain_read(bytes.get(..5).unwrap_or_default()), 0);
            assert_eq!(k.plain_read(&[]), 0);
        }
    }
}
