//! One test per value rule of the policies (see `src/decay.rs`, `src/lfu.rs`): use
//! counts, decay, unused prefetches, ties, prompt mode.

mod common;

use common::{cache, evicted, fill};
use expert_cache::{AdmitKind, Mode, PolicyKind, Result};

#[test]
fn decay_evicts_the_lowest_use_count() -> Result<()> {
    let mut c = cache(3, PolicyKind::Decay)?;
    fill(&mut c, &[1, 2, 3])?;
    c.touch(0, 1)?;
    c.touch(0, 3)?;
    // 2 has one use, 1 and 3 two: 2 leaves although 1 is less recently used.
    assert_eq!(evicted(c.admit(0, 4, AdmitKind::Demand)?), Some(2));
    Ok(())
}

#[test]
fn equal_values_go_to_the_least_recently_used() -> Result<()> {
    let mut c = cache(2, PolicyKind::Decay)?;
    fill(&mut c, &[3, 9])?;
    c.touch(0, 3)?;
    c.touch(0, 9)?;
    // Both have two uses; 3 was used less recently. The reverse order shows that
    // recency, not the id, decided.
    assert_eq!(evicted(c.admit(0, 5, AdmitKind::Demand)?), Some(3));
    let mut c = cache(2, PolicyKind::Decay)?;
    fill(&mut c, &[9, 3])?;
    assert_eq!(evicted(c.admit(0, 5, AdmitKind::Demand)?), Some(9));
    Ok(())
}

#[test]
fn counts_halve_every_64_tokens_so_old_heat_fades() -> Result<()> {
    let mut c = cache(2, PolicyKind::Decay)?;
    fill(&mut c, &[1, 2])?;
    for _ in 0..7 {
        c.touch(0, 1)?; // expert 1: 8 uses
    }
    for _ in 0..192 {
        c.tick(); // three halvings: 8 -> 1, and expert 2's single use -> 1/8
    }
    c.touch(0, 2)?;
    c.touch(0, 2)?; // expert 2: 2.125
    c.touch(0, 1)?; // expert 1: 2, and the most recent, so only decay can pick it
    assert_eq!(evicted(c.admit(0, 3, AdmitKind::Demand)?), Some(1));
    Ok(())
}

#[test]
fn an_unused_prefetch_is_worth_zero() -> Result<()> {
    let mut c = cache(2, PolicyKind::Decay)?;
    fill(&mut c, &[1])?;
    c.admit(0, 2, AdmitKind::Prefetch)?;
    c.start_layer(0)?; // the layer runs and does not pick expert 2
    assert_eq!(
        evicted(c.admit(0, 3, AdmitKind::Demand)?),
        Some(2),
        "more recent, but never used"
    );
    Ok(())
}

#[test]
fn prompt_mode_evicts_least_recently_used_whatever_the_counts() -> Result<()> {
    let mut c = cache(2, PolicyKind::Decay)?;
    fill(&mut c, &[1, 2])?;
    for _ in 0..5 {
        c.touch(0, 1)?;
    }
    c.touch(0, 2)?;
    c.set_mode(Mode::Prompt);
    assert_eq!(c.mode(), Mode::Prompt);
    assert_eq!(
        evicted(c.admit(0, 3, AdmitKind::Demand)?),
        Some(1),
        "decode would evict 2"
    );
    Ok(())
}

#[test]
fn a_long_prompt_batch_ages_away_the_previous_counts() -> Result<()> {
    let mut c = cache(2, PolicyKind::Decay)?;
    fill(&mut c, &[1, 2])?;
    for _ in 0..9 {
        c.touch(0, 1)?; // expert 1: 10 uses in the previous reply
    }
    c.set_mode(Mode::Prompt);
    c.prompt_batch(1024); // 16 halvings
    c.set_mode(Mode::Decode);
    c.touch(0, 2)?;
    c.touch(0, 2)?;
    c.touch(0, 1)?; // 1: about 1 use, and most recent; 2: about 2 uses
    assert_eq!(
        evicted(c.admit(0, 3, AdmitKind::Demand)?),
        Some(1),
        "unaged, 2 would go"
    );
    Ok(())
}

#[test]
fn lfu_keeps_all_time_counts_across_evictions() -> Result<()> {
    let mut c = cache(2, PolicyKind::Lfu)?;
    fill(&mut c, &[1, 2])?;
    c.touch(0, 1)?;
    c.touch(0, 1)?;
    c.evict(0, 1)?;
    c.admit(0, 1, AdmitKind::Demand)?; // 4 uses in all, least recent is 2 (1 use)
    c.touch(0, 2)?;
    assert_eq!(evicted(c.admit(0, 3, AdmitKind::Demand)?), Some(2));
    Ok(())
}
