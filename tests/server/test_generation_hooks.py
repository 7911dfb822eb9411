"""The two generation hooks the server relies on: logprobs and cancel."""

from __future__ import annotations

import threading

import torch

import flint
from flint.generation import generate_stream, token_logprob


def test_token_logprob_matches_log_softmax() -> None:
    logits = torch.tensor([1.0, 3.0, 2.0, 9.0])  # the last is a padded head, cut off
    lp = token_logprob(logits, 2, vocab=3, top=2)
    ref = torch.log_softmax(logits[:3], -1)
    assert lp.token_id == 2 and abs(lp.logprob - float(ref[2])) < 1e-6
    assert [i for i, _ in lp.top] == [1, 2]
    assert token_logprob(logits, 0, vocab=3, top=0).top == ()


def test_logprobs_one_per_token_and_greedy_is_top(llm: flint.LLM) -> None:
    params = llm.sampling_params(max_tokens=10, temperature=0.0, ignore_eos=True)
    ids = llm.tokenizer.encode("def main(argv):\n")
    chunks = list(generate_stream(llm.model, llm.tokenizer, ids, params, logprobs=3))
    lps = [lp for c in chunks for lp in c.logprobs]
    assert [lp.token_id for lp in lps] == [t for c in chunks for t in c.token_ids]
    assert all(lp.top[0] == (lp.token_id, lp.logprob) and len(lp.top) == 3 for lp in lps)
    plain = list(generate_stream(llm.model, llm.tokenizer, ids, params))
    assert all(c.logprobs == () for c in plain)
    assert [c.text for c in plain] == [c.text for c in chunks]


def test_cancel_stops_before_the_next_token(llm: flint.LLM) -> None:
    params = llm.sampling_params(max_tokens=60, temperature=0.0, ignore_eos=True)
    cancel = threading.Event()
    seen = 0
    for chunk in generate_stream(llm.model, llm.tokenizer, [5, 6, 7], params, cancel=cancel):
        seen += len(chunk.token_ids)
        cancel.set()
        assert chunk.finish_reason is None
    assert 1 <= seen < 60
