//! Feeds arbitrary bytes to the reader as a file: it must return Ok or an error, never
//! panic, and every read it then allows must also return without panicking.
//!
//! Checksums would stop almost every mutation at the header, so when the first input
//! byte is odd the rest is re-sealed first (checksums, size and footer recomputed from
//! the mutated header), letting the fuzzer reach the index and placement checks.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let mut bytes = rest.to_vec();
    if mode & 1 == 1 {
        ftw_format::testing::reseal(&mut bytes);
    }
    let dir = std::env::temp_dir().join(format!("ftw-fuzz-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join("input.ftw");
    if std::fs::write(&path, &bytes).is_err() {
        return;
    }
    if let Ok(r) = ftw_format::FtwReader::open(&path) {
        for t in r.tensors().to_vec() {
            let _ = r.read_tensor(&t.name);
        }
        let mut scratch = Vec::new();
        for e in r.experts().to_vec() {
            let _ = r.verify_expert(e.layer, e.expert, &mut scratch);
        }
    }
});
