#!/usr/bin/env python3
"""Codec encode and decode, stage by stage: omnicore against the reference's torch modules.

    REF_VENV/bin/python benchmarks/profile_codec.py [--model DIR] [--repeats N] [--threads N]
                                                    [--encode-s 5] [--decode-s 10] [--no-reference]

omnicore's stages are timed by walking the codec's own building blocks in the order
`higgs_codec.encode` / `higgs_codec.decode` run them (the walk's result is checked against the real call,
so a change to the codec that the walk misses fails loudly). The reference's stages are timed
with forward pre/post hooks on its corresponding modules (DAC blocks, HuBERT layers, ...).
Both sides run warm (one untimed call each first), alternating in one process, and every stage
shows the minimum over --repeats runs (the machine may be shared: the minimum is the least
disturbed run). Runs without torch too (--no-reference, or when omnivoice is missing).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path,
                    default=Path(os.environ.get("OMNICORE_BENCH_MODEL", ROOT / "checkpoints" / "full")))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--encode-s", type=float, default=5.0)
    ap.add_argument("--decode-s", type=float, default=10.0)
    ap.add_argument("--no-reference", action="store_true")
    ap.add_argument("--only", choices=["encode", "decode"])
    return ap.parse_args(argv)


ARGS = parse_args()
for var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[var] = str(ARGS.threads)
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from omnicore.model import higgs_codec, hubert  # noqa: E402
from omnicore.model.conv_kernels import (conv1d, conv_transpose1d, gelu, group_norm,  # noqa: E402
                                         grouped_conv1d, snake)


class Stages:
    """Named wall-time accumulators for one run (a stage entered twice adds up)."""

    def __init__(self):
        self.t = defaultdict(float)
        self.flop = defaultdict(float)
        self.order = []

    def __call__(self, name, flop=0.0):
        stages = self

        class _Ctx:
            def __enter__(self):
                self.t0 = time.perf_counter()

            def __exit__(self, *exc):
                if name not in stages.t:
                    stages.order.append(name)
                stages.t[name] += time.perf_counter() - self.t0
                stages.flop[name] += flop
                return False
        return _Ctx()


def _conv_flop(t_out, k, cin, cout):
    return 2.0 * t_out * k * cin * cout


# ---------------------------------------------------------------------------------------------
# omnicore: the codec's own building blocks, stage by stage
# ---------------------------------------------------------------------------------------------


def omni_decode(params, codes, cfg, st: Stages):
    dec = params.decoder
    with st("dequantize + fc2"):
        z = higgs_codec.dequantize(dec, codes[None])
        x = z @ dec.fc2_w + dec.fc2_b  # [1, T, Ca]
    with st("conv1 (7 taps)", _conv_flop(x.shape[1], 7, x.shape[2], dec.conv1.w.shape[2])):
        x = higgs_codec._conv(dec.conv1, x, padding=3)
    for i, blk in enumerate(dec.blocks):
        s, cin = blk.stride, x.shape[2]
        with st(f"block {i}: Snake (C={cin})"):
            x = snake(x, blk.snake.alpha, blk.snake.inv_alpha)
        cout = blk.conv_t_b.shape[0]
        with st(f"block {i}: conv_t x{s} ({cin}->{cout})", _conv_flop(x.shape[1] * s, 2 * s, cin, cout) / s):
            x = conv_transpose1d(x, blk.conv_t_w, blk.conv_t_b, kernel_size=2 * s, stride=s,
                                 padding=math.ceil(s / 2), output_padding=s % 2)
        c, t_ = x.shape[2], x.shape[1]
        with st(f"block {i}: 3 res units (C={c}, {t_} steps)", 3 * (_conv_flop(t_, 7, c, c) + _conv_flop(t_, 1, c, c))):
            for u in blk.res_units:
                x = higgs_codec._dac_res_unit(u, x)
    with st("final Snake + conv2 (7 taps -> 1)", _conv_flop(x.shape[1], 7, x.shape[2], 1)):
        x = snake(x, dec.snake.alpha, dec.snake.inv_alpha)
        x = higgs_codec._conv(dec.conv2, x, padding=3)
    return np.asarray(x)[0, :, 0]


def omni_encode(params, wav, cfg, st: Stages):
    enc = params.encoder
    sm = cfg.semantic_model_config
    hp = enc.hubert
    with st("resample 24k -> 16k"):
        x16 = higgs_codec.resample(wav, cfg.sample_rate, cfg.semantic_sample_rate)
        x16 = np.pad(x16, (higgs_codec.SEMANTIC_PAD, higgs_codec.SEMANTIC_PAD))
    x = x16.reshape(1, -1, 1)
    for i, (w, b, s) in enumerate(zip(hp.conv_w, hp.conv_b, sm.conv_stride)):
        k_, cin, cout = w.shape
        name = f"HuBERT conv {i} (k{k_} s{s})" if i == 0 else f"HuBERT convs 1-{len(hp.conv_w) - 1}"
        t_out = (x.shape[1] - k_) // s + 1
        with st(name + ": conv", _conv_flop(t_out, k_, cin, cout)):
            x = conv1d(x, w, b, stride=s)
        if i == 0:
            with st(name + ": GroupNorm"):
                x = group_norm(x, x.shape[-1], hp.gn_w, hp.gn_b, 1e-5)
        with st(name + ": GELU"):
            x = gelu(x)
    x = x[0]
    with st("HuBERT feature projection (LN + linear)"):
        if hp.proj_ln_w is not None:
            x = hubert.layer_norm(x, hp.proj_ln_w, hp.proj_ln_b, sm.layer_norm_eps)
        x = x @ hp.proj_w + hp.proj_b
    k = sm.num_conv_pos_embeddings
    g = sm.num_conv_pos_embedding_groups
    with st("HuBERT positional conv + GELU + LN", _conv_flop(x.shape[0], k, x.shape[1] // g, x.shape[1])):
        pos = grouped_conv1d(x[None], hp.pos_w, hp.pos_b, padding=k // 2)[0]
        pos = gelu(pos[:x.shape[0]])
        x = hubert.layer_norm(x + pos, hp.ln_w, hp.ln_b, sm.layer_norm_eps)
    states = [x]
    f_, d = x.shape
    eps = sm.layer_norm_eps
    for lp in hp.layers:
        with st(f"HuBERT {len(hp.layers)} layers: attention", 2 * f_ * d * 4 * d + 4 * f_ * f_ * d):
            a = hubert._attention(lp, x, sm.num_attention_heads)
        with st(f"HuBERT {len(hp.layers)} layers: LN"):
            x = hubert.layer_norm(x + a, lp.ln1_w, lp.ln1_b, eps)
        with st(f"HuBERT {len(hp.layers)} layers: FFN GEMMs", 4 * f_ * d * sm.intermediate_size):
            h = x @ lp.ff1_w + lp.ff1_b
        with st(f"HuBERT {len(hp.layers)} layers: FFN GELU"):
            h = gelu(h)
        with st(f"HuBERT {len(hp.layers)} layers: FFN GEMMs"):
            y = h @ lp.ff2_w + lp.ff2_b
        with st(f"HuBERT {len(hp.layers)} layers: LN"):
            x = hubert.layer_norm(x + y, lp.ln2_w, lp.ln2_b, eps)
        states.append(x)
    with st("mean of states + semantic conv encoder"):
        acc = states[0].copy()
        for h in states[1:]:
            acc += h
        hub = (acc / np.float32(len(states)))[::cfg.semantic_downsample_factor]
        sem = higgs_codec._semantic_encode(enc, cfg, hub[None])
    ac_in = wav
    if higgs_codec._acoustic_frames(wav.shape[0], cfg) != hub.shape[0]:
        ac_in = np.pad(wav, (cfg.hop_length // 2, cfg.hop_length // 2))
    x = ac_in.reshape(1, -1, 1)
    with st("DAC conv1 (1 -> 64, 7 taps)", _conv_flop(x.shape[1], 7, 1, enc.ac_conv1.w.shape[2])):
        x = higgs_codec._conv(enc.ac_conv1, x, padding=3)
    for i, blk in enumerate(enc.ac_blocks):
        c, t_ = x.shape[2], x.shape[1]
        with st(f"block {i}: 3 res units (C={c}, {t_} steps)", 3 * (_conv_flop(t_, 7, c, c) + _conv_flop(t_, 1, c, c))):
            for u in blk.res_units:
                x = higgs_codec._dac_res_unit(u, x)
        s = blk.stride
        with st(f"block {i}: Snake + conv x/{s} ({c}->{2 * c})", _conv_flop(t_ // s, 2 * s, c, 2 * c)):
            x = snake(x, blk.snake.alpha, blk.snake.inv_alpha)
            x = higgs_codec._conv(blk.conv, x, stride=s, padding=math.ceil(s / 2))
    with st("DAC final Snake + conv2 (3 taps)", _conv_flop(x.shape[1], 3, x.shape[2], enc.ac_conv2.w.shape[2])):
        x = snake(x, enc.ac_snake.alpha, enc.ac_snake.inv_alpha)
        ac = higgs_codec._conv(enc.ac_conv2, x, padding=1)
    with st("fc + RVQ"):
        fused = np.concatenate([ac, sem], axis=-1)[0] @ enc.fc_w + enc.fc_b
        codes = higgs_codec.quantize(params, fused, cfg)
    return codes


# ---------------------------------------------------------------------------------------------
# Reference: forward hooks on the matching modules
# ---------------------------------------------------------------------------------------------


def ref_rows(model, cfg):
    """module -> row name, for the reference's codec (transformers' HiggsAudioV2Tokenizer)."""
    rows = {}
    hub = model.semantic_model
    convs = hub.feature_extractor.conv_layers
    for i, layer in enumerate(convs):
        sm = cfg.semantic_model_config
        rows[layer] = (f"HuBERT conv 0 (k{sm.conv_kernel[0]} s{sm.conv_stride[0]}): *" if i == 0
                       else f"HuBERT convs 1-{len(convs) - 1}: *")
    rows[hub.feature_projection] = "HuBERT feature projection (LN + linear)"
    rows[hub.encoder.pos_conv_embed] = "HuBERT positional conv + GELU + LN"
    n = len(hub.encoder.layers)
    for layer in hub.encoder.layers:
        rows[layer] = f"HuBERT {n} layers: *"
        rows[layer.attention] = f"HuBERT {n} layers: attention"
    rows[model.encoder_semantic] = "mean of states + semantic conv encoder"
    ae = model.acoustic_encoder
    rows[ae.conv1] = "DAC conv1 (1 -> 64, 7 taps)"
    width = cfg.acoustic_model_config.encoder_hidden_size
    for i, blk in enumerate(ae.block):
        c = width * 2 ** i
        for u in (blk.res_unit1, blk.res_unit2, blk.res_unit3):
            rows[u] = (f"block {i}: 3 res units (C={c}", "enc")
        rows[blk.snake1] = f"block {i}: Snake + conv x/{cfg.acoustic_model_config.downsampling_ratios[i]} ({c}->{2 * c})"
        rows[blk.conv1] = rows[blk.snake1]
    rows[ae.snake1] = rows[ae.conv2] = "DAC final Snake + conv2 (3 taps)"
    rows[model.fc] = "fc + RVQ"
    rows[model.quantizer] = "fc + RVQ"
    ad = model.acoustic_decoder
    rows[ad.conv1] = "conv1 (7 taps)"
    cd = cfg.acoustic_model_config.decoder_hidden_size
    for i, blk in enumerate(ad.block):
        s = cfg.acoustic_model_config.upsampling_ratios[i]
        cin, cout = cd // 2 ** i, cd // 2 ** (i + 1)
        rows[blk.snake1] = f"block {i}: Snake (C={cin})"
        rows[blk.conv_t1] = f"block {i}: conv_t x{s} ({cin}->{cout})"
        for u in (blk.res_unit1, blk.res_unit2, blk.res_unit3):
            rows[u] = (f"block {i}: 3 res units (C={cout}", "dec")
    rows[ad.snake1] = rows[ad.conv2] = "final Snake + conv2 (7 taps -> 1)"
    return rows


class RefHooks:
    def __init__(self, model, cfg):
        self.rows = ref_rows(model, cfg)
        self.st = None
        self.start = {}
        self.handles = []
        for mod in self.rows:
            self.handles.append(mod.register_forward_pre_hook(self._pre))
            self.handles.append(mod.register_forward_hook(self._post))
        # not module calls: wrapped instead
        import torchaudio.functional as taf

        self._wrap(taf, "resample", "resample 24k -> 16k")
        self._wrap(model.quantizer, "encode", "fc + RVQ")
        self._wrap(model.quantizer, "decode", "dequantize + fc2")
        self._wrap(model.fc2, "forward", "dequantize + fc2")

    def _wrap(self, obj, attr, name):
        fn = getattr(obj, attr)

        def timed(*a, **k):
            t0 = time.perf_counter()
            out = fn(*a, **k)
            if self.st is not None:
                if name not in self.st.t:
                    self.st.order.append(name)
                self.st.t[name] += time.perf_counter() - t0
            return out
        setattr(obj, attr, timed)

    def _pre(self, mod, args):
        self.start[id(mod)] = time.perf_counter()

    def _post(self, mod, args, out):
        dt = time.perf_counter() - self.start.pop(id(mod))
        name = self.rows[mod]
        if isinstance(name, tuple):  # a res unit: its row name carries the step count
            name = f"{name[0]}, {out.shape[-1]} steps)"
        if self.st is not None:
            if name not in self.st.t:
                self.st.order.append(name)
            self.st.t[name] += dt


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------


def table(title, runs_o, runs_r, total_o, total_r):
    """Rows in omnicore's order; a reference row named "X: *" covers every omnicore row "X: ..."
    (the reference's module does in one what omnicore times in parts) and follows them."""
    def best(runs):
        out = {}
        for st in runs:
            for k, v in st.t.items():
                out[k] = min(out.get(k, v), v)
        return out

    bo, br = best(runs_o), (best(runs_r) if runs_r else {})
    flop = runs_o[0].flop
    names = list(runs_o[0].order)
    for n in (runs_r[0].order if runs_r else []):
        if n in names:
            continue
        parts = [i for i, k in enumerate(names) if n.endswith(": *") and k.startswith(n[:-1])]
        names.insert(parts[-1] + 1 if parts else len(names), n)
    print(f"\n### {title}\n")
    print("| stage | omnicore ms | omnicore GFLOP/s | reference ms | ratio |")
    print("|---|---|---|---|---|")
    for n in names:
        a, b = bo.get(n), br.get(n)
        if n.endswith(": *"):
            a = sum(v for k, v in bo.items() if k.startswith(n[:-1])) or None
            n = f"&nbsp;&nbsp;{n[:-3]} (sum)"
        rate = f"{flop[n] / a / 1e9:.0f}" if a and flop.get(n) else ""
        ratio = f"{a / b:.2f}" if a and b else ""
        fa = f"{1e3 * a:.1f}" if a is not None else ""
        fb = f"{1e3 * b:.1f}" if b is not None else ""
        print(f"| {n} | {fa} | {rate} | {fb} | {ratio} |")
    to = min(total_o)
    tr = min(total_r) if total_r else None
    print(f"| **whole call** | **{1e3 * to:.0f}** | | **{1e3 * tr:.0f}** | **{to / tr:.2f}** |" if tr
          else f"| **whole call** | **{1e3 * to:.0f}** | | | |")


def main():
    import soundfile as sf

    from omnicore.model.higgs_codec import Codec

    model_dir = ARGS.model
    cdc = Codec(model_dir)
    cfg = cdc.cfg
    rng = np.random.default_rng(0)
    frames = int(round(ARGS.decode_s * cfg.frame_rate))
    codes = rng.integers(0, cfg.codebook_size, (cfg.num_quantizers, frames))
    clip, sr = sf.read(ROOT / "tests/fixtures/audio/speech_24k.wav", dtype="float32")
    n = int(ARGS.encode_s * sr)
    clip = np.tile(clip, -(-n // len(clip)))[:n]
    clip = higgs_codec.pad_to_hop(clip, cfg.hop_length)

    ref = None
    if not ARGS.no_reference:
        try:
            import logging
            import warnings

            warnings.filterwarnings("ignore")
            logging.disable(logging.WARNING)
            import torch
            from transformers import AutoModel

            torch.set_num_threads(ARGS.threads)
            tok_dir = higgs_codec._codec_dir(model_dir)
            ref = AutoModel.from_pretrained(str(tok_dir), dtype=torch.float32).eval()
        except ImportError as exc:
            print(f"(no reference: {exc})", file=sys.stderr)
    t0 = time.perf_counter()
    cdc.encode(clip, sr)  # loads the encoder half, compiles
    print(f"omnicore first encode (load encoder half + compile): {time.perf_counter() - t0:.2f} s", file=sys.stderr)
    params = cdc.params

    # the walks must compute what the codec computes
    want = higgs_codec.decode(params, codes, cfg)
    got = omni_decode(params, codes, cfg, Stages())
    assert np.allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max()), "decode walk differs from higgs_codec.decode"
    assert np.array_equal(omni_encode(params, clip, cfg, Stages()), higgs_codec.encode(params, clip, cfg)), \
        "encode walk differs from higgs_codec.encode"

    hooks = RefHooks(ref, cfg) if ref is not None else None

    def ref_decode():
        with torch.inference_mode():
            return ref.decode(torch.from_numpy(codes[:, None]).transpose(0, 1)).audio_values

    def ref_encode():
        with torch.inference_mode():
            return ref.encode(torch.from_numpy(clip)[None, None]).audio_codes

    if ref is not None:
        ref_decode()
        ref_encode()
    for what in ("decode", "encode"):
        if ARGS.only and what != ARGS.only:
            continue
        runs_o, runs_r, tot_o, tot_r = [], [], [], []
        for i in range(ARGS.repeats):
            order = ("o", "r") if i % 2 == 0 else ("r", "o")
            for side in order:
                if side == "o":
                    st = Stages()
                    (omni_decode(params, codes, cfg, st) if what == "decode" else omni_encode(params, clip, cfg, st))
                    runs_o.append(st)
                    t0 = time.perf_counter()
                    higgs_codec.decode(params, codes, cfg) if what == "decode" else higgs_codec.encode(params, clip, cfg)
                    tot_o.append(time.perf_counter() - t0)
                elif ref is not None:
                    hooks.st = Stages()
                    ref_decode() if what == "decode" else ref_encode()
                    runs_r.append(hooks.st)
                    hooks.st = None
                    t0 = time.perf_counter()
                    ref_decode() if what == "decode" else ref_encode()
                    tot_r.append(time.perf_counter() - t0)
        title = (f"decode {ARGS.decode_s:g} s ({frames} frames)" if what == "decode"
                 else f"encode {ARGS.encode_s:g} s clip")
        table(f"{title}: min of {ARGS.repeats}, warm, {ARGS.threads} threads", runs_o, runs_r, tot_o, tot_r)


if __name__ == "__main__":
    main()
