//! A routing trace in memory: for each token and layer, the top-k expert ids in router
//! rank order (the `experts` array of `../shared/traces/*.npz`), validated once so the
//! replay can index it without checks failing later.

use crate::error::{CacheError, Result};

/// Validated routing trace, `[token, layer, rank]` flattened row-major.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    experts: Vec<u16>,
    n_tokens: usize,
    n_layers: usize,
    top_k: usize,
    n_experts: u32,
}

impl Trace {
    /// Checks shape, id range and that no token repeats an expert within a layer.
    pub fn new(
        experts: Vec<u16>,
        n_tokens: usize,
        n_layers: usize,
        top_k: usize,
        n_experts: u32,
    ) -> Result<Self> {
        for (what, n) in [
            ("layers", n_layers),
            ("top-k", top_k),
            ("experts", n_experts as usize),
        ] {
            if n == 0 {
                return Err(CacheError::Zero { what });
            }
        }
        if u32::try_from(n_tokens).is_err() {
            return Err(CacheError::Overflow {
                what: "trace tokens (at most 2^32)",
            });
        }
        let expected = n_tokens
            .checked_mul(n_layers)
            .and_then(|n| n.checked_mul(top_k))
            .ok_or(CacheError::Overflow {
                what: "trace shape",
            })?;
        if experts.len() != expected {
            return Err(CacheError::TraceShape {
                len: experts.len(),
                n_tokens,
                n_layers,
                top_k,
                expected,
            });
        }
        for (row, chunk) in experts.chunks_exact(top_k).enumerate() {
            let (token, layer) = (row / n_layers, row % n_layers);
            for (rank, &e) in chunk.iter().enumerate() {
                let problem = if u32::from(e) >= n_experts {
                    "out of range"
                } else if chunk.get(..rank).is_some_and(|before| before.contains(&e)) {
                    "repeated"
                } else {
                    continue;
                };
                return Err(CacheError::TraceExpert {
                    token,
                    layer,
                    expert: u32::from(e),
                    problem,
                });
            }
        }
        Ok(Self {
            experts,
            n_tokens,
            n_layers,
            top_k,
            n_experts,
        })
    }

    /// Parses little-endian int16 ids (numpy `<i2`, as the trace files store them).
    pub fn from_le_i16(
        bytes: &[u8],
        n_tokens: usize,
        n_layers: usize,
        top_k: usize,
        n_experts: u32,
    ) -> Result<Self> {
        let per_token = n_layers.saturating_mul(top_k).max(1);
        let mut experts = Vec::with_capacity(bytes.len() / 2);
        for (i, pair) in bytes.chunks(2).enumerate() {
            let id = match pair {
                [lo, hi] => i16::from_le_bytes([*lo, *hi]),
                _ => {
                    let expected = n_tokens.saturating_mul(per_token);
                    return Err(CacheError::TraceShape {
                        len: i,
                        n_tokens,
                        n_layers,
                        top_k,
                        expected,
                    });
                }
            };
            let Ok(id) = u16::try_from(id) else {
                let (token, layer) = (i / per_token, (i % per_token) / top_k.max(1));
                let expert = id as u32; // shows the negative id's bit pattern
                return Err(CacheError::TraceExpert {
                    token,
                    layer,
                    expert,
                    problem: "negative",
                });
            };
            experts.push(id);
        }
        Self::new(experts, n_tokens, n_layers, top_k, n_experts)
    }

    /// Tokens.
    pub fn n_tokens(&self) -> usize {
        self.n_tokens
    }
    /// Layers.
    pub fn n_layers(&self) -> usize {
        self.n_layers
    }
    /// Experts selected per token and layer.
    pub fn top_k(&self) -> usize {
        self.top_k
    }
    /// Experts per layer.
    pub fn n_experts(&self) -> u32 {
        self.n_experts
    }

    /// The experts `token` selected in `layer`, rank 0 first; empty when out of range.
    pub fn selection(&self, token: usize, layer: usize) -> &[u16] {
        let start = (token * self.n_layers + layer) * self.top_k;
        self.experts.get(start..start + self.top_k).unwrap_or(&[])
    }

    /// Every selection as `(token, layer * n_experts + expert)`, in token order.
    pub(crate) fn uses(&self) -> impl Iterator<Item = (u32, usize)> + '_ {
        let per_token = self.n_layers * self.top_k;
        self.experts.iter().enumerate().map(move |(i, &e)| {
            let layer = (i % per_token) / self.top_k;
            (
                (i / per_token) as u32,
                layer * self.n_experts as usize + usize::from(e),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_range_and_repeats_are_checked() {
        assert!(Trace::new(vec![0, 1, 2, 3], 1, 2, 2, 4).is_ok());
        assert!(matches!(
            Trace::new(vec![0, 1, 2], 1, 2, 2, 4),
            Err(CacheError::TraceShape { .. })
        ));
        let out = Trace::new(vec![0, 1, 2, 4], 1, 2, 2, 4);
        assert!(matches!(
            out,
            Err(CacheError::TraceExpert {
                layer: 1,
                expert: 4,
                ..
            })
        ));
        let rep = Trace::new(vec![0, 1, 3, 3], 1, 2, 2, 4);
        assert!(matches!(
            rep,
            Err(CacheError::TraceExpert {
                problem: "repeated",
                ..
            })
        ));
    }

    #[test]
    fn negative_ids_and_odd_lengths_are_rejected() {
        let neg = [1u8, 0, 0xff, 0xff];
        assert!(matches!(
            Trace::from_le_i16(&neg, 1, 1, 2, 64),
            Err(CacheError::TraceExpert { .. })
        ));
        assert!(matches!(
            Trace::from_le_i16(&[1, 0, 2], 1, 1, 2, 64),
            Err(CacheError::TraceShape { .. })
        ));
        let ok = Trace::from_le_i16(&[1, 0, 2, 0], 1, 1, 2, 64);
        assert_eq!(
            ok.map(|t| t.selection(0, 0).to_vec()).ok(),
            Some(vec![1, 2])
        );
    }
}
