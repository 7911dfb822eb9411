//! The usage table survives a save/load round trip, and a damaged, truncated or
//! foreign table is reported (for one printed line) and ignored, never fatal.

use std::path::PathBuf;

use expert_cache::{AdmitKind, AnyPolicy, CacheError, ExpertCache, PolicyKind, Result, UsageTable};

/// A fresh directory under the system temp dir, unique to this test and process.
fn scratch(name: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("flint-usage-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|source| CacheError::UsageIo {
        path: dir.clone(),
        source,
    })?;
    Ok(dir)
}

fn used_table() -> Result<UsageTable> {
    let mut c = ExpertCache::new(3, 5, 2, AnyPolicy::online(PolicyKind::Decay, 15)?)?;
    for (layer, expert, uses) in [(0, 4, 3), (2, 1, 1), (1, 0, 2)] {
        c.admit(layer, expert, AdmitKind::Demand)?;
        for _ in 1..uses {
            c.touch(layer, expert)?;
        }
    }
    Ok(c.usage().clone())
}

#[test]
fn round_trips_through_an_atomic_save() -> Result<()> {
    let dir = scratch("roundtrip")?;
    let path = UsageTable::path_for(&dir.join("model.ftw"));
    assert!(path.ends_with("model.ftw.usage"));
    let table = used_table()?;
    table.save(&path, 42)?;
    let back = UsageTable::load(&path, 3, 5, 42)?;
    assert_eq!(back, table);
    assert_eq!(
        (back.count(0, 4), back.count(1, 0), back.count(2, 1)),
        (3, 2, 1)
    );
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .map_err(|source| CacheError::UsageIo {
            path: dir.clone(),
            source,
        })?
        .collect();
    assert_eq!(leftovers.len(), 1, "no temporary file left behind");
    Ok(())
}

#[test]
fn a_corrupt_table_is_ignored_with_a_reason() -> Result<()> {
    let dir = scratch("corrupt")?;
    let path = dir.join("m.usage");
    let good = used_table()?.to_bytes(7);
    let flipped = {
        let mut b = good.clone();
        if let Some(byte) = b.get_mut(40) {
            *byte ^= 1;
        }
        b
    };
    let cases: [(&str, Vec<u8>); 4] = [
        ("checksum", flipped),
        (
            "truncated",
            good.get(..good.len() - 9).unwrap_or(&[]).to_vec(),
        ),
        ("empty", Vec::new()),
        (
            "garbage",
            b"not a usage table at all, just some text....".to_vec(),
        ),
    ];
    for (what, bytes) in cases {
        std::fs::write(&path, bytes).map_err(|source| CacheError::UsageIo {
            path: path.clone(),
            source,
        })?;
        let err = UsageTable::load(&path, 3, 5, 7);
        assert!(
            matches!(err, Err(CacheError::UsageCorrupt { .. })),
            "{what}: {err:?}"
        );
        let (table, ignored) = UsageTable::load_or_new(&path, 3, 5, 7)?;
        assert!(
            table.counts().iter().all(|&c| c == 0),
            "{what}: starts empty"
        );
        let line = ignored.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            line.contains("corrupt") && !line.contains('\n'),
            "{what}: one line, got {line:?}"
        );
    }
    Ok(())
}

#[test]
fn a_foreign_table_is_ignored_and_a_missing_one_is_silent() -> Result<()> {
    let dir = scratch("foreign")?;
    let path = dir.join("m.usage");
    used_table()?.save(&path, 7)?;
    for (layers, experts, key) in [(3, 5, 8), (3, 6, 7), (2, 5, 7)] {
        let err = UsageTable::load(&path, layers, experts, key);
        assert!(
            matches!(err, Err(CacheError::UsageForeign { .. })),
            "{layers}x{experts} key {key}"
        );
        let (_, ignored) = UsageTable::load_or_new(&path, layers, experts, key)?;
        assert!(ignored.is_some());
    }
    let (table, ignored) = UsageTable::load_or_new(&dir.join("absent.usage"), 3, 5, 7)?;
    assert!(ignored.is_none() && table.counts().len() == 15);
    Ok(())
}

#[test]
fn a_loaded_table_must_match_the_cache_geometry() -> Result<()> {
    let mut c = ExpertCache::new(3, 5, 2, AnyPolicy::online(PolicyKind::Lru, 15)?)?;
    c.set_usage(used_table()?)?;
    assert_eq!(c.usage().count(0, 4), 3);
    assert!(matches!(
        c.set_usage(UsageTable::new(2, 5)?),
        Err(CacheError::UsageForeign { .. })
    ));
    Ok(())
}
