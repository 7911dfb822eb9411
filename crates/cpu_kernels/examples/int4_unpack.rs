//! Two ways to turn int4 nibbles into bf16 for the AVX-512 BF16 dot product, scales left
//! out (the unpacking alone): a 16-bit permute through a table of q = -8..7 (what
//! `avx512.rs` does), against `(nibble & 15) | 0x4300` in one ternary-logic op, which is
//! the bf16 of 128 + nibble = 136 + q, with 136 times each lane's activation sum
//! subtracted after the products. One thread, weights in L2, G weights per second, and
//! the largest difference between the two. `cargo run --release -p cpu_kernels
//! --example int4_unpack [-- rows cols reps]`.
#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::print_stdout)]

#[allow(dead_code)] // reason: this example uses only the generator
mod common;

#[cfg(target_arch = "x86_64")]
mod probe {
    use std::arch::x86_64::*;

    /// q = -8..7 as bf16 bits, twice (the permute indexes by the low 5 bits).
    const Q_BF16: [u16; 32] = {
        let mut t = [0u16; 32];
        let mut i = 0;
        while i < 32 {
            t[i] = ((((i & 15) as f32) - 8.0).to_bits() >> 16) as u16;
            i += 1;
        }
        t
    };

    fn bh(v: __m512i) -> __m512bh {
        // SAFETY: both are 512 bits of plain data.
        unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
    }

    /// Each row of `w` (`cols / 2` bytes, word j of a 64-byte step holding columns
    /// 4j..4j+3) dotted with `x` (bf16 bits in the matching order), through the table.
    ///
    /// # Safety
    /// The CPU has avx512f/bw/bf16; `w` holds `rows * cols / 2` bytes, `x` `cols` values,
    /// `cols` a multiple of 128.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub unsafe fn permute(w: &[u8], x: &[u16], rows: usize, cols: usize, out: &mut [f32]) {
        let table = unsafe { _mm512_loadu_si512(Q_BF16.as_ptr().cast()) };
        for (r, o) in out.iter_mut().enumerate().take(rows) {
            let mut acc = _mm512_setzero_ps();
            for c in (0..cols).step_by(128) {
                let v = unsafe { _mm512_loadu_si512(w.as_ptr().add((r * cols + c) / 2).cast()) };
                let q = [
                    _mm512_permutexvar_epi16(v, table),
                    _mm512_permutexvar_epi16(_mm512_srli_epi16::<4>(v), table),
                    _mm512_permutexvar_epi16(_mm512_srli_epi16::<8>(v), table),
                    _mm512_permutexvar_epi16(_mm512_srli_epi16::<12>(v), table),
                ];
                let mut part = _mm512_setzero_ps();
                for (k, qk) in q.into_iter().enumerate() {
                    let xv = unsafe { _mm512_loadu_si512(x.as_ptr().add(c + 32 * k).cast()) };
                    part = _mm512_dpbf16_ps(part, bh(qk), bh(xv));
                }
                acc = _mm512_add_ps(acc, part); // the same chains as `ternary`
            }
            *o = _mm512_reduce_add_ps(acc);
        }
    }

    /// [`permute`] through `(nibble & 15) | 0x4300` (136 + q) and the correction
    /// `- 136 * xs` (`xs`: each step lane's activation sum).
    ///
    /// # Safety
    /// As [`permute`]; `xs` holds `cols / 8` values.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub unsafe fn ternary(
        w: &[u8],
        x: &[u16],
        xs: &[f32],
        rows: usize,
        cols: usize,
        out: &mut [f32],
    ) {
        let (low, high, c136) = (
            _mm512_set1_epi16(0x000f),
            _mm512_set1_epi16(0x4300),
            _mm512_set1_ps(136.0),
        );
        for (r, o) in out.iter_mut().enumerate().take(rows) {
            let mut acc = _mm512_setzero_ps();
            for c in (0..cols).step_by(128) {
                let v = unsafe { _mm512_loadu_si512(w.as_ptr().add((r * cols + c) / 2).cast()) };
                // 0xEA: (a & b) | c
                let q = [
                    _mm512_ternarylogic_epi32::<0xEA>(v, low, high),
                    _mm512_ternarylogic_epi32::<0xEA>(_mm512_srli_epi16::<4>(v), low, high),
                    _mm512_ternarylogic_epi32::<0xEA>(_mm512_srli_epi16::<8>(v), low, high),
                    _mm512_or_si512(_mm512_srli_epi16::<12>(v), high),
                ];
                let mut part = _mm512_setzero_ps();
                for (k, qk) in q.into_iter().enumerate() {
                    let xv = unsafe { _mm512_loadu_si512(x.as_ptr().add(c + 32 * k).cast()) };
                    part = _mm512_dpbf16_ps(part, bh(qk), bh(xv));
                }
                let sums = unsafe { _mm512_loadu_ps(xs.as_ptr().add(c / 8)) };
                acc = _mm512_add_ps(acc, _mm512_fnmadd_ps(c136, sums, part));
            }
            *o = _mm512_reduce_add_ps(acc);
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn main() {
    use std::time::Instant;
    if !std::arch::is_x86_feature_detected!("avx512bf16") {
        println!("this CPU has no AVX-512 BF16");
        return;
    }
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().unwrap())
        .collect();
    let rows = args.first().copied().unwrap_or(64);
    let cols = args.get(1).copied().unwrap_or(2048) / 128 * 128;
    let reps = args.get(2).copied().unwrap_or(2000);
    let mut rnd = common::rng();
    let w: Vec<u8> = (0..rows * cols / 2).map(|_| rnd() as u8).collect();
    let x: Vec<u16> = (0..cols)
        .map(|_| (((rnd() >> 40) as f32 / 8e6 - 1.0).to_bits() >> 16) as u16)
        .collect();
    let xf = |c: usize| f32::from_bits(u32::from(x[c]) << 16);
    // lane i of a 128-column step sums the columns the dot product pairs into it: 2i and
    // 2i + 1 of each of the step's four 32-column blocks
    let xs: Vec<f32> = (0..cols / 8)
        .map(|j| {
            let (c0, i) = (j / 16 * 128, j % 16);
            (0..4)
                .map(|k| xf(c0 + 32 * k + 2 * i) + xf(c0 + 32 * k + 2 * i + 1))
                .sum()
        })
        .collect();
    let (mut a, mut b) = (vec![0.0f32; rows], vec![0.0f32; rows]);
    let gw = (rows * cols * reps) as f64 / 1e9;
    for round in 0..3 {
        let t0 = Instant::now();
        for _ in 0..reps {
            // SAFETY: avx512bf16 checked above; sizes as built.
            unsafe { probe::permute(&w, &x, rows, cols, &mut a) };
        }
        let permute = gw / t0.elapsed().as_secs_f64();
        let t0 = Instant::now();
        for _ in 0..reps {
            // SAFETY: as above.
            unsafe { probe::ternary(&w, &x, &xs, rows, cols, &mut b) };
        }
        let ternary = gw / t0.elapsed().as_secs_f64();
        let diff = a
            .iter()
            .zip(&b)
            .fold(0.0f32, |m, (p, q)| m.max((p - q).abs()));
        let scale = a.iter().fold(0.0f32, |m, p| m.max(p.abs()));
        println!(
            "round {round}: permute {permute:.1} G weights/s, ternary {ternary:.1} (largest difference {diff:.2e} of {scale:.2e})"
        );
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    println!("x86_64 only");
}
