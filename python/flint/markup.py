"""Markup that output parsers read although tokenizers call it special.

Decoding skips special tokens, so these are kept where the family writes them
(``Tokenizer.keep_special_tokens``); the chat and server parsers then take them out
of what users see. Other families decode exactly as before (nothing kept).
"""

from __future__ import annotations

# GPT-OSS's harmony format (flint.harmony).
HARMONY_MARKERS = (
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|constrain|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
)
# Kimi K2's tool calls (flint.server.tools.KimiToolSyntax).
KIMI_TOOL_MARKERS = (
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
)
_BY_FAMILY = {"gpt_oss": HARMONY_MARKERS, "kimi_k2": KIMI_TOOL_MARKERS}


def kept_special(model_type: object) -> tuple[str, ...]:
    """The special tokens a family's output is parsed by (config ``model_type``)."""
    return _BY_FAMILY.get(str(model_type), ())
