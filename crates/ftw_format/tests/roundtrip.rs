//! Property round-trip: whatever the writer accepts, the reader returns unchanged.
#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

mod common;

use ftw_format::{DType, ExpertLayout, FtwError, FtwReader, FtwWriter, ProjShape, Scheme};
use proptest::prelude::*;

fn scheme_strategy() -> impl Strategy<Value = Scheme> {
    prop_oneof![
        Just(Scheme::Raw(DType::BF16)),
        Just(Scheme::Raw(DType::F32)),
        Just(Scheme::Raw(DType::F16)),
        Just(Scheme::Int8),
        Just(Scheme::Int4 { group_size: 8 }),
    ]
}

fn dtype_strategy() -> impl Strategy<Value = DType> {
    proptest::sample::select(DType::ALL.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn write_then_read_is_identity(
        tensors in proptest::collection::vec((dtype_strategy(), proptest::collection::vec(0u64..6, 0..4), any::<u8>()), 0..6),
        scheme in scheme_strategy(),
        n_layers in 0u32..3,
        n_experts in 1u32..4,
        rows in 1u32..5,
        cols8 in 1u32..4,
        keep in proptest::collection::vec(any::<bool>(), 12),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.ftw");
        let mut w = FtwWriter::create(&path).unwrap();
        let mut written = Vec::new();
        for (i, (dtype, shape, seed)) in tensors.iter().enumerate() {
            let n = shape.iter().product::<u64>() * dtype.size();
            let data = common::pattern(n as usize, *seed);
            let name = format!("t{i}");
            w.add_tensor(&name, *dtype, shape, &data).unwrap();
            written.push((name, *dtype, shape.clone(), data));
        }
        let cols = cols8 * 8;
        let layout = ExpertLayout {
            n_layers,
            n_experts: if n_layers == 0 { 0 } else { n_experts },
            scheme: if n_layers == 0 { Scheme::Raw(DType::BF16) } else { scheme },
            proj: if n_layers == 0 { [ProjShape { rows: 0, cols: 0 }; 3] } else {
                [ProjShape { rows, cols }, ProjShape { rows, cols }, ProjShape { rows: cols, cols: rows * 8 }]
            },
        };
        w.begin_experts(layout).unwrap();
        let mut experts = Vec::new();
        for l in 0..layout.n_layers {
            for e in 0..layout.n_experts {
                if !keep[((l * 4 + e) as usize) % keep.len()] { continue; }
                let p: Vec<Vec<u8>> = (0..3).map(|p| common::pattern(layout.proj_bytes(p).unwrap() as usize, (l * 7 + e * 3) as u8 + p as u8)).collect();
                w.add_expert(l, e, [&p[0], &p[1], &p[2]]).unwrap();
                experts.push((l, e, p));
            }
        }
        w.finish(r#"{"k": [1, 2]}"#).unwrap();
        let r = FtwReader::open(&path).unwrap();
        prop_assert_eq!(r.metadata(), r#"{"k": [1, 2]}"#);
        prop_assert_eq!(r.tensors().len(), written.len());
        for (name, dtype, shape, data) in &written {
            let t = r.tensor(name).unwrap();
            prop_assert_eq!(t.dtype, *dtype);
            prop_assert_eq!(&t.shape, shape);
            prop_assert_eq!(&r.read_tensor(name).unwrap(), data);
        }
        prop_assert_eq!(*r.layout(), layout);
        prop_assert_eq!(r.experts().len(), experts.len());
        for (l, e, p) in &experts {
            let entry = *r.expert(*l, *e).unwrap();
            prop_assert_eq!(entry.off % 4096, 0);
            let mut slab = vec![0u8; entry.len as usize];
            r.read_expert_into(*l, *e, &mut slab).unwrap();
            for (i, span) in entry.proj.iter().enumerate() {
                prop_assert_eq!(span.off % 4096, 0);
                prop_assert_eq!(&slab[span.off as usize..(span.off + span.len) as usize], &p[i][..]);
            }
        }
        for l in 0..layout.n_layers {
            for e in 0..layout.n_experts {
                if !experts.iter().any(|x| x.0 == l && x.1 == e) {
                    let is_missing = matches!(r.expert(l, e), Err(FtwError::NoSuchExpert { .. }));
                    prop_assert!(is_missing);
                }
            }
        }
    }
}

#[test]
fn writer_rejects_misuse() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.ftw");
    let mut w = FtwWriter::create(&path).unwrap();
    assert!(matches!(
        w.add_tensor("a", DType::F32, &[2], &[0; 4]),
        Err(FtwError::SizeMismatch { .. })
    ));
    w.add_tensor("a", DType::F32, &[1], &[0; 4]).unwrap();
    assert!(matches!(
        w.add_tensor("a", DType::F32, &[1], &[0; 4]),
        Err(FtwError::InvalidArgument { .. })
    ));
    assert!(matches!(
        w.add_expert(0, 0, [&[], &[], &[]]),
        Err(FtwError::WriterState { .. })
    ));
    w.begin_experts(common::golden_layout()).unwrap();
    assert!(matches!(
        w.add_tensor("b", DType::F32, &[1], &[0; 4]),
        Err(FtwError::WriterState { .. })
    ));
    assert!(matches!(
        w.add_expert(0, 0, [&[0; 64], &[0; 64], &[0; 63]]),
        Err(FtwError::SizeMismatch { .. })
    ));
    assert!(matches!(
        w.add_expert(1, 0, [&[0; 64], &[0; 64], &[0; 64]]),
        Err(FtwError::InvalidArgument { .. })
    ));
    w.add_expert(0, 1, [&[0; 64], &[0; 64], &[0; 64]]).unwrap();
    assert!(matches!(
        w.add_expert(0, 0, [&[0; 64], &[0; 64], &[0; 64]]),
        Err(FtwError::InvalidArgument { .. })
    ));
    assert!(matches!(
        FtwWriter::create(&path).unwrap().finish("[1]"),
        Err(FtwError::InvalidJson { .. })
    ));
    drop(w);
    assert!(!path.exists(), "an unfinished writer leaves no file behind");
    assert!(
        !dir.path().join("m.ftw.partial").exists(),
        "and removes its .partial file"
    );
}

#[test]
fn golden_bytes_are_stable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("golden.ftw");
    common::write_golden(&path);
    let golden = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/tiny.ftw");
    let ours = std::fs::read(&path).unwrap();
    if std::env::var_os("FTW_UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(golden.parent().unwrap()).unwrap();
        std::fs::write(&golden, &ours).unwrap();
    }
    let theirs =
        std::fs::read(&golden).expect("tests/golden/tiny.ftw (FTW_UPDATE_GOLDEN=1 writes it)");
    assert!(
        ours == theirs,
        "writer output changed: bump FORMAT_VERSION or fix the writer"
    );
    let r = FtwReader::open(&golden).unwrap();
    assert_eq!(
        r.read_tensor("embed.weight").unwrap(),
        common::pattern(24, 1)
    );
    assert_eq!(r.header().file_size, theirs.len() as u64);
}
