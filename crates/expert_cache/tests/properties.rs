//! Property tests: random call sequences against a shadow model of pins and
//! protection. After every call: capacity is never exceeded, slots are conserved
//! (every slot free, lent, or holding one expert that maps back to it), a pinned
//! expert is never evicted (nor lent), a protected one only by a demand when every
//! other candidate is protected too, lending never leaves a layer below its floor and
//! nothing is placed in a lent slot; and the same calls always give the same decisions.

use std::collections::{HashMap, HashSet};

use expert_cache::{Admission, AdmitKind, AnyPolicy, CacheError, ExpertCache, Mode, PolicyKind};
use proptest::prelude::*;

const LAYERS: usize = 2;
const EXPERTS: u32 = 8;

#[derive(Debug, Clone)]
enum Op {
    Admit(usize, u32, AdmitKind),
    Touch(usize, u32),
    Evict(usize, u32),
    Pin(usize, u32),
    Unpin(usize, u32),
    Protect(usize, u32),
    StartLayer(usize),
    Tick,
    PromptBatch(u64),
    SetMode(Mode),
    Lend(usize, usize),
    Reclaim,
}

fn op() -> impl Strategy<Value = Op> {
    let le = (0..LAYERS, 0..EXPERTS);
    let kind = prop_oneof![
        Just(AdmitKind::Demand),
        Just(AdmitKind::Prefetch),
        Just(AdmitKind::Fill)
    ];
    prop_oneof![
        6 => (le.clone(), kind).prop_map(|((l, e), k)| Op::Admit(l, e, k)),
        3 => le.clone().prop_map(|(l, e)| Op::Touch(l, e)),
        1 => le.clone().prop_map(|(l, e)| Op::Evict(l, e)),
        2 => le.clone().prop_map(|(l, e)| Op::Pin(l, e)),
        2 => le.clone().prop_map(|(l, e)| Op::Unpin(l, e)),
        2 => le.prop_map(|(l, e)| Op::Protect(l, e)),
        1 => (0..LAYERS).prop_map(Op::StartLayer),
        1 => Just(Op::Tick),
        1 => (0u64..200).prop_map(Op::PromptBatch),
        1 => prop_oneof![Just(Mode::Prompt), Just(Mode::Decode)].prop_map(Op::SetMode),
        1 => (0usize..6, 0usize..3).prop_map(|(n, keep)| Op::Lend(n, keep)),
        1 => Just(Op::Reclaim),
    ]
}

/// What the tests track beside the cache: pins and protections per (layer, expert).
#[derive(Default)]
struct Shadow {
    pins: HashMap<(usize, u32), u32>,
    protected: HashSet<(usize, u32)>,
}

/// Applies `op`, checks the eviction rules against the shadow, returns a summary of
/// the decision for the determinism check.
fn step(c: &mut ExpertCache<AnyPolicy>, s: &mut Shadow, op: &Op) -> Result<String, TestCaseError> {
    let out = match *op {
        Op::Admit(l, e, kind) => {
            let resident = c.resident(l).map_err(fail)?;
            let full = c.free_slots(l).map_err(fail)? == 0;
            let out = c.admit(l, e, kind);
            if let Ok(Admission::Placed {
                evicted: Some(v), ..
            }) = out
            {
                prop_assert!(full, "evicted {v} with a free slot");
                prop_assert_eq!(
                    s.pins.get(&(l, v)).copied().unwrap_or(0),
                    0,
                    "evicted pinned {}",
                    v
                );
                if s.protected.contains(&(l, v)) {
                    prop_assert_eq!(
                        kind,
                        AdmitKind::Demand,
                        "a prefetch evicted protected {}",
                        v
                    );
                    for &(_, other) in &resident {
                        let free = s.pins.get(&(l, other)).copied().unwrap_or(0) == 0;
                        prop_assert!(
                            !free || s.protected.contains(&(l, other)),
                            "evicted protected {v} while {other} was not"
                        );
                    }
                }
                s.protected.remove(&(l, v));
            }
            let candidates = resident
                .iter()
                .filter(|&&(_, x)| s.pins.get(&(l, x)).copied().unwrap_or(0) == 0);
            match &out {
                Err(CacheError::AllPinned { .. }) => prop_assert!(full && candidates.count() == 0),
                Ok(Admission::Declined) => {
                    let mut candidates = candidates;
                    prop_assert!(
                        full && (kind == AdmitKind::Fill
                            || candidates.all(|&(_, x)| s.protected.contains(&(l, x))))
                    );
                }
                Ok(Admission::Placed { .. }) if kind == AdmitKind::Prefetch => {
                    s.protected.insert((l, e));
                }
                _ => {}
            }
            format!("{out:?}")
        }
        Op::Touch(l, e) => format!("{:?}", c.touch(l, e)),
        Op::Evict(l, e) => {
            let out = c.evict(l, e);
            if out.is_ok() {
                prop_assert_eq!(s.pins.get(&(l, e)).copied().unwrap_or(0), 0);
                s.protected.remove(&(l, e));
            }
            format!("{out:?}")
        }
        Op::Pin(l, e) => {
            let out = c.pin(l, e);
            if out.is_ok() {
                *s.pins.entry((l, e)).or_default() += 1;
            }
            format!("{out:?}")
        }
        Op::Unpin(l, e) => {
            let out = c.unpin(l, e);
            if out.is_ok() {
                *s.pins.entry((l, e)).or_default() -= 1;
            }
            format!("{out:?}")
        }
        Op::Protect(l, e) => {
            let out = c.protect(l, e);
            if out.is_ok() {
                s.protected.insert((l, e));
            }
            format!("{out:?}")
        }
        Op::StartLayer(l) => {
            s.protected.retain(|&(layer, _)| layer != l);
            format!("{:?}", c.start_layer(l))
        }
        Op::Tick => {
            s.protected.clear();
            c.tick();
            String::new()
        }
        Op::PromptBatch(n) => {
            s.protected.clear();
            c.prompt_batch(n);
            String::new()
        }
        Op::SetMode(m) => {
            c.set_mode(m);
            String::new()
        }
        Op::Lend(n, keep) => {
            let before: Vec<usize> = (0..LAYERS)
                .map(|l| c.usable_slots(l))
                .collect::<Result<_, _>>()
                .map_err(fail)?;
            let lent = c.lend(n, keep);
            prop_assert!(lent.len() <= n);
            for x in &lent {
                if let Some(e) = x.evicted {
                    prop_assert_eq!(s.pins.get(&(x.layer, e)).copied().unwrap_or(0), 0);
                    s.protected.remove(&(x.layer, e));
                }
            }
            for (l, &was) in before.iter().enumerate() {
                let now = c.usable_slots(l).map_err(fail)?;
                let taken = lent.iter().filter(|x| x.layer == l).count();
                prop_assert_eq!(now + taken, was);
                prop_assert!(taken == 0 || now >= keep.max(1), "below the floor");
            }
            format!("{lent:?}")
        }
        Op::Reclaim => format!("{:?}", c.reclaim()),
    };
    check_slots(c)?;
    Ok(out)
}

fn fail(e: CacheError) -> TestCaseError {
    TestCaseError::fail(e.to_string())
}

/// Capacity and conservation of slots in every layer.
fn check_slots(c: &ExpertCache<AnyPolicy>) -> Result<(), TestCaseError> {
    for l in 0..LAYERS {
        let resident = c.resident(l).map_err(fail)?;
        let usable = c.usable_slots(l).map_err(fail)?;
        prop_assert!(resident.len() <= usable, "an expert in a lent slot");
        prop_assert_eq!(
            resident.len() + c.free_slots(l).map_err(fail)? + c.lent_slots(l).map_err(fail)?,
            c.capacity()
        );
        prop_assert!(usable >= 1);
        let slots: HashSet<u32> = resident.iter().map(|&(s, _)| s).collect();
        let experts: HashSet<u32> = resident.iter().map(|&(_, e)| e).collect();
        prop_assert_eq!(
            (slots.len(), experts.len()),
            (resident.len(), resident.len())
        );
        for &(slot, e) in &resident {
            prop_assert!((slot as usize) < c.capacity());
            prop_assert_eq!(c.lookup(l, e).map_err(fail)?, Some(slot));
        }
        for e in (0..EXPERTS).filter(|e| !experts.contains(e)) {
            prop_assert_eq!(c.lookup(l, e).map_err(fail)?, None);
        }
    }
    Ok(())
}

fn run(kind: PolicyKind, capacity: usize, ops: &[Op]) -> Result<Vec<String>, TestCaseError> {
    let policy = AnyPolicy::online(kind, LAYERS * EXPERTS as usize).map_err(fail)?;
    let mut c = ExpertCache::new(LAYERS, EXPERTS, capacity, policy).map_err(fail)?;
    let mut shadow = Shadow::default();
    ops.iter().map(|op| step(&mut c, &mut shadow, op)).collect()
}

fn online() -> impl Strategy<Value = PolicyKind> {
    prop_oneof![
        Just(PolicyKind::Lru),
        Just(PolicyKind::Lfu),
        Just(PolicyKind::Decay)
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn rules_hold_for_any_call_sequence(kind in online(), capacity in 1usize..6, ops in prop::collection::vec(op(), 0..120)) {
        run(kind, capacity, &ops)?;
    }

    #[test]
    fn same_calls_give_same_decisions(kind in online(), capacity in 1usize..6, ops in prop::collection::vec(op(), 0..120)) {
        prop_assert_eq!(run(kind, capacity, &ops)?, run(kind, capacity, &ops)?);
    }
}
