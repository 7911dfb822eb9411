//! Helpers shared by the rule tests.

use expert_cache::{Admission, AdmitKind, AnyPolicy, ExpertCache, PolicyKind, Result};

/// Two layers of 16 experts, `capacity` slots each.
pub fn cache(capacity: usize, kind: PolicyKind) -> Result<ExpertCache<AnyPolicy>> {
    ExpertCache::new(2, 16, capacity, AnyPolicy::online(kind, 32)?)
}

/// Admits `experts` of layer 0 by demand, in order.
pub fn fill(c: &mut ExpertCache<AnyPolicy>, experts: &[u32]) -> Result<()> {
    for &e in experts {
        c.admit(0, e, AdmitKind::Demand)?;
    }
    Ok(())
}

/// The expert an admission evicted, if any.
pub fn evicted(a: Admission) -> Option<u32> {
    match a {
        Admission::Placed { evicted, .. } => evicted,
        Admission::Declined => None,
    }
}
