//! I/O engine measurements on a real .ftw file (results in docs/benchmarks.md):
//!
//!   cargo bench -p io_engine --bench io_bench -- FILE [--reps 3] [--threads 1,4,8,16]
//!
//! 1. Throughput of demand-only random expert reads through the engine at N workers,
//!    against a plain positioned-read loop with N threads, the same sizes and O_DIRECT
//!    on the same file, interleaved in one run.
//! 2. Demand latency p50/p99 idle and while the prefetch queue is saturated, with the
//!    engine's chunking and caps, and with both turned off.
//! 3. The page cache (`Cached:` in /proc/meminfo) before and after direct reads.
#![allow(clippy::unwrap_used, clippy::indexing_slicing, missing_docs)]

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ftw_format::FtwReader;
use io_engine::{AlignedBuf, Engine, EngineConfig, ExpertKey, Proj, ReadClass, Slot, SlotSource};

struct Pool {
    bufs: Vec<AlignedBuf>,
    free: Mutex<Vec<u32>>,
}

impl Pool {
    fn new(n: usize, len: usize) -> Self {
        let bufs = (0..n)
            .map(|_| AlignedBuf::new(len, 4096).unwrap())
            .collect();
        Self {
            bufs,
            free: Mutex::new((0..n as u32).collect()),
        }
    }
    fn take(&self) -> Option<Slot> {
        let i = self.free.lock().unwrap().pop()?;
        let b = &self.bufs[i as usize];
        Some(Slot {
            index: i,
            addr: b.as_mut_ptr() as usize,
            len: b.len() as u64,
        })
    }
    fn give(&self, s: Slot) {
        self.free.lock().unwrap().push(s.index);
    }
}

impl SlotSource for Pool {
    fn bind(&self, _k: ExpertKey, _c: ReadClass) -> Option<Slot> {
        self.take()
    }
    // Residency is not modelled: a finished prefetch frees its slot at once so the
    // prefetch stream can run forever.
    fn complete(&self, _k: ExpertKey, s: Slot) {
        self.give(s);
    }
    fn release(&self, _k: ExpertKey, s: Slot) {
        self.give(s);
    }
}

fn shuffled_keys(r: &FtwReader, n: usize, seed: u64) -> Vec<ExpertKey> {
    let all: Vec<ExpertKey> = r
        .experts()
        .iter()
        .map(|e| ExpertKey {
            layer: e.layer,
            expert: e.expert,
        })
        .collect();
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            all[(x % all.len() as u64) as usize]
        })
        .collect()
}

/// GB/s of a plain loop: `threads` threads, own O_DIRECT handles, pread whole slabs.
fn plain(path: &std::path::Path, r: &FtwReader, keys: &[ExpertKey], threads: usize) -> f64 {
    let next = AtomicUsize::new(0);
    let slab = r.experts()[0].len as usize;
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let (f, _) = io_engine::open_for_reads(path, true).unwrap();
                let mut buf = AlignedBuf::new(slab, 4096).unwrap();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(k) = keys.get(i) else { break };
                    let e = r.expert(k.layer, k.expert).unwrap();
                    let n = io_engine_read(&f, buf.as_mut_slice(), e.off);
                    assert_eq!(n, slab);
                }
            });
        }
    });
    (keys.len() * slab) as f64 / start.elapsed().as_secs_f64() / 1e9
}

fn io_engine_read(f: &std::fs::File, buf: &mut [u8], off: u64) -> usize {
    use std::os::unix::fs::FileExt;
    let mut done = 0;
    while done < buf.len() {
        let n = f.read_at(&mut buf[done..], off + done as u64).unwrap();
        if n == 0 {
            break;
        }
        done += n;
    }
    done
}

/// GB/s of demand reads through the engine, `threads` workers, 2 x `threads`
/// outstanding (a layer's misses arrive together, so the queue is never empty).
fn engine_demand(
    path: &std::path::Path,
    r: &FtwReader,
    keys: &[ExpertKey],
    threads: usize,
    verify: bool,
) -> f64 {
    let slab = r.experts()[0].len as usize;
    let pool = Arc::new(Pool::new(threads * 2 + 1, slab));
    let cfg = EngineConfig {
        workers: threads,
        verify,
        ..Default::default()
    };
    let eng = Engine::open(path, r.experts(), pool.clone(), cfg).unwrap();
    let mut outstanding: VecDeque<ExpertKey> = VecDeque::new();
    let start = Instant::now();
    for &k in keys {
        while outstanding.len() >= 2 * threads || outstanding.contains(&k) {
            let done = outstanding.pop_front().unwrap();
            eng.wait(done, Proj::Down, Duration::from_secs(60)).unwrap();
            eng.cancel(done); // forgets the finished record
        }
        let slot = pool.take().unwrap();
        assert!(eng.demand(k, slot).unwrap());
        outstanding.push_back(k);
    }
    for k in outstanding {
        eng.wait(k, Proj::Down, Duration::from_secs(60)).unwrap();
    }
    (keys.len() * slab) as f64 / start.elapsed().as_secs_f64() / 1e9
}

/// Demand latencies (us) with or without a saturated prefetch stream.
fn latencies(
    path: &std::path::Path,
    r: &FtwReader,
    cfg: EngineConfig,
    saturate: bool,
    n: usize,
) -> Vec<u64> {
    let slab = r.experts()[0].len as usize;
    let pool = Arc::new(Pool::new(64, slab));
    let eng = Engine::open(path, r.experts(), pool.clone(), cfg).unwrap();
    let keys = shuffled_keys(r, n, 99);
    let pred_keys = shuffled_keys(r, 100_000, 7);
    let mut p = 0;
    let mut out = Vec::with_capacity(n);
    for k in keys {
        if saturate {
            let (_, _, waiting, _) = eng.depths();
            let add: Vec<_> = (waiting..64)
                .map(|i| {
                    p += 1;
                    (pred_keys[p % pred_keys.len()], 1, (i % 8) as u8)
                })
                .filter(|(pk, _, _)| *pk != k)
                .collect();
            eng.predict(&add).unwrap();
            std::thread::sleep(Duration::from_millis(2)); // let prefetches fill the queues
        }
        eng.cancel(k);
        let Some(slot) = pool.take() else { continue };
        let t0 = Instant::now();
        if !eng.demand(k, slot).unwrap() {
            pool.give(slot);
        }
        eng.wait(k, Proj::Down, Duration::from_secs(60)).unwrap();
        out.push(t0.elapsed().as_micros() as u64);
        eng.cancel(k);
    }
    out.sort_unstable();
    out
}

fn pct(v: &[u64], q: f64) -> u64 {
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn cached_kib() -> u64 {
    let m = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    m.lines()
        .find(|l| l.starts_with("Cached:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn drop_file_cache(path: &std::path::Path) {
    use std::os::unix::io::AsRawFd;
    let f = std::fs::File::open(path).unwrap();
    // SAFETY: valid descriptor; advisory call.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let path = PathBuf::from(
        args.first()
            .expect("usage: io_bench FILE [--reps N] [--threads 1,4,8,16]"),
    );
    let opt = |name: &str, d: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
            .unwrap_or(d.into())
    };
    let reps: usize = opt("--reps", "3").parse().unwrap();
    let threads: Vec<usize> = opt("--threads", "1,4,8,16")
        .split(',')
        .map(|t| t.parse().unwrap())
        .collect();
    let r = FtwReader::open(&path).unwrap();
    let slab = r.experts()[0].len;
    println!(
        "file {} ({} experts, slab {} KiB)",
        path.display(),
        r.experts().len(),
        slab >> 10
    );

    drop_file_cache(&path);
    let before = cached_kib();
    let keys = shuffled_keys(&r, 400, 1);
    println!("\n1. demand-only random reads, GB/s (mean over {reps} interleaved reps)");
    println!(
        "| threads | plain pread loop | engine | engine / plain | engine, no checksum | / plain |"
    );
    println!("|---|---|---|---|---|---|");
    for &t in &threads {
        let (mut a, mut b, mut c) = (0.0, 0.0, 0.0);
        for rep in 0..reps {
            let ks = shuffled_keys(&r, 400, 11 + rep as u64 * 31 + t as u64);
            a += plain(&path, &r, &ks, t);
            b += engine_demand(&path, &r, &ks, t, true);
            c += engine_demand(&path, &r, &ks, t, false);
        }
        let (a, b, c) = (a / reps as f64, b / reps as f64, c / reps as f64);
        println!(
            "| {t} | {a:.2} | {b:.2} | {:.0}% | {c:.2} | {:.0}% |",
            100.0 * b / a,
            100.0 * c / a
        );
    }
    let after = cached_kib();
    let read_gib =
        (threads.len() * reps * 3 * keys.len()) as f64 * slab as f64 / (1u64 << 30) as f64;
    println!(
        "\n3. page cache: Cached {} MiB before, {} MiB after reading {read_gib:.1} GiB directly",
        before >> 10,
        after >> 10
    );

    println!("\n2. demand latency (us), 8 workers, 200 demands each");
    println!("| engine | idle p50 | idle p99 | prefetch-saturated p50 | saturated p99 | p50 ratio | p99 ratio |\n|---|---|---|---|---|---|---|");
    let on = EngineConfig::default();
    let off = EngineConfig {
        chunking: false,
        prefetch_cap: 8,
        prefetch_cap_with_demand: 8,
        ..Default::default()
    };
    for (name, cfg) in [
        ("chunking + caps (default)", on),
        ("chunking and caps off", off),
    ] {
        let idle = latencies(&path, &r, cfg.clone(), false, 200);
        let sat = latencies(&path, &r, cfg, true, 200);
        let (i50, i99, s50, s99) = (
            pct(&idle, 0.5),
            pct(&idle, 0.99),
            pct(&sat, 0.5),
            pct(&sat, 0.99),
        );
        println!(
            "| {name} | {i50} | {i99} | {s50} | {s99} | {:.2}x | {:.2}x |",
            s50 as f64 / i50 as f64,
            s99 as f64 / i99 as f64
        );
    }
}
