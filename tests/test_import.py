"""What ``import flint`` costs beyond ``import torch``: every CLI command and embedding
program pays it at start."""

from __future__ import annotations

import subprocess
import sys

_HEAVY = ("torch._dynamo", "torch._inductor")


def _loaded(module: str) -> set[str]:
    code = f"import sys, {module}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_import_flint_leaves_torch_dynamo_unloaded() -> None:
    """torch.nn.attention.bias pulled in torch._dynamo at import: 1.3 of `import flint`'s
    3.4 s on the CPU box (now imported where a CUDA prompt first needs it)."""
    extra = _loaded("flint") - _loaded("torch")
    heavy = sorted(m for m in extra if m.split(".")[0:2] in [h.split(".") for h in _HEAVY])
    assert not heavy, f"import flint loads {heavy[:5]}"
