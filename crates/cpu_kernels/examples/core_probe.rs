//! What a core can do when all the others are busy too: the clock (a chain of dependent
//! integer multiplies, three cycles each), AVX-512 FMA throughput (eight independent chains), and
//! the clock while the FMAs run, on 1..n threads at once. Tells a lower clock under
//! load (the chain slows) from two threads sharing one physical core (the chain keeps
//! its speed, the FMAs halve), which a virtual machine's `lscpu` does not show. Then the
//! rate of each instruction the int4 kernels use, and, on CPUs with AMX, of BF16 tile
//! products (alone, and each after loading its A tile): the ceiling an AMX int4 kernel
//! would have (a tile product is 512 multiply-adds of one token).
//!
//! `cargo run --release -p cpu_kernels --example core_probe [-- threads,... iterations]`,
//! e.g. `-- 1,8,16 200000000`; per thread count the median (and slowest, fastest) over
//! the threads, best of 3 rounds each.
#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::print_stdout)]

use std::sync::Barrier;
use std::time::Instant;

/// Cycles of `n` iterations of four dependent multiplies (three cycles each; not adds of
/// an immediate, which Intel cores since Golden Cove resolve without executing them).
#[cfg(target_arch = "x86_64")]
fn adds(n: u64) -> u64 {
    let (mut x, mut left) = (3u64, n);
    // SAFETY: register arithmetic only.
    unsafe {
        std::arch::asm!(
            "2:",
            "imul {x}, {x}", "imul {x}, {x}", "imul {x}, {x}", "imul {x}, {x}",
            "sub {n}, 1",
            "jnz 2b",
            x = inout(reg) x,
            n = inout(reg) left,
            options(nomem, nostack),
        );
    }
    std::hint::black_box((x, left));
    12 * n
}

/// Instructions in `n` iterations of eight independent `$op zmm_i, $args`.
macro_rules! eight {
    ($name:ident, $feature:literal, $op:literal, $args:literal) => {
        /// See the macro.
        ///
        /// # Safety
        /// The CPU must have the feature named.
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feature)]
        unsafe fn $name(n: u64) -> u64 {
            let mut left = n;
            // SAFETY: register arithmetic on zmm0-9 (declared clobbered).
            unsafe {
                std::arch::asm!(
                    "vxorps zmm8, zmm8, zmm8",
                    "vxorps zmm9, zmm9, zmm9",
                    "2:",
                    concat!($op, " zmm0, ", $args), concat!($op, " zmm1, ", $args),
                    concat!($op, " zmm2, ", $args), concat!($op, " zmm3, ", $args),
                    concat!($op, " zmm4, ", $args), concat!($op, " zmm5, ", $args),
                    concat!($op, " zmm6, ", $args), concat!($op, " zmm7, ", $args),
                    "sub {n}, 1",
                    "jnz 2b",
                    n = inout(reg) left,
                    out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _,
                    out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _,
                    out("zmm8") _, out("zmm9") _,
                    options(nomem, nostack),
                );
            }
            std::hint::black_box(left);
            8 * n
        }
    };
}

eight!(fmas, "avx512f", "vfmadd231ps", "zmm8, zmm9");
eight!(dpbf16s, "avx512bf16", "vdpbf16ps", "zmm8, zmm9");
eight!(permps, "avx512f", "vpermps", "zmm8, zmm9");
eight!(permw, "avx512bw", "vpermw", "zmm8, zmm9");
eight!(shifts, "avx512f", "vpsrld", "zmm8, 4");

/// Cycles of `n` iterations of four dependent multiplies beside four independent FMAs
/// (the multiplies are the longer chain: the clock while AVX-512 FMAs keep running).
///
/// # Safety
/// The CPU must have avx512f.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn adds_beside_fmas(n: u64) -> u64 {
    let (mut x, mut left) = (3u64, n);
    // SAFETY: as `fmas` and `adds`.
    unsafe {
        std::arch::asm!(
            "vxorps zmm8, zmm8, zmm8",
            "vxorps zmm9, zmm9, zmm9",
            "2:",
            "vfmadd231ps zmm0, zmm8, zmm9", "imul {x}, {x}",
            "vfmadd231ps zmm1, zmm8, zmm9", "imul {x}, {x}",
            "vfmadd231ps zmm2, zmm8, zmm9", "imul {x}, {x}",
            "vfmadd231ps zmm3, zmm8, zmm9", "imul {x}, {x}",
            "sub {n}, 1",
            "jnz 2b",
            x = inout(reg) x,
            n = inout(reg) left,
            out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _,
            out("zmm8") _, out("zmm9") _,
            options(nomem, nostack),
        );
    }
    std::hint::black_box((x, left));
    12 * n
}

/// Whether the CPU has AMX tiles with BF16 (CPUID leaf 7: EDX bits 24 and 22) and Linux
/// let this process use them (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`).
#[cfg(target_arch = "x86_64")]
fn amx_bf16() -> bool {
    // `__cpuid_count` is safe from Rust 1.94 on, unsafe before (the crate builds on 1.89).
    #[allow(unused_unsafe)]
    // SAFETY: leaf 7 exists on every CPU with AVX-512.
    let edx = unsafe { std::arch::x86_64::__cpuid_count(7, 0) }.edx;
    if edx & (1 << 24) == 0 || edx & (1 << 22) == 0 {
        return false;
    }
    let ret: i64;
    // SAFETY: arch_prctl (158) with ARCH_REQ_XCOMP_PERM (0x1023) for tile data (18):
    // asks the kernel for permission, touches no memory of ours.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") 158i64 => ret,
            in("rdi") 0x1023i64,
            in("rsi") 18i64,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret == 0
}

/// The tile configuration: palette 1, tiles 0-5 of 16 rows of 64 bytes (C: 16 x 16 f32;
/// A: 16 x 32 bf16; B: 16 pairs x 16 columns).
#[cfg(target_arch = "x86_64")]
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

#[cfg(target_arch = "x86_64")]
fn tile_config() -> TileConfig {
    let mut c = [0u8; 64];
    c[0] = 1; // palette
    for t in 0..6 {
        c[16 + 2 * t] = 64; // bytes per row
        c[48 + t] = 16; // rows
    }
    TileConfig(c)
}

/// AMX BF16 tile products in `n` iterations of four into independent accumulators
/// (each 16 x 16 x 32 multiply-adds: 512 of them one token's worth, a decode step's
/// weights as A and the token as one column of B).
#[cfg(target_arch = "x86_64")]
fn amx_products(n: u64) -> u64 {
    amx_loop(n, false)
}

/// As [`amx_products`], each product's A tile loaded first from a 1 KiB buffer (in L1):
/// what a kernel converting weights into a tile buffer then multiplying would do.
#[cfg(target_arch = "x86_64")]
fn amx_loads_products(n: u64) -> u64 {
    amx_loop(n, true)
}

#[cfg(target_arch = "x86_64")]
fn amx_loop(n: u64, load: bool) -> u64 {
    let cfg = tile_config();
    let a = [0u8; 1024 + 64];
    let ap = a.as_ptr().wrapping_add(64 - a.as_ptr() as usize % 64);
    let mut left = n;
    // SAFETY: only called after `amx_bf16()` (tiles present and permitted); the tile
    // loads read 16 rows of 64 bytes at stride 64 from `ap` (1 KiB inside `a`); the
    // tiles are released at the end.
    unsafe {
        if load {
            std::arch::asm!(
                "ldtilecfg [{cfg}]",
                "tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3",
                "tileloadd tmm5, [{a} + {s}*1]",
                "2:",
                "tileloadd tmm4, [{a} + {s}*1]",
                "tdpbf16ps tmm0, tmm4, tmm5",
                "tileloadd tmm4, [{a} + {s}*1]",
                "tdpbf16ps tmm1, tmm4, tmm5",
                "tileloadd tmm4, [{a} + {s}*1]",
                "tdpbf16ps tmm2, tmm4, tmm5",
                "tileloadd tmm4, [{a} + {s}*1]",
                "tdpbf16ps tmm3, tmm4, tmm5",
                "sub {n}, 1",
                "jnz 2b",
                "tilerelease",
                cfg = in(reg) cfg.0.as_ptr(),
                a = in(reg) ap,
                s = in(reg) 64usize,
                n = inout(reg) left,
                options(nostack),
            );
        } else {
            std::arch::asm!(
                "ldtilecfg [{cfg}]",
                "tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3",
                "tileloadd tmm4, [{a} + {s}*1]",
                "tileloadd tmm5, [{a} + {s}*1]",
                "2:",
                "tdpbf16ps tmm0, tmm4, tmm5",
                "tdpbf16ps tmm1, tmm4, tmm5",
                "tdpbf16ps tmm2, tmm4, tmm5",
                "tdpbf16ps tmm3, tmm4, tmm5",
                "sub {n}, 1",
                "jnz 2b",
                "tilerelease",
                cfg = in(reg) cfg.0.as_ptr(),
                a = in(reg) ap,
                s = in(reg) 64usize,
                n = inout(reg) left,
                options(nostack),
            );
        }
    }
    std::hint::black_box(left);
    4 * n
}

/// A probe: its label and its work (`n` iterations -> units done).
type Probe = (&'static str, fn(u64) -> u64);

/// Per thread, the best of 3 rounds of `work(n)` units per second (billions), all
/// `threads` running at once; sorted.
fn on_threads(threads: usize, n: u64, work: fn(u64) -> u64) -> Vec<f64> {
    let barrier = Barrier::new(threads);
    let mut rates: Vec<f64> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                let barrier = &barrier;
                s.spawn(move || {
                    let mut best = 0.0f64;
                    for _ in 0..3 {
                        barrier.wait();
                        let t0 = Instant::now();
                        let units = work(n);
                        best = best.max(units as f64 / t0.elapsed().as_secs_f64() / 1e9);
                    }
                    best
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    rates.sort_by(f64::total_cmp);
    rates
}

#[cfg(target_arch = "x86_64")]
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let counts: Vec<usize> = args
        .first()
        .map_or("1,8,16", String::as_str)
        .split(',')
        .map(|t| t.parse().unwrap())
        .collect();
    let n: u64 = args.get(1).map_or(200_000_000, |v| v.parse().unwrap());
    let avx512 = std::arch::is_x86_feature_detected!("avx512f");
    let mut probes: Vec<Probe> = vec![("clock, multiplies alone (GHz)", adds)];
    if avx512 {
        // SAFETY: avx512f detected just above.
        probes.push(("AVX-512 FMAs (G per s)", |n| unsafe { fmas(n) }));
        // SAFETY: as above.
        probes.push(("clock beside FMAs (GHz)", |n| unsafe {
            adds_beside_fmas(n)
        }));
        // SAFETY: avx512f detected.
        probes.push(("vpermps (G per s)", |n| unsafe { permps(n) }));
        // SAFETY: as above.
        probes.push(("vpsrld (G per s)", |n| unsafe { shifts(n) }));
    }
    if std::arch::is_x86_feature_detected!("avx512bw") {
        // SAFETY: avx512bw detected.
        probes.push(("vpermw (G per s)", |n| unsafe { permw(n) }));
    }
    if std::arch::is_x86_feature_detected!("avx512bf16") {
        // SAFETY: avx512bf16 detected.
        probes.push(("vdpbf16ps (G per s)", |n| unsafe { dpbf16s(n) }));
    }
    if amx_bf16() {
        probes.push(("AMX tdpbf16ps (G per s)", amx_products));
        probes.push((
            "AMX tileloadd + tdpbf16ps (G pairs per s)",
            amx_loads_products,
        ));
    } else {
        println!("no AMX BF16 tiles on this CPU (or not permitted): no tile probes");
    }
    for &t in &counts {
        for (name, work) in &probes {
            let r = on_threads(t, n, *work);
            println!(
                "{t} threads, {name}: median {:.2} (slowest {:.2}, fastest {:.2})",
                r[r.len() / 2],
                r[0],
                r[r.len() - 1]
            );
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    println!("core_probe: x86_64 only");
}
