"""``FtwSource``: a ``WeightSource`` over one .ftw file (docs/ftw-format.md).

Everything a model needs comes from the file: the config, generation config, tokenizer
and chat template from its metadata, dense tensors from its dense section, routed
experts from their slabs. Dense matrices stored as int8 (``flint convert
--dense-quant int8``) are dequantized here, once, at load: they are a small share of
the weights, stay resident in the model's dtype, and so run through the same code
as every other checkpoint; ``int8_matrix`` also hands them out as stored, for the
CUDA graph step's int8 products. Routed experts are offered both ways: dequantized
(``expert``, the ``WeightSource`` contract) and as the file's raw slab bytes
(``expert_slab``) for backends that compute on the quantized layout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from flint.format.reader import ExpertLayout, FtwFile
from flint.models.weights import ExpertWeights, special_tokens_of


class FtwSource:
    """An open .ftw model file; tensors are read (checksum verified) when asked for."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._file = FtwFile(self.path)
        meta = self._file.metadata
        self.config: dict[str, Any] = _dict(meta.get("config"))
        self.generation_config: dict[str, Any] = _dict(meta.get("generation_config"))
        tok = meta.get("tokenizer")
        self.tokenizer_json: str | None = tok if isinstance(tok, str) else None
        template = meta.get("chat_template")
        self.chat_template: str | None = template if isinstance(template, str) else None
        self.special_tokens: dict[str, str] = special_tokens_of(_dict(meta.get("tokenizer_config")))
        dense = _dict(_dict(meta.get("quant")).get("dense"))
        self._int8_dense: frozenset[str] = frozenset(dense.get("tensors") or ())

    @property
    def expert_layout(self) -> ExpertLayout | None:
        """The layout of every routed expert slab (None: the file holds no experts)."""
        return self._file.layout

    def has_tensor(self, name: str) -> bool:
        return name in self._file.tensors

    def tensor(self, name: str) -> torch.Tensor:
        """Dense tensor ``name``; int8-stored matrices come back as f32 ``q * scale``."""
        stored = self.int8_matrix(name)
        if stored is None:
            return self._file.tensor(name)
        q, scale = stored
        return q.float() * scale[:, None]

    def int8_matrix(self, name: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The int8-stored matrix ``name`` as stored: (q [rows, cols] int8, row scales
        [rows] f32); None when the file stores ``name`` otherwise."""
        if name not in self._int8_dense:
            return None
        q, scale = self._file.tensor(name), self._file.tensor(name + "_scale")
        if q.dtype != torch.int8 or q.ndim != 2 or scale.shape != (q.shape[0],):
            raise ValueError(f"{self.path}: int8 tensor {name!r} or its scale is malformed")
        return q, scale

    def expert(self, layer: int, expert: int) -> ExpertWeights:
        """One expert's gate, up and down (f32 for int8/int4 files, the stored dtype
        for raw ones)."""
        gate, up, down = self._file.expert(layer, expert)
        return ExpertWeights(gate=gate, up=up, down=down)

    def expert_slab(self, layer: int, expert: int) -> torch.Tensor:
        """The expert's slab exactly as stored (uint8, checksum verified); projection
        p is ``expert_layout.raw(slab, p)``."""
        return self._file.expert_slab(layer, expert)

    def close(self) -> None:
        """Releases the file (tensors already returned stay valid)."""
        self._file.close()


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}
