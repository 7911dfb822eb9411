//! The hostile corpus: malformed files, each rejected with its own typed error.
//!
//! `tests/hostile/*.ftw` are checked in (the fuzz target uses them as seeds);
//! `FTW_REGEN_CORPUS=1 cargo test -p ftw_format --test hostile` rebuilds them from the
//! golden file. Offsets below follow docs/ftw-format.md for the golden file's indexes.
#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

mod common;

use std::path::{Path, PathBuf};

use ftw_format::{FtwError, FtwReader, Header, HEADER_STRUCT_SIZE};

struct File {
    b: Vec<u8>,
    h: Header,
}

impl File {
    fn golden() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("g.ftw");
        common::write_golden(&p);
        let b = std::fs::read(&p).unwrap();
        let h = Header::decode(&b[..HEADER_STRUCT_SIZE], false).unwrap();
        Self { b, h }
    }
    fn at(&mut self, off: u64) -> &mut [u8] {
        &mut self.b[off as usize..]
    }
    fn put64(&mut self, off: u64, v: u64) {
        self.at(off)[..8].copy_from_slice(&v.to_le_bytes());
    }
    fn tidx(&self) -> u64 {
        self.h.tensor_index.off
    }
    fn eidx(&self) -> u64 {
        self.h.expert_index.off
    }
    /// Recomputes section checksums and rewrites header and footer from `self.h`.
    fn seal(&mut self) {
        let sum = |b: &[u8], e: ftw_format::Extent| {
            b.get(e.off as usize..(e.off + e.len) as usize)
                .map(ftw_format::checksum)
                .unwrap_or(0)
        };
        self.h.metadata_xxh3 = sum(&self.b, self.h.metadata);
        self.h.tensor_index_xxh3 = sum(&self.b, self.h.tensor_index);
        self.h.expert_index_xxh3 = sum(&self.b, self.h.expert_index);
        self.write_header();
    }
    fn write_header(&mut self) {
        let n = self.b.len();
        self.b[..HEADER_STRUCT_SIZE].copy_from_slice(&self.h.encode(false));
        self.b[n - HEADER_STRUCT_SIZE..].copy_from_slice(&self.h.encode(true));
    }
}

// Golden tensor index: record 0 ("embed.weight", f32 [2, 3]) then record 1 ("final.weight").
const T0_NAME: u64 = 10;
const T0_DTYPE: u64 = 22;
const T0_NDIM: u64 = 23;
const T0_DIM0: u64 = 24;
const T0_OFF: u64 = 40;
const T0_NBYTES: u64 = 48;
const T1_NAME: u64 = 66;
const T1_OFF: u64 = 88;
// Golden expert index: 40-byte layout block, count, then 80-byte records.
const E_SCHEME: u64 = 8;
const E_NLAYERS: u64 = 0;
const E0: u64 = 48;
const E1: u64 = 128;

type Case = (&'static str, &'static str, fn(&mut File));

fn cases() -> Vec<Case> {
    vec![
        ("empty", "Truncated", |f| f.b.clear()),
        ("bad_magic", "BadMagic", |f| f.b[0] = b'X'),
        ("future_version", "UnsupportedVersion", |f| {
            f.h.version = 2;
            f.write_header()
        }),
        ("header_checksum", "SectionChecksum", |f| f.b[100] ^= 1),
        ("header_page_size", "BadHeader", |f| {
            f.h.header_page = 8192;
            f.write_header()
        }),
        ("cut_one_byte", "Truncated", |f| {
            f.b.pop();
        }),
        ("cut_in_half", "Truncated", |f| f.b.truncate(f.b.len() / 2)),
        ("trailing_garbage", "Truncated", |f| {
            f.b.extend_from_slice(b"garbage")
        }),
        ("footer_magic", "FooterMismatch", |f| {
            let n = f.b.len();
            f.b[n - HEADER_STRUCT_SIZE] = b'Z'
        }),
        ("footer_disagrees", "FooterMismatch", |f| {
            let n = f.b.len();
            let mut other = f.h;
            other.dense.len += 4096;
            f.b[n - HEADER_STRUCT_SIZE..].copy_from_slice(&other.encode(true));
        }),
        ("metadata_checksum", "SectionChecksum", |f| {
            let o = f.h.metadata.off;
            f.at(o)[3] ^= 0x20
        }),
        ("metadata_not_json", "InvalidJson", |f| {
            let o = f.h.metadata.off;
            f.at(o)[0] = b'?';
            f.seal()
        }),
        ("metadata_not_object", "InvalidJson", |f| {
            let (o, n) = (f.h.metadata.off as usize, f.h.metadata.len as usize);
            f.b[o..o + n].fill(b' ');
            f.b[o..o + 3].copy_from_slice(b"[1]");
            f.seal()
        }),
        ("metadata_not_utf8", "InvalidUtf8", |f| {
            let o = f.h.metadata.off;
            f.at(o)[2] = 0xff;
            f.seal()
        }),
        ("metadata_past_eof", "OutOfBounds", |f| {
            f.h.metadata.len = f.b.len() as u64;
            f.seal()
        }),
        ("metadata_oversize", "OutOfBounds", |f| {
            f.h.metadata.len = 1 << 40;
            f.write_header()
        }),
        ("section_offset_overflow", "Overflow", |f| {
            f.h.expert_index.off = u64::MAX - 8;
            f.write_header()
        }),
        ("sections_overlap", "Overlap", |f| {
            f.h.tensor_index.off = f.h.metadata.off;
            f.write_header()
        }),
        ("dense_section_misaligned", "Misaligned", |f| {
            f.h.dense.off += 8;
            f.write_header()
        }),
        ("tensor_count_huge", "TooLarge", |f| {
            let o = f.tidx();
            f.put64(o, u64::MAX);
            f.seal()
        }),
        ("tensor_count_short", "BadIndex", |f| {
            let o = f.tidx();
            f.put64(o, 3);
            f.seal()
        }),
        ("tensor_trailing_record_bytes", "BadIndex", |f| {
            let o = f.tidx();
            f.put64(o, 1);
            f.seal()
        }),
        ("tensor_name_not_utf8", "InvalidUtf8", |f| {
            let o = f.tidx() + T0_NAME;
            f.at(o)[0] = 0xc3;
            f.seal()
        }),
        ("tensor_duplicate_name", "BadIndex", |f| {
            let (a, b) = (f.tidx() + T0_NAME, f.tidx() + T1_NAME);
            let first: Vec<u8> = f.at(a)[..12].to_vec();
            f.at(b)[..12].copy_from_slice(&first);
            f.seal()
        }),
        ("tensor_unknown_dtype", "UnknownDtype", |f| {
            let o = f.tidx() + T0_DTYPE;
            f.at(o)[0] = 200;
            f.seal()
        }),
        ("tensor_too_many_dims", "TooLarge", |f| {
            let o = f.tidx() + T0_NDIM;
            f.at(o)[0] = 9;
            f.seal()
        }),
        ("tensor_size_mismatch", "SizeMismatch", |f| {
            let o = f.tidx() + T0_NBYTES;
            f.put64(o, 25);
            f.seal()
        }),
        ("tensor_shape_overflow", "Overflow", |f| {
            let o = f.tidx() + T0_DIM0;
            f.put64(o, u64::MAX / 2);
            f.seal()
        }),
        ("tensor_misaligned", "Misaligned", |f| {
            let o = f.tidx() + T0_OFF;
            f.put64(o, 4096 + 16);
            f.seal()
        }),
        ("tensor_outside_dense", "OutOfBounds", |f| {
            let (o, e) = (f.tidx() + T0_OFF, f.h.experts.off);
            f.put64(o, e);
            f.seal()
        }),
        ("tensors_overlap", "Overlap", |f| {
            let o = f.tidx() + T1_OFF;
            f.put64(o, 4096);
            f.seal()
        }),
        ("expert_unknown_scheme", "BadLayout", |f| {
            let o = f.eidx() + E_SCHEME;
            f.at(o)[0] = 7;
            f.seal()
        }),
        ("expert_layers_huge", "TooLarge", |f| {
            let o = f.eidx() + E_NLAYERS;
            f.at(o)[..4].copy_from_slice(&u32::MAX.to_le_bytes());
            f.seal()
        }),
        ("expert_outside_grid", "BadIndex", |f| {
            let o = f.eidx() + E1;
            f.at(o)[..4].copy_from_slice(&5u32.to_le_bytes());
            f.seal()
        }),
        ("expert_out_of_order", "BadIndex", |f| {
            let o = f.eidx() + E1 + 4;
            f.at(o)[..4].copy_from_slice(&0u32.to_le_bytes());
            f.seal()
        }),
        ("expert_slab_misaligned", "Misaligned", |f| {
            let o = f.eidx() + E0 + 8;
            let v = f.h.experts.off + 512;
            f.put64(o, v);
            f.seal()
        }),
        ("expert_slabs_overlap", "Overlap", |f| {
            let o = f.eidx() + E1 + 8;
            let v = f.h.experts.off;
            f.put64(o, v);
            f.seal()
        }),
        ("expert_past_section", "OutOfBounds", |f| {
            let o = f.eidx() + E1 + 16;
            f.put64(o, 1 << 30);
            f.seal()
        }),
        ("expert_projection_size", "SizeMismatch", |f| {
            let o = f.eidx() + E0 + 32;
            f.put64(o, 65);
            f.seal()
        }),
        ("expert_projection_misaligned", "Misaligned", |f| {
            let o = f.eidx() + E0 + 40;
            f.put64(o, 100);
            f.seal()
        }),
        ("expert_projections_overlap", "Overlap", |f| {
            let o = f.eidx() + E0 + 40;
            f.put64(o, 0);
            f.seal()
        }),
        ("expert_index_short", "BadIndex", |f| {
            f.h.expert_index.len -= 1;
            f.seal()
        }),
        ("tensor_data_corrupt", "TensorChecksum", |f| {
            f.b[4096 + 5] ^= 0x01;
        }),
        ("expert_data_corrupt", "ExpertChecksum", |f| {
            let o = f.h.experts.off + 4096 * 3 + 7;
            f.at(o)[0] ^= 0x80;
        }),
        ("expert_padding_corrupt", "ExpertChecksum", |f| {
            let o = f.h.experts.off + 4000;
            f.at(o)[0] = 1;
        }),
    ]
}

/// Opens the file and reads everything; returns the first error's variant name.
fn first_error(path: &Path) -> Option<String> {
    let run = || -> Result<(), FtwError> {
        let r = FtwReader::open(path)?;
        for t in r.tensors() {
            r.read_tensor(&t.name)?;
        }
        let mut scratch = Vec::new();
        for e in r.experts() {
            r.verify_expert(e.layer, e.expert, &mut scratch)?;
        }
        Ok(())
    };
    run().err().map(|e| {
        format!("{e:?}")
            .split([' ', '(', '{'])
            .next()
            .unwrap_or("")
            .to_owned()
    })
}

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hostile")
}

#[test]
fn every_hostile_file_is_rejected_with_its_error() {
    let dir = corpus_dir();
    if std::env::var_os("FTW_REGEN_CORPUS").is_some() {
        std::fs::create_dir_all(&dir).unwrap();
        let mut manifest = String::new();
        for (name, want, mutate) in cases() {
            let mut f = File::golden();
            mutate(&mut f);
            std::fs::write(dir.join(format!("{name}.ftw")), &f.b).unwrap();
            manifest.push_str(&format!("{name} {want}\n"));
        }
        std::fs::write(dir.join("expected.txt"), manifest).unwrap();
    }
    let manifest = std::fs::read_to_string(dir.join("expected.txt")).unwrap();
    let mut n = 0;
    for line in manifest.lines() {
        let (name, want) = line.split_once(' ').unwrap();
        let got = first_error(&dir.join(format!("{name}.ftw")));
        assert_eq!(got.as_deref(), Some(want), "{name}");
        n += 1;
    }
    assert!(
        n >= 25,
        "the corpus must hold at least 25 hostile files, has {n}"
    );
}

#[test]
fn the_golden_file_itself_passes() {
    let f = File::golden();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ok.ftw");
    std::fs::write(&p, &f.b).unwrap();
    assert_eq!(first_error(&p), None);
}

#[test]
fn every_case_mutates_something() {
    let golden = File::golden().b;
    for (name, _, mutate) in cases() {
        let mut f = File::golden();
        mutate(&mut f);
        assert_ne!(f.b, golden, "{name} leaves the file unchanged");
    }
}
