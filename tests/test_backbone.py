"""The backbone stage by stage against the reference, plus property tests against the ONNX
sub-models of the tiny checkpoint.

Tolerance: fused embeddings are gathers and a sum of 8 rows, so they match to float32 rounding
(measured: bit-equal). Hidden states, final hidden states and logits must satisfy
max|ours - ref| <= 1e-5 * max|ref| (measured on tiny-random: 4e-7 after layer 0, 2.6e-6 after
the last of three layers, 4.4e-6 after the final norm, 1.4e-6 on the logits); the reference's
own float32 rounding is of the same size (a float64 run of our code lands as far from it).
"""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import read_safetensors, require_file, require_module
from omnicore.model import backbone as bb
from omnicore.model import jit, kernels
from omnicore.model.fast_profile import make_prompt_cache
from omnicore.errors import WeightsError
from omnicore.machinery import checkpoint
from omnicore.machinery.checkpoint import RowTable
from omnicore.model.weights import ParamReader

ROOT = Path(__file__).resolve().parents[1]
CKPT = ROOT / "weights" / "tiny-random"
FIX = ROOT / "tests" / "fixtures" / "reference"
ONNX = ROOT / "tests" / "fixtures" / "onnx"
# max |diff| / max |reference| against the float32 fixtures and ONNX Runtime: GEMMs of other
# shapes and orders round differently; hypothesis has drawn batches up to 1.05e-5 here.
RTOL = 3e-5


def rel_err(got, want):
    return float(np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max())


@pytest.fixture(scope="module")
def batch():
    with np.load(FIX / "backbone_batch.npz", allow_pickle=False) as z:
        return dict(z)


def packed_rows(batch):
    """The fixture's rows (cond 0..B-1, then uncond 0..B-1) packed as the reference dump did."""
    B = len(batch["row_lengths"]) // 2
    conds = [(batch[f"item{b}_input_ids"], batch[f"item{b}_audio_mask"]) for b in range(B)]
    T = [int(batch[f"item{b}_num_target"]) for b in range(B)]
    unconds = [(ids[:, -t:], m[-t:]) for (ids, m), t in zip(conds, T)]
    rows = conds + unconds
    ids = np.concatenate([r[0] for r in rows], axis=1)
    mask = np.concatenate([r[1] for r in rows])
    return ids, mask, [r[0].shape[1] for r in rows], T


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------


def test_params_keep_the_checkpoint_layout(params, cfg):
    q = cfg.llm_config
    lp = params.layers[0]
    assert len(params.layers) == q.num_hidden_layers
    # [out, in] as stored: the model multiplies by W.T, so nothing is transposed or copied
    assert lp.q_proj.shape == (q.num_attention_heads * q.head_dim, q.hidden_size)
    assert lp.o_proj.shape == (q.hidden_size, q.num_attention_heads * q.head_dim)
    assert lp.down_proj.shape == (q.hidden_size, q.intermediate_size)
    assert params.audio_heads.shape == (cfg.num_audio_codebook * cfg.audio_vocab_size, q.hidden_size)
    raw = read_safetensors(CKPT / "model.safetensors")
    np.testing.assert_array_equal(lp.gate_proj, raw["llm.layers.0.mlp.gate_proj.weight"])
    assert all(a.dtype == np.float32 for a in (lp.q_proj, params.embed_tokens, params.norm))
    # private read-only copies (a memory map truncated under a loaded model is a SIGBUS); the
    # text embedding table stays on disk and is read by rows
    for a in (lp.q_proj, lp.down_proj, params.audio_heads):
        assert not isinstance(a.base, np.memmap) and not a.flags.writeable
    assert isinstance(params.embed_tokens, RowTable)
    np.testing.assert_array_equal(params.embed_tokens[np.array([5, 0, 5])],
                                  raw["llm.embed_tokens.weight"][[5, 0, 5]])


def test_missing_misshaped_or_bad_tensors_raise(cfg):
    raw = dict(read_safetensors(CKPT / "model.safetensors"))
    broken = {k: v for k, v in raw.items() if k != "llm.layers.1.self_attn.k_norm.weight"}
    with pytest.raises(WeightsError, match="k_norm"):
        bb.load_params(ParamReader(broken, "x.safetensors"), cfg)
    broken = dict(raw, **{"audio_heads.weight": raw["audio_heads.weight"][:-1]})
    with pytest.raises(WeightsError, match="audio_heads"):
        bb.load_params(ParamReader(broken, "x.safetensors"), cfg)
    broken = dict(raw, codebook_layer_offsets=np.arange(8, dtype=np.int64) * 1024)
    with pytest.raises(WeightsError, match="codebook_layer_offsets"):
        bb.load_params(ParamReader(broken, "x.safetensors"), cfg)


# ---------------------------------------------------------------------------------------------
# Against the reference dump
# ---------------------------------------------------------------------------------------------


def test_fixture_is_not_degenerate(batch):
    lengths = batch["row_lengths"]
    e = batch["embeds"]
    assert len(lengths) == 6 and e.shape[0] == lengths.sum()
    # rows and positions really differ; a constant hidden state would hide RoPE/mask bugs
    h = batch["final_hidden"]
    assert np.std(h, axis=0).mean() > 0.1 * np.std(h)
    lg = batch["item1_cond_logits"]
    assert (lg.argmax(-1) != lg.argmax(-1)[:, :1]).any()


def test_embeddings_match_reference(params, cfg, batch):
    ids, mask, _, _ = packed_rows(batch)
    x = bb.embed(params, cfg, ids, mask)
    assert x.dtype == np.float32
    np.testing.assert_allclose(x, batch["embeds"], rtol=1e-6, atol=1e-7)


def test_hidden_states_and_logits_match_reference(params, cfg, batch):
    ids, mask, lengths, T = packed_rows(batch)
    pack = bb.make_packing(lengths, cfg)
    x = batch["embeds"]
    kept = set(batch["kept_layers"].tolist())
    for i, lp in enumerate(params.layers):
        x = bb.hidden_states(replace(params, layers=(lp,)), cfg, x, pack).copy()  # layer i alone
        if i in kept:
            err = rel_err(x, batch[f"hidden_layer{i}"])
            assert err <= RTOL, f"layer {i}: relative error {err:.2e}"
    final = kernels.rms_norm(x, params.norm, cfg.llm_config.rms_norm_eps)
    assert rel_err(final, batch["final_hidden"]) <= RTOL

    logits = bb.forward_rows(params, cfg, ids, mask, pack, T * 2)
    B = len(T)
    assert logits[1].shape == (cfg.num_audio_codebook, T[1], cfg.audio_vocab_size)
    assert rel_err(logits[1], batch["item1_cond_logits"]) <= RTOL
    assert rel_err(logits[B + 1], batch["item1_uncond_logits"]) <= RTOL


def test_rows_are_independent_of_packing(params, cfg, batch):
    """A row run alone, or packed between others, gives the same logits: no padding, no leak."""
    ids, mask, lengths, T = packed_rows(batch)
    pack = bb.make_packing(lengths, cfg)
    together = bb.forward_rows(params, cfg, ids, mask, pack, T * 2)
    start = 0
    for r, L in enumerate(lengths):
        alone = bb.forward_rows(params, cfg, ids[:, start:start + L], mask[start:start + L],
                                bb.make_packing([L], cfg), [(T * 2)[r]])
        np.testing.assert_allclose(alone[0], together[r], rtol=0, atol=1e-5 * np.abs(together[r]).max())
        start += L


def _one_query_head_per_kv_head(params, cfg):
    """The checkpoint cut to the first query head of each kv head (G = 1)."""
    q = cfg.llm_config
    G, E = q.num_attention_heads // q.num_key_value_heads, q.head_dim
    cols = (np.arange(q.num_key_value_heads)[:, None] * G * E + np.arange(E)).ravel()
    layers = tuple(replace(lp, q_proj=np.ascontiguousarray(lp.q_proj[cols]),
                                       o_proj=np.ascontiguousarray(lp.o_proj[:, cols]))
                   for lp in params.layers)
    llm = replace(q, num_attention_heads=q.num_key_value_heads)
    return replace(params, layers=layers), replace(cfg, llm_config=llm)


@pytest.mark.parametrize("group", ["checkpoint", "one query head per kv head"])
def test_batched_device_attention_equals_the_row_loop(params, cfg, batch, monkeypatch, group):
    """Device backends run attention as one padded batch; same logits as the per-row loop
    (to the rounding of GEMMs of another shape) and as the reference. With one query head per
    kv head the batched scores come out of matmul in another memory layout."""
    if group != "checkpoint":
        params, cfg = _one_query_head_per_kv_head(params, cfg)
    ids, mask, lengths, T = packed_rows(batch)
    pack = bb.make_packing(lengths, cfg)
    loop = bb.forward_rows(params, cfg, ids, mask, pack, T * 2)
    monkeypatch.setattr(bb._attend, "_run", bb._attend.twin)  # what a device backend selects
    batched = bb.forward_rows(params, cfg, ids, mask, pack, T * 2)
    assert len(set(lengths)) > 1  # rows of different lengths: padding is really exercised
    for a, b in zip(batched, loop):
        assert rel_err(a, b) <= 5e-6  # measured <= 7.6e-7 (OpenBLAS Haswell)
    if group == "checkpoint":
        assert rel_err(batched[1], batch["item1_cond_logits"]) <= RTOL


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
def test_the_fused_layer_is_the_readable_layer_bit_for_bit(cfg, batch, precision):
    """hidden_states runs `_layer_fused` (each residual add fused with the next norm, in the
    workspace's buffers); `decoder_layer` is the layer as written to be read. The same
    operations in the same order: equal bit for bit, every layer, any precision profile."""
    params = bb.load_params(checkpoint.open_params(CKPT / "model.safetensors"), cfg, precision)
    ids, mask, lengths, _ = packed_rows(batch)
    pack = bb.make_packing(lengths, cfg)
    x = bb.embed(params, cfg, ids, mask)
    work = bb.make_workspace(cfg, pack)
    fused = bb.hidden_states(params, cfg, x, pack, work).copy()
    readable = x
    for lp in params.layers:
        readable = bb.decoder_layer(lp, cfg, readable, pack, work, precision)
    assert readable is not x and readable.dtype == np.float32
    np.testing.assert_array_equal(readable, fused)


def _cached_rows(cfg, batch):
    """The fixture's conditional rows (with their unconditional rows) and a prompt cache for
    each conditional row: its positions before the targets."""
    ids, mask, lengths, T = packed_rows(batch)
    B = len(T)
    caches = [make_prompt_cache(cfg, lengths[b] - T[b]) for b in range(B)] + [None] * B
    return ids, mask, lengths, T, caches


def _targets_alone(cfg, ids, mask, lengths, T, caches):
    """The rows of `_cached_rows` as the prompt cache reads them: each conditional row's
    targets alone (after its cached prompt), the unconditional rows whole; (ids, mask, packing)."""
    B = len(T)
    starts = np.cumsum([0] + lengths[:-1])
    cols = np.concatenate([np.arange(s + lengths[b] - T[b], s + lengths[b]) for b, s in
                           enumerate(starts[:B])] + [np.arange(s, s + L) for s, L in
                                                     zip(starts[B:], lengths[B:])])
    offsets = [lengths[b] - T[b] for b in range(B)] + [0] * B
    return ids[:, cols], mask[cols], bb.make_packing(T + lengths[B:], cfg, offsets, caches)


@pytest.mark.parametrize("device_attention", [False, True])
def test_targets_alone_on_the_kept_prompt_equal_the_whole_row(params, cfg, batch, monkeypatch,
                                                              device_attention):
    """The fast profile's prompt cache: a whole row writing its cache computes exactly what it
    computes without one (bit for bit), and the row's targets alone, attending to that cache,
    give its targets' logits again (to the rounding of GEMMs of other shapes) while the ids
    have not changed: keys, values and rotary positions are where the whole row had them. On
    the per-row loop and on the padded batch a device runs."""
    if device_attention:
        monkeypatch.setattr(bb._attend, "_run", bb._attend.twin)
    ids, mask, lengths, T, caches = _cached_rows(cfg, batch)
    whole = bb.forward_rows(params, cfg, ids, mask, bb.make_packing(lengths, cfg), T * 2)
    writing = bb.forward_rows(params, cfg, ids, mask, bb.make_packing(lengths, cfg, caches=caches), T * 2)
    for a, b in zip(writing, whole):
        np.testing.assert_array_equal(a, b)
    B = len(T)
    assert all((np.abs(c.k).max(axis=(1, 2)) > 0).all() for c in caches[:B])  # every layer's prompt kept
    # The conditional rows' targets alone (after their prompts), the unconditional rows whole
    reading = bb.forward_rows(params, cfg, *_targets_alone(cfg, ids, mask, lengths, T, caches),
                              T * 2)
    for r, (a, b) in enumerate(zip(reading, whole)):
        assert rel_err(a, b) <= 5e-6, r  # measured: equal here (BLAS may round other shapes otherwise)
    with pytest.raises(ValueError, match="without a prompt cache"):
        bb.make_packing(T, cfg, [lengths[b] - T[b] for b in range(B)])


def test_attention_is_bidirectional(params, cfg, batch):
    ids, mask = batch["item0_input_ids"].copy(), batch["item0_audio_mask"]
    S = ids.shape[1]
    pack = bb.make_packing([S], cfg)
    before = bb.forward_rows(params, cfg, ids, mask, pack, [S])[0]
    ids[:, -1] = 7  # change the very last frame only
    after = bb.forward_rows(params, cfg, ids, mask, pack, [S])[0]
    assert np.abs(after[:, 0] - before[:, 0]).max() > 1e-4  # the first position sees it


# ---------------------------------------------------------------------------------------------
# Property tests against the ONNX sub-models (onnxruntime)
# ---------------------------------------------------------------------------------------------


def _session(name):
    path = require_file(ONNX / f"{name}.onnx", "tools/reference/export_onnx.py")
    ort = require_module("onnxruntime")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _feed(sess, by_kind):
    """Map inputs by (element type, rank), so the test does not depend on input names."""
    feed = {}
    for inp in sess.get_inputs():
        key = (inp.type, len(inp.shape))
        if key not in by_kind:
            raise AssertionError(f"unexpected ONNX input {inp.name} {inp.type} {inp.shape}")
        feed[inp.name] = by_kind[key]
    return feed


@st.composite
def padded_batches(draw, text_vocab):
    """1-3 rows of random lengths with random text/audio split points, ids in each range
    (MASK included), padded to a common length with a block attention mask."""
    B = draw(st.integers(1, 3))
    lengths = [draw(st.integers(1, 24)) for _ in range(B)]
    S = max(2, max(lengths))  # the exported graphs take sequences of 2 or more
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    ids = np.zeros((B, 8, S), np.int64)
    audio = np.zeros((B, S), bool)
    attn = np.zeros((B, 1, S, S), bool)
    for b, L in enumerate(lengths):
        split = draw(st.integers(0, L))
        ids[b, :, :split] = rng.integers(0, text_vocab, split)[None, :]
        ids[b, :, split:L] = rng.integers(0, 1025, (8, L - split))
        audio[b, split:L] = True
        attn[b, 0, :L, :L] = True
        # padding positions attend to themselves only, as the reference's padded rows do
        attn[b, 0, np.arange(L, S), np.arange(L, S)] = True
    return ids, audio, attn, lengths


def _unpad(ids, audio, lengths):
    return (np.concatenate([ids[b, :, :L] for b, L in enumerate(lengths)], axis=1),
            np.concatenate([audio[b, :L] for b, L in enumerate(lengths)]))


@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_embeddings_match_onnx(params, cfg, data):
    sess = _session("audio_embeddings_encoder")
    ids, audio, _, lengths = data.draw(padded_batches(cfg.llm_config.vocab_size))
    want = sess.run(None, _feed(sess, {("tensor(int64)", 3): ids, ("tensor(bool)", 2): audio}))[0]
    flat_ids, flat_audio = _unpad(ids, audio, lengths)
    got = bb.embed(params, cfg, flat_ids, flat_audio)
    want = np.concatenate([want[b, :L] for b, L in enumerate(lengths)])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_decoder_and_heads_match_onnx(params, cfg, data):
    llm = _session("llm_decoder")
    heads = _session("audio_heads_decoder")
    ids, audio, attn, lengths = data.draw(padded_batches(cfg.llm_config.vocab_size))
    flat_ids, flat_audio = _unpad(ids, audio, lengths)
    x = bb.embed(params, cfg, flat_ids, flat_audio)  # [N, D]
    S, D = ids.shape[2], x.shape[1]
    padded = np.zeros((len(lengths), S, D), np.float32)
    start = 0
    for b, L in enumerate(lengths):
        padded[b, :L] = x[start:start + L]
        start += L
    hidden = llm.run(None, _feed(llm, {("tensor(float)", 3): padded, ("tensor(bool)", 4): attn}))[0]
    logits = heads.run(None, _feed(heads, {("tensor(float)", 3): hidden}))[0]  # [B, C, S, V]

    pack = bb.make_packing(lengths, cfg)
    ours = bb.forward_rows(params, cfg, flat_ids, flat_audio, pack, lengths)  # all positions
    for b, L in enumerate(lengths):
        want = logits[b, :, :L]
        assert rel_err(ours[b], want) <= RTOL


# ---------------------------------------------------------------------------------------------
# Precision profiles: what the GEMMs' inputs are rounded to
# ---------------------------------------------------------------------------------------------


def _round_f64(x, mantissa_bits):
    """x rounded to `mantissa_bits` significant bits, ties to even (float64 definition)."""
    x64 = x.astype(np.float64)
    q = 2.0 ** (np.floor(np.log2(np.abs(x64))) - mantissa_bits + 1)
    return (np.round(x64 / q) * q).astype(np.float32)  # np.round: ties to even


def test_precision_rounding_is_the_formats_round_to_nearest_even():
    from omnicore.model import backend

    rng = np.random.default_rng(0)
    x = (rng.standard_normal(20000) * 10.0 ** rng.integers(-6, 6, 20000)).astype(np.float32)
    x = np.concatenate([x, np.float32([1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -11, 1 + 3 * 2 ** -11])])
    for name, bits in (("tf32", 11), ("bf16", 8)):
        got = backend.round_gemm_input(x.copy(), name)
        np.testing.assert_array_equal(got, _round_f64(x, bits))
        np.testing.assert_array_equal(backend.round_gemm_input(got.copy(), name), got)  # idempotent
    np.testing.assert_array_equal(backend.round_gemm_input(x.copy(), "fp16"),
                                  x.astype(np.float16).astype(np.float32))
    assert np.isinf(backend.round_gemm_input(np.float32([7e4]), "fp16")).all()  # past float16's range
    y = x.copy()
    assert backend.round_gemm_input(y, "fp32") is y and np.array_equal(y, x)


def test_precision_profiles_round_the_gemm_weights_and_keep_the_rest(cfg):
    from omnicore.errors import ConfigError
    from omnicore.model import backend

    def load(precision):
        reader = checkpoint.open_params(CKPT / "model.safetensors")
        p = bb.load_params(reader, cfg, precision)
        reader.finish()
        return p

    fp32 = load("fp32")
    with pytest.raises(ConfigError, match="precision"):
        load("fp8")
    C, T = cfg.num_audio_codebook, 12
    rng = np.random.default_rng(1)
    ids = np.concatenate([rng.integers(0, 1000, (C, 9)), rng.integers(0, 1025, (C, T))], axis=1)
    mask = np.arange(ids.shape[1]) >= 9
    pack = bb.make_packing([ids.shape[1]], cfg)
    want = bb.forward_rows(fp32, cfg, ids, mask, pack, [T])[0]
    # Within 16 unit roundoffs of the format (2^-11 for tf32 and fp16, 2^-8 for bf16): this
    # checkpoint's sharp attention amplifies rounding (measured 7 for tf32).
    for name, bits in (("tf32", 11), ("bf16", 8), ("fp16", 11)):
        tol = 16 * 2.0 ** -bits
        p = load(name)
        assert p.precision == name
        for w in (p.layers[0].q_proj, p.layers[-1].down_proj, p.audio_heads):
            np.testing.assert_array_equal(backend.round_gemm_input(w.copy(), name), w)
        # norms, embeddings and the text table stay float32 as stored
        np.testing.assert_array_equal(p.layers[0].input_layernorm, fp32.layers[0].input_layernorm)
        np.testing.assert_array_equal(p.audio_embeddings, fp32.audio_embeddings)
        got = bb.forward_rows(p, cfg, ids, mask, pack, [T])[0]
        assert got.dtype == np.float32
        err = rel_err(got, want)
        assert 0 < err < tol, (name, err)  # rounded, and by about the format's precision


# ---------------------------------------------------------------------------------------------
# The int8 profile (W8A8): the spec with int8 products, its weights, its prompt cache
# ---------------------------------------------------------------------------------------------


def _load(cfg, precision):
    reader = checkpoint.open_params(CKPT / "model.safetensors")
    p = bb.load_params(reader, cfg, precision)
    reader.finish()
    return p


class _Int8Product:
    """A projection for the spec whose `x @ W.T` is int8_linear_plain(x, quantize_weight(W)):
    the spec's own code then runs the int8 profile's plain algorithm, nothing else changed."""

    __array_ufunc__ = None  # numpy hands `x @ this` to __rmatmul__

    def __init__(self, w):
        from omnicore.model.int8_kernels import quantize_weight

        self.w8 = quantize_weight(w)

    @property
    def T(self):
        return self

    def __rmatmul__(self, x):  # x [L, in] -> [L, out]
        from omnicore.model.int8_kernels import int8_linear_plain

        return int8_linear_plain(x, self.w8)


# The seven projections of every layer go int8; the audio heads, norms and embeddings do not.
_PROJECTIONS = ("q_proj.", "k_proj.", "v_proj.", "o_proj.", "gate_proj.", "up_proj.", "down_proj.")


def test_the_int8_backbone_is_the_spec_with_int8_products(cfg):
    """The int8 profile's logits are spec.logits' with every projection's x @ W.T replaced by
    int8_kernels.int8_linear_plain (weights per channel, activations per token; the backbone
    runs the fast kernels, equal to it bit for bit) and everything else
    (attention's products, softmax, norms, RoPE, the audio heads) as the float32 spec has it.
    Bound: 1e-5 of the largest logit, the float32 bound of the fp32 backbone against the spec
    (the fused kernels round differently in the last bits; an activation on a quantisation
    boundary could move one code, which stays inside it here; measured 2.6e-7 to 4.1e-7 over
    five draws). And the profile is a real change: the fp32 spec's logits are far further
    away (measured 3 % to 9 % of the largest on this checkpoint's sharp random weights)."""
    from omnicore.model import spec

    scfg, W = spec.load(CKPT)[:2]
    W8 = {k: (_Int8Product(v) if k.startswith("llm.layers.") and any(p in k for p in _PROJECTIONS)
              else v) for k, v in W.items()}
    rng = np.random.default_rng(3)
    C, T = cfg.num_audio_codebook, 12
    ids = np.concatenate([rng.integers(0, 1000, (C, 9)), rng.integers(0, 1025, (C, T))], axis=1)
    mask = np.arange(ids.shape[1]) >= 9
    plain = spec.logits(scfg, W8, ids, mask, T)  # [C, T, V]
    threads = jit.blas_threads()
    got = bb.forward_rows(_load(cfg, "int8"), cfg, ids, mask, bb.make_packing([ids.shape[1]], cfg), [T])[0]
    assert jit.blas_threads() == threads  # BLAS kept to one thread inside, its threads given back
    assert got.dtype == np.float32
    err = rel_err(got, plain)
    assert err <= 1e-5, err
    assert rel_err(spec.logits(scfg, W, ids, mask, T), plain) > 100 * max(err, 1e-7)


def test_the_int8_loader_keeps_no_float32_copy_of_a_quantised_matrix(cfg):
    """Under int8 each projection is an Int8Weight: int8 codes (packed in panels of 32
    channels and groups of 4 inputs, zero-padded), float32 scales [N], int32 column sums [N],
    nothing else (a quarter of the float32 bytes, plus padding and 8 per channel). The float32
    matrix is dropped as soon as it is quantised: the load's traced peak stays below the int8 parameters plus a few float32 matrices, far below the float32 layers.
    The audio heads, norms and embeddings are float32 as stored."""
    import dataclasses
    import gc
    import tracemalloc

    from omnicore.model.int8_kernels import Int8Weight, quantize_weight

    fp32 = _load(cfg, "fp32")
    gc.collect()
    tracemalloc.start()
    try:
        p = _load(cfg, "int8")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert p.precision == "int8"
    names = [f.name for f in dataclasses.fields(bb.LayerParams) if f.name.endswith("_proj")]
    assert len(names) == 7
    f32_layers = int8_bytes = biggest = 0
    for lp, ref in zip(p.layers, fp32.layers):
        for name in names:
            w, w32 = getattr(lp, name), getattr(ref, name)
            assert isinstance(w, Int8Weight) and vars(w).keys() == {"q", "scale", "colsum",
                                                                    "n_out", "n_in"}
            assert w.q.dtype == np.int8 and w.scale.dtype == np.float32 and w.colsum.dtype == np.int32
            N, K = w32.shape
            assert (w.n_out, w.n_in) == (N, K) and w.codes().shape == (N, K)
            assert w.q.size == -(-N // 32) * 32 * -(-K // 4) * 4
            assert w.nbytes == w.q.size + 8 * N
            want = quantize_weight(w32)  # quantised from the checkpoint's float32, once
            np.testing.assert_array_equal(w.q, want.q)
            np.testing.assert_array_equal(w.scale, want.scale)
            f32_layers += w32.nbytes
            int8_bytes += w.nbytes
            biggest = max(biggest, w32.nbytes)
        np.testing.assert_array_equal(lp.input_layernorm, ref.input_layernorm)
    for a, b in ((p.audio_heads, fp32.audio_heads), (p.audio_embeddings, fp32.audio_embeddings),
                 (p.norm, fp32.norm)):
        assert a.dtype == np.float32
        np.testing.assert_array_equal(a, b)
    heads_and_tables = p.audio_heads.nbytes + p.audio_embeddings.nbytes
    assert peak < int8_bytes + heads_and_tables + 4 * biggest, (peak, int8_bytes, f32_layers)
    assert peak < heads_and_tables + f32_layers / 2


def test_the_int8_profile_keeps_the_prompt_cache_exact(cfg, batch):
    """The fast and live profiles' prompt cache under int8: activation scales are per token,
    so a row's targets alone, reading its cached prompt, get the whole row's logits again (as
    at fp32), and a row writing its cache computes what it computes without one, bit for bit."""
    params = _load(cfg, "int8")
    ids, mask, lengths, T, caches = _cached_rows(cfg, batch)
    whole = bb.forward_rows(params, cfg, ids, mask, bb.make_packing(lengths, cfg), T * 2)
    writing = bb.forward_rows(params, cfg, ids, mask, bb.make_packing(lengths, cfg, caches=caches),
                              T * 2)
    for a, b in zip(writing, whole):
        np.testing.assert_array_equal(a, b)
    reading = bb.forward_rows(params, cfg, *_targets_alone(cfg, ids, mask, lengths, T, caches),
                              T * 2)
    for r, (a, b) in enumerate(zip(reading, whole)):
        assert rel_err(a, b) <= 5e-6, r
