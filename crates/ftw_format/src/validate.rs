//! Placement rules the reader enforces before trusting an index: every extent inside
//! its region, on its boundary, and overlapping nothing.

use std::collections::HashMap;

use crate::consts::{ALIGN, HEADER_PAGE, HEADER_STRUCT_SIZE};
use crate::error::{FtwError, Result};
use crate::header::{Extent, Header};
use crate::index::{ExpertEntry, TensorEntry};
use crate::layout::{ExpertLayout, PROJ_NAMES};

/// Sections lie between the header page and the footer, the data sections start on
/// 4 KiB boundaries, and no two non-empty sections overlap.
pub(crate) fn check_sections(h: &Header) -> Result<()> {
    let (lo, hi) = (HEADER_PAGE, h.file_size - HEADER_STRUCT_SIZE as u64);
    let sections = [
        ("metadata", h.metadata),
        ("tensor index", h.tensor_index),
        ("expert index", h.expert_index),
        ("dense section", h.dense),
        ("expert section", h.experts),
    ];
    for (name, e) in [("dense section", h.dense), ("expert section", h.experts)] {
        aligned(name, e.off, ALIGN)?;
    }
    let mut spans = Vec::new();
    for (name, e) in sections {
        let end = e
            .end()
            .ok_or_else(|| FtwError::Overflow { what: name.into() })?;
        if e.len == 0 {
            continue;
        }
        within(name, e.off, end, "the file body", lo, hi)?;
        spans.push((e.off, end, name.to_owned()));
    }
    no_overlap(spans)
}

/// Tensor names are unique; each tensor is aligned, inside the dense section and
/// overlaps no other. Returns name -> position.
pub(crate) fn check_tensors(
    tensors: &[TensorEntry],
    dense: Extent,
) -> Result<HashMap<String, usize>> {
    let hi = dense.end().ok_or_else(|| FtwError::Overflow {
        what: "dense section".into(),
    })?;
    let mut by_name = HashMap::with_capacity(tensors.len());
    let mut spans = Vec::with_capacity(tensors.len());
    for (i, t) in tensors.iter().enumerate() {
        let what = format!("tensor {:?}", t.name);
        if by_name.insert(t.name.clone(), i).is_some() {
            return Err(FtwError::BadIndex {
                index: "tensor index",
                detail: format!("duplicate {what}"),
            });
        }
        aligned(&what, t.off, ALIGN)?;
        let end = t
            .off
            .checked_add(t.nbytes)
            .ok_or_else(|| FtwError::Overflow { what: what.clone() })?;
        within(&what, t.off, end, "the dense section", dense.off, hi)?;
        spans.push((t.off, end, what));
    }
    no_overlap(spans)?;
    Ok(by_name)
}

/// Experts are in the grid, in strictly ascending id, each slab aligned and inside the
/// expert section, overlapping no other; projections aligned, of the layout's exact
/// size, in order inside their slab.
pub(crate) fn check_experts(
    layout: &ExpertLayout,
    experts: &[ExpertEntry],
    section: Extent,
) -> Result<()> {
    let hi = section.end().ok_or_else(|| FtwError::Overflow {
        what: "expert section".into(),
    })?;
    let sizes = [
        layout.proj_bytes(0)?,
        layout.proj_bytes(1)?,
        layout.proj_bytes(2)?,
    ];
    let mut spans = Vec::with_capacity(experts.len());
    let mut prev: Option<u64> = None;
    for e in experts {
        let what = format!("expert ({}, {})", e.layer, e.expert);
        if e.layer >= layout.n_layers || e.expert >= layout.n_experts {
            return Err(bad_expert(format!(
                "{what} outside the {}x{} grid",
                layout.n_layers, layout.n_experts
            )));
        }
        let id = e.id(layout.n_experts);
        if prev.is_some_and(|p| p >= id) {
            return Err(bad_expert(format!(
                "{what} is out of ascending order or repeated"
            )));
        }
        prev = Some(id);
        aligned(&what, e.off, ALIGN)?;
        if e.len == 0 {
            return Err(bad_expert(format!("{what} has an empty slab")));
        }
        aligned(&format!("length of {what}"), e.len, ALIGN)?;
        let end = e
            .off
            .checked_add(e.len)
            .ok_or_else(|| FtwError::Overflow { what: what.clone() })?;
        within(&what, e.off, end, "the expert section", section.off, hi)?;
        check_projections(e, &sizes, &what)?;
        spans.push((e.off, end, what));
    }
    no_overlap(spans)
}

fn check_projections(e: &ExpertEntry, sizes: &[u64; 3], what: &str) -> Result<()> {
    let mut floor = 0u64;
    for (p, span) in e.proj.iter().enumerate() {
        let name = format!("{} projection of {what}", PROJ_NAMES.get(p).unwrap_or(&"?"));
        aligned(&name, span.off, ALIGN)?;
        let want = sizes.get(p).copied().unwrap_or(0);
        if span.len != want {
            return Err(FtwError::SizeMismatch {
                what: name,
                expected: want,
                found: span.len,
            });
        }
        let end = span
            .off
            .checked_add(span.len)
            .ok_or_else(|| FtwError::Overflow { what: name.clone() })?;
        if span.off < floor {
            return Err(FtwError::Overlap {
                first: "the previous projection".into(),
                second: name,
            });
        }
        within(&name, span.off, end, "its slab", 0, e.len)?;
        floor = end;
    }
    Ok(())
}

fn aligned(what: &str, value: u64, align: u64) -> Result<()> {
    if value.is_multiple_of(align) {
        Ok(())
    } else {
        Err(FtwError::Misaligned {
            what: what.to_owned(),
            value,
            align,
        })
    }
}

fn within(what: &str, start: u64, end: u64, region: &'static str, lo: u64, hi: u64) -> Result<()> {
    if start >= lo && end <= hi {
        Ok(())
    } else {
        Err(FtwError::OutOfBounds {
            what: what.to_owned(),
            start,
            end,
            region,
            lo,
            hi,
        })
    }
}

fn no_overlap(mut spans: Vec<(u64, u64, String)>) -> Result<()> {
    spans.sort_by_key(|s| (s.0, s.1));
    for pair in spans.windows(2) {
        if let [a, b] = pair {
            if a.1 > b.0 {
                return Err(FtwError::Overlap {
                    first: a.2.clone(),
                    second: b.2.clone(),
                });
            }
        }
    }
    Ok(())
}

fn bad_expert(detail: String) -> FtwError {
    FtwError::BadIndex {
        index: "expert index",
        detail,
    }
}
