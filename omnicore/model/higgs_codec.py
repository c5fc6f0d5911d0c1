"""The Higgs Audio V2 codec in numpy: 24 kHz audio <-> 8 x T discrete codes at 25 frames/s.

`decode` and `encode` are the product's forms of `spec.decode` and `spec.encode` (model/spec.py;
tests/test_spec.py holds the waveforms within 2e-5 of the largest sample, the codes equal).

Decode: codes -> per-codebook lookup + `project_out`, summed -> `fc2` -> DAC decoder (conv,
5 x [Snake, transposed conv, 3 dilated residual units], Snake, conv) -> waveform, hop samples
per frame. There is no tanh or clamp at the end: the checkpoint's decoder drops DAC's tanh.

Encode: waveform -> (semantic) 16 kHz resample, HuBERT, mean of all hidden states, every
second frame, semantic conv encoder; (acoustic) DAC encoder -> concat, acoustic first -> `fc`
-> residual vector quantisation (nearest codeword by Euclidean distance, in order).

Public API (pure functions over params, arrays and the config):
    load_params(reader, cfg, encoder=True) -> CodecParams     (decoder-only with encoder=False)
    load_encoder_params(reader, cfg, params) -> CodecParams   (add the encoder half later)
    (omnicore.machinery.checkpoint.load_codec and load_codec_encoder read them from a directory)
    decode(params, codes, cfg) -> float32 waveform [hop*T] (or [B, hop*T] for codes [B, Q, T])
    decode_stream(params, codes, cfg, chunk_frames=50, overlap_frames=None, later_frames=None)
        -> waveform pieces (a first window of `chunk_frames`, then windows of `later_frames`)
    decode_chunked(...) -> the joined pieces (`decode` to rounding); decoder_receptive_field(cfg)
    encode(params, waveform, cfg, sample_rate=None, pad=True) -> int64 codes [Q, T]
        (waveform at cfg.sample_rate; `sample_rate`, when given, checks that)
    encode_features(...) -> the encoder's intermediate tensors; quantize(params, latent, cfg)

Dimension legend:
    B  batch of code sequences      Q  codebooks used (<= num_quantizers, 8)
    T  code frames (25 Hz)          N  codebook entries (1024)       d  codebook dim (64)
    D  fused latent width (1024 = Ca + Ds)
    Ca acoustic latent (256)        Ds semantic / HuBERT hidden size (768)
    L  waveform samples (24 kHz)    L16 samples at 16 kHz            F  HuBERT frames (50 Hz)
    C  channels of a conv stage     S  samples at a decoder/encoder stage's own rate
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..errors import AudioError, InputError, WeightsError
from . import hubert
from .backend import f32, to_device, to_numpy, xp
from .config import HiggsAudioV2TokenizerConfig
from .resample import resample
from .conv_kernels import (conv1d, conv_out_len, conv_transpose1d, conv_transpose_weight, conv_weight,
                           dac_res_unit, snake)

# The reference pads the 16 kHz semantic input by this many samples on each side (it is a
# fixed number in transformers, not hop_length // 2 as in the original Boson code).
SEMANTIC_PAD = 160
# Residual unit dilations of every DAC block; its convs have 7 taps.
DAC_DILATIONS = (1, 3, 9)
DAC_KERNEL = 7

# ---------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SnakeParams:
    alpha: object  # [C]
    inv_alpha: object  # [C] = 1 / (alpha + 1e-9), as the reference computes it


@dataclass(frozen=True)
class ConvParams:
    w: object  # [K, Cin, Cout] (conv_kernels.conv_weight layout)
    b: object  # [Cout] or None


@dataclass(frozen=True)
class DacResUnit:
    snake1: SnakeParams
    conv1: ConvParams  # 7 taps, dilated
    snake2: SnakeParams
    conv2: ConvParams  # 1 tap
    dilation: int


@dataclass(frozen=True)
class DacDecoderBlock:
    snake: SnakeParams
    conv_t_w: object  # [2*Cin, stride*Cout] (conv_kernels.conv_transpose_weight polyphase layout), K = 2 * stride
    conv_t_b: object  # [Cout]
    stride: int
    res_units: tuple  # 3 x DacResUnit


@dataclass(frozen=True)
class DacEncoderBlock:
    res_units: tuple  # 3 x DacResUnit on the input width
    snake: SnakeParams
    conv: ConvParams  # K = 2 * stride, doubles the width
    stride: int


@dataclass(frozen=True)
class DecoderParams:
    embed: object  # [Q, N, d] codebooks
    out_w: object  # [Q, d, D] project_out
    out_b: object  # [Q, D]
    fc2_w: object  # [D, Ca]
    fc2_b: object  # [Ca]
    conv1: ConvParams
    blocks: tuple  # DacDecoderBlock per upsampling ratio
    snake: SnakeParams
    conv2: ConvParams


@dataclass(frozen=True)
class SemanticResUnit:
    conv1: ConvParams  # unit_kernel_size taps, dilated, no bias
    conv2: ConvParams  # 1 tap, no bias
    dilation: int


@dataclass(frozen=True)
class EncoderParams:
    hubert: hubert.HubertParams
    sem_conv: ConvParams  # encoder_semantic.conv
    sem_blocks: tuple  # per block: (tuple of SemanticResUnit, ConvParams)
    ac_conv1: ConvParams
    ac_blocks: tuple  # DacEncoderBlock per downsampling ratio
    ac_snake: SnakeParams
    ac_conv2: ConvParams
    fc_w: object  # [D, D]
    fc_b: object  # [D]
    in_w: object  # [Q, D, d] project_in
    in_b: object  # [Q, d]
    embed_t: object  # [Q, d, N] codebooks transposed for the distance GEMM
    embed_sq: object  # [Q, N] squared norms of the codewords


@dataclass(frozen=True)
class CodecParams:
    decoder: DecoderParams
    encoder: EncoderParams | None = None  # None until the encoder half is loaded
    source: tuple[int, int] | None = None  # (size, mtime ns) of the file the halves come from


def _dev(a):
    return to_device(f32(a))


def _take_snake(reader, key: str, c: int) -> SnakeParams:
    alpha = f32(reader.take(key, (1, c, 1)).reshape(c))
    # float32 throughout, like torch: (alpha + 1e-9) rounds back to alpha for alpha ~ 1
    inv = (np.float32(1.0) / (alpha + np.float32(1e-9))).astype(np.float32)
    return SnakeParams(to_device(alpha), to_device(inv))


def _take_conv(reader, prefix: str, cout: int, cin: int, k: int, bias: bool = True) -> ConvParams:
    w = to_device(conv_weight(reader.take(prefix + "weight", (cout, cin, k))))
    b = _dev(reader.take(prefix + "bias", (cout,))) if bias else None
    return ConvParams(w, b)


def _take_dac_res_unit(reader, prefix: str, c: int, dilation: int) -> DacResUnit:
    return DacResUnit(
        snake1=_take_snake(reader, prefix + "snake1.alpha", c),
        conv1=_take_conv(reader, prefix + "conv1.", c, c, DAC_KERNEL),
        snake2=_take_snake(reader, prefix + "snake2.alpha", c),
        conv2=_take_conv(reader, prefix + "conv2.", c, c, 1),
        dilation=dilation)


def _quantizer_prefix(q: int) -> str:
    return f"quantizer.quantizers.{q}."


def load_decoder_params(reader, cfg: HiggsAudioV2TokenizerConfig) -> DecoderParams:
    """Take the tensors decoding needs (codebooks, project_out, fc2, the DAC decoder)."""
    ac = cfg.acoustic_model_config
    nq, n, dim, d = cfg.num_quantizers, cfg.codebook_size, cfg.codebook_dim, cfg.hidden_size
    embed, out_w, out_b = [], [], []
    for q in range(nq):
        p = _quantizer_prefix(q)
        embed.append(reader.take(p + "codebook.embed", (n, dim)))
        out_w.append(reader.take(p + "project_out.weight", (d, dim)).T)  # [D, d] -> [d, D]
        out_b.append(reader.take(p + "project_out.bias", (d,)))
    width = ac.decoder_hidden_size
    conv1 = _take_conv(reader, "acoustic_decoder.conv1.", width, ac.hidden_size, 7)
    blocks = []
    for i, s in enumerate(ac.upsampling_ratios):
        p = f"acoustic_decoder.block.{i}."
        cin, cout = width // 2 ** i, width // 2 ** (i + 1)
        wt = reader.take(p + "conv_t1.weight", (cin, cout, 2 * s))
        blocks.append(DacDecoderBlock(
            snake=_take_snake(reader, p + "snake1.alpha", cin),
            conv_t_w=to_device(conv_transpose_weight(wt, s)),
            conv_t_b=_dev(reader.take(p + "conv_t1.bias", (cout,))),
            stride=s,
            res_units=tuple(_take_dac_res_unit(reader, f"{p}res_unit{j + 1}.", cout, dil)
                            for j, dil in enumerate(DAC_DILATIONS))))
    c_last = width // 2 ** len(ac.upsampling_ratios)
    return DecoderParams(
        embed=_dev(np.stack(embed)), out_w=_dev(np.stack(out_w)), out_b=_dev(np.stack(out_b)),
        fc2_w=_dev(reader.take("fc2.weight", (ac.hidden_size, d)).T),  # [Ca, D] -> [D, Ca]
        fc2_b=_dev(reader.take("fc2.bias", (ac.hidden_size,))),
        conv1=conv1, blocks=tuple(blocks),
        snake=_take_snake(reader, "acoustic_decoder.snake1.alpha", c_last),
        conv2=_take_conv(reader, "acoustic_decoder.conv2.", 1, c_last, 7))


def _load_encoder_half(reader, cfg: HiggsAudioV2TokenizerConfig, dec: DecoderParams) -> EncoderParams:
    ac, sm = cfg.acoustic_model_config, cfg.semantic_model_config
    nq, dim, d, ds = cfg.num_quantizers, cfg.codebook_dim, cfg.hidden_size, sm.hidden_size
    hub = hubert.load_params(reader, sm, prefix="semantic_model.")

    ks, uk = cfg.kernel_size, cfg.unit_kernel_size
    sem_conv = _take_conv(reader, "encoder_semantic.conv.", ds, ds, ks, bias=False)
    sem_blocks = []
    for i, stride in enumerate(cfg.strides):
        p = f"encoder_semantic.conv_blocks.{i}."
        units = tuple(SemanticResUnit(_take_conv(reader, f"{p}res_units.{j}.conv1.", ds, ds, uk, bias=False),
                                      _take_conv(reader, f"{p}res_units.{j}.conv2.", ds, ds, 1, bias=False), dil)
                      for j, dil in enumerate(cfg.block_dilations))
        k = 3 if stride == 1 else 2 * stride
        sem_blocks.append((units, _take_conv(reader, p + "conv.", ds, ds, k)))

    width = ac.encoder_hidden_size
    ac_conv1 = _take_conv(reader, "acoustic_encoder.conv1.", width, 1, 7)
    ac_blocks = []
    for i, s in enumerate(ac.downsampling_ratios):
        p = f"acoustic_encoder.block.{i}."
        cin, cout = width * 2 ** i, width * 2 ** (i + 1)
        ac_blocks.append(DacEncoderBlock(
            res_units=tuple(_take_dac_res_unit(reader, f"{p}res_unit{j + 1}.", cin, dil)
                            for j, dil in enumerate(DAC_DILATIONS)),
            snake=_take_snake(reader, p + "snake1.alpha", cin),
            conv=_take_conv(reader, p + "conv1.", cout, cin, 2 * s),
            stride=s))
    c_last = width * 2 ** len(ac.downsampling_ratios)

    in_w, in_b = [], []
    for q in range(nq):
        p = _quantizer_prefix(q)
        in_w.append(reader.take(p + "project_in.weight", (dim, d)).T)  # [d, D] -> [D, d]
        in_b.append(reader.take(p + "project_in.bias", (dim,)))
    embed = to_numpy(dec.embed)
    return EncoderParams(
        hubert=hub, sem_conv=sem_conv, sem_blocks=tuple(sem_blocks),
        ac_conv1=ac_conv1, ac_blocks=tuple(ac_blocks),
        ac_snake=_take_snake(reader, "acoustic_encoder.snake1.alpha", c_last),
        ac_conv2=_take_conv(reader, "acoustic_encoder.conv2.", ac.hidden_size, c_last, 3),
        fc_w=_dev(reader.take("fc.weight", (d, d)).T), fc_b=_dev(reader.take("fc.bias", (d,))),
        in_w=_dev(np.stack(in_w)), in_b=_dev(np.stack(in_b)),
        embed_t=_dev(np.transpose(embed, (0, 2, 1))),
        # summed in float32 over the codebook dim, as the reference does
        embed_sq=_dev((embed * embed).sum(axis=-1, dtype=np.float32)))


def _training_only_prefixes(cfg: HiggsAudioV2TokenizerConfig) -> list[str]:
    """Checkpoint tensors inference never reads: the semantic reconstruction head (`fc1`,
    `decoder_semantic`) and the codebooks' EMA training statistics."""
    out = ["fc1.", "decoder_semantic.", "semantic_model.masked_spec_embed"]
    for q in range(cfg.num_quantizers):
        p = _quantizer_prefix(q) + "codebook."
        out += [p + "inited", p + "cluster_size", p + "embed_avg"]
    return out


def _encoder_prefixes(cfg: HiggsAudioV2TokenizerConfig) -> list[str]:
    out = ["semantic_model.", "encoder_semantic.", "acoustic_encoder.", "fc."]
    return out + [_quantizer_prefix(q) + "project_in." for q in range(cfg.num_quantizers)]


def _decoder_prefixes(cfg: HiggsAudioV2TokenizerConfig) -> list[str]:
    out = ["acoustic_decoder.", "fc2."]
    for q in range(cfg.num_quantizers):
        out += [_quantizer_prefix(q) + "codebook.embed", _quantizer_prefix(q) + "project_out."]
    return out


def _check_no_extra_quantizers(reader, cfg) -> None:
    extra = _quantizer_prefix(cfg.num_quantizers) + "codebook.embed"
    if extra in reader:
        raise WeightsError(f"{reader.file}: has more quantizers than the {cfg.num_quantizers} that "
                           f"target_bandwidths {list(cfg.target_bandwidths)} imply; config.json and "
                           "weights do not belong together")


def load_params(reader, cfg: HiggsAudioV2TokenizerConfig, *, encoder: bool = True) -> CodecParams:
    """Load the codec from a ParamReader, converting every layout once; checks all keys are used.

    With encoder=False only the decoder half is read (the encoder tensors are marked as
    deliberately skipped, never touched); `load_encoder_params` can add them later.
    """
    _check_no_extra_quantizers(reader, cfg)
    dec = load_decoder_params(reader, cfg)
    enc = _load_encoder_half(reader, cfg, dec) if encoder else None
    for p in _training_only_prefixes(cfg) + ([] if encoder else _encoder_prefixes(cfg)):
        reader.skip(p)
    reader.finish()
    return CodecParams(decoder=dec, encoder=enc)


def load_encoder_params(reader, cfg: HiggsAudioV2TokenizerConfig, params: CodecParams) -> CodecParams:
    """Add the encoder half (HuBERT, semantic and acoustic encoders, fc, project_in) to
    decoder-only params, from a fresh ParamReader of the same file; checks all keys are used."""
    if params.encoder is not None:
        return params
    enc = _load_encoder_half(reader, cfg, params.decoder)
    for p in _training_only_prefixes(cfg) + _decoder_prefixes(cfg):
        reader.skip(p)
    reader.finish()
    return replace(params, encoder=enc)


# ---------------------------------------------------------------------------------------------
# Shared layers
# ---------------------------------------------------------------------------------------------


def _conv(p: ConvParams, x, **kw):
    return conv1d(x, p.w, p.b, **kw)


def _dac_res_unit(u: DacResUnit, x):
    """x + conv1x1(snake(conv7_dilated(snake(x)))); 'same' padding keeps the length.

    (DAC centre-crops the skip path when the convs shorten the signal; with this padding they
    never do.)"""
    return dac_res_unit(x, u.snake1.alpha, u.snake1.inv_alpha, u.conv1.w, u.conv1.b, u.dilation,
                        u.snake2.alpha, u.snake2.inv_alpha, u.conv2.w, u.conv2.b)


# ---------------------------------------------------------------------------------------------
# Decoder
# ---------------------------------------------------------------------------------------------


def check_codes(codes, cfg: HiggsAudioV2TokenizerConfig) -> np.ndarray:
    try:
        arr = np.asarray(to_numpy(codes))
    except Exception as exc:
        raise InputError(f"codes must be an integer array [Q, T] or [B, Q, T], got {type(codes).__name__}") from exc
    if arr.ndim not in (2, 3):
        raise InputError(f"codes must have shape [Q, T] or [B, Q, T], got {list(arr.shape)}")
    if arr.size and arr.dtype.kind not in "iu":
        if arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
            arr = arr.astype(np.int64)
        else:
            raise InputError(f"codes must be integers, got dtype {arr.dtype}")
    q = arr.shape[-2]
    if not 1 <= q <= cfg.num_quantizers:
        raise InputError(f"codes have {q} codebooks; this codec takes 1 to {cfg.num_quantizers} "
                         f"(shape [Q, T] or [B, Q, T], got {list(arr.shape)})")
    if arr.size and (arr.min() < 0 or arr.max() >= cfg.codebook_size):
        raise InputError(f"codes must lie in [0, {cfg.codebook_size - 1}], found values from {arr.min()} "
                         f"to {arr.max()} (a mask id {cfg.codebook_size} left in generated codes?)")
    return arr.astype(np.int64, copy=False)


def dequantize(dec: DecoderParams, codes):
    """codes [B, Q, T] -> the quantised latent [B, T, D]: sum over codebooks, in order, of
    project_out(codebook[code]).
    The fast form of the codebook sum at the start of `spec.decode`."""
    z = None
    for q in range(codes.shape[1]):
        e = dec.embed[q][codes[:, q]]  # [B, T] -> [B, T, d]
        part = e @ dec.out_w[q] + dec.out_b[q]  # [B, T, d] -> [B, T, D]
        z = part if z is None else z + part
    return z


def _acoustic_decode(dec: DecoderParams, x):
    """DAC decoder: x [B, T, Ca] -> waveform [B, T * prod(upsampling_ratios), 1]."""
    x = _conv(dec.conv1, x, padding=3)  # [B, T, Ca] -> [B, T, C0]
    for blk in dec.blocks:
        s = blk.stride
        x = snake(x, blk.snake.alpha, blk.snake.inv_alpha)
        # kernel 2s, padding ceil(s/2), output padding s % 2: exactly s outputs per input step
        x = conv_transpose1d(x, blk.conv_t_w, blk.conv_t_b, kernel_size=2 * s, stride=s,
                             padding=math.ceil(s / 2), output_padding=s % 2)  # [B, S, C] -> [B, S*s, C/2]
        for u in blk.res_units:
            x = _dac_res_unit(u, x)
    x = snake(x, dec.snake.alpha, dec.snake.inv_alpha)
    return _conv(dec.conv2, x, padding=3)  # [B, L, C_last] -> [B, L, 1]


def decode(params: CodecParams, codes, cfg: HiggsAudioV2TokenizerConfig) -> np.ndarray:
    """Codes [Q, T] (or a batch [B, Q, T]) -> float32 waveform [hop*T] (or [B, hop*T]) at
    cfg.sample_rate. Q may be fewer than num_quantizers (the first Q codebooks are used).
    T = 0 gives an empty waveform. Returns a numpy array whatever the backend.
    The fast form of `spec.decode`."""
    arr = check_codes(codes, cfg)
    single = arr.ndim == 2
    arr = arr[None] if single else arr  # -> [B, Q, T]
    b_, _, t_ = arr.shape
    if t_ == 0 or b_ == 0:
        out = np.zeros((b_, 0), dtype=np.float32)
        return out[0] if single else out
    dec = params.decoder
    z = dequantize(dec, to_device(arr))  # [B, Q, T] -> [B, T, D]
    x = z @ dec.fc2_w + dec.fc2_b  # [B, T, D] -> [B, T, Ca]
    wav = to_numpy(_acoustic_decode(dec, x))[..., 0]  # -> [B, L]
    wav = np.ascontiguousarray(wav, dtype=np.float32)
    return wav[0] if single else wav


def decoder_receptive_field(cfg: HiggsAudioV2TokenizerConfig) -> tuple[int, int]:
    """(left, right): how many code frames before / after its own frame an output sample can
    depend on, worst case over the samples of a frame. Derived by walking the decoder's layers
    backwards; `decode_stream` needs at least max(left, right) frames of overlap."""
    ac = cfg.acoustic_model_config
    hop = math.prod(ac.upsampling_ratios)

    def frames_for(n: int) -> tuple[int, int]:
        lo = hi = n  # sample interval at the output rate
        lo, hi = lo - 3, hi + 3  # conv2, 7 taps, padding 3
        for s in reversed(ac.upsampling_ratios):
            reach = sum((DAC_KERNEL - 1) * d // 2 for d in DAC_DILATIONS)
            lo, hi = lo - reach, hi + reach  # three residual units
            # transposed conv: uncropped row r = out + pad gets input t with t*s <= r < t*s + 2s
            pad = math.ceil(s / 2)
            lo, hi = -((-(lo + pad - 2 * s + 1)) // s), (hi + pad) // s
        return lo - 3, hi + 3  # conv1 at the frame rate, 7 taps

    left = right = 0
    for n in range(hop, 2 * hop):  # every phase of a frame, away from the edges
        lo, hi = frames_for(n)
        left, right = max(left, 1 - lo), max(right, hi - 1)
    return left, right


def decode_stream(params: CodecParams, codes, cfg: HiggsAudioV2TokenizerConfig, *,
                  chunk_frames: int = 50, overlap_frames: int | None = None,
                  later_frames: int | None = None):
    """Yield the waveform of `codes` [Q, T] (or [B, Q, T]) piece by piece: `chunk_frames` frames
    first, then `later_frames` (default: `chunk_frames`) at a time; a short first window gives
    a stream its first samples early, longer later ones cut the overlap's cost. Each piece is decoded with `overlap_frames` extra frames of context on both sides
    (default: the decoder's receptive field, 10 frames for the released config), so the pieces
    join into the one-shot decode up to float32 rounding (tested: max|diff| <= 2e-5 max|wave|):
    the windows are GEMMs of other row counts, and some BLAS kernels (OpenBLAS's Haswell sgemm)
    round a row differently with that count. With less overlap the seams differ far more (one
    frame short: ~1e-3). Pieces are [hop * n] (or [B, hop * n]) float32 arrays.
    `spec.decode` in windows."""
    arr = check_codes(codes, cfg)
    later_frames = chunk_frames if later_frames is None else later_frames
    for name, n in (("chunk_frames", chunk_frames), ("later_frames", later_frames)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InputError(f"{name} must be a positive integer, got {n!r}")
    if overlap_frames is None:
        overlap_frames = max(decoder_receptive_field(cfg))
    if isinstance(overlap_frames, bool) or not isinstance(overlap_frames, int) or overlap_frames < 0:
        raise InputError(f"overlap_frames must be a non-negative integer, got {overlap_frames!r}")
    hop = cfg.hop_length
    t_ = arr.shape[-1]
    start = 0
    while start < t_:
        stop = min(t_, start + (chunk_frames if start == 0 else later_frames))
        lo, hi = max(0, start - overlap_frames), min(t_, stop + overlap_frames)
        wav = decode(params, arr[..., lo:hi], cfg)  # [.., Q, hi-lo] -> [.., hop*(hi-lo)]
        yield wav[..., (start - lo) * hop:(stop - lo) * hop]  # -> [.., hop*(stop-start)]
        start = stop


def decode_chunked(params: CodecParams, codes, cfg: HiggsAudioV2TokenizerConfig, *,
                   chunk_frames: int = 50, overlap_frames: int | None = None) -> np.ndarray:
    """`decode` in windows of `chunk_frames` frames (bounded memory for long audio).
    `spec.decode` in windows."""
    pieces = list(decode_stream(params, codes, cfg, chunk_frames=chunk_frames, overlap_frames=overlap_frames))
    if not pieces:
        return decode(params, codes, cfg)
    return np.concatenate(pieces, axis=-1)


# ---------------------------------------------------------------------------------------------
# Encoder
# ---------------------------------------------------------------------------------------------


def check_audio(waveform, sample_rate, cfg: HiggsAudioV2TokenizerConfig) -> np.ndarray:
    """Validate what `encode` is given and return it as a float32 [L] array.

    The codec takes mono float audio at cfg.sample_rate (the feature extractor's rules);
    anything else is an AudioError saying how to fix it. Silence is valid input.
    """
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, np.integer)) or sample_rate <= 0:
        raise AudioError(f"sample rate must be a positive integer in Hz, got {sample_rate!r}")
    if sample_rate != cfg.sample_rate:
        raise AudioError(f"the codec takes {cfg.sample_rate} Hz audio, got {sample_rate} Hz; resample it "
                         f"first, e.g. omnicore.resample(x, {sample_rate}, {cfg.sample_rate})")
    try:
        arr = np.asarray(to_numpy(waveform))
    except Exception as exc:
        raise AudioError(f"audio must be a float array of samples, got {type(waveform).__name__}") from exc
    if arr.dtype.kind != "f":
        hint = " (integer PCM: divide by 32768 for 16-bit)" if arr.dtype.kind in "iu" else ""
        raise AudioError(f"audio must be floating point samples in [-1, 1], got dtype {arr.dtype}{hint}")
    if arr.ndim == 2 and 1 in arr.shape:
        arr = arr.reshape(-1)  # [1, L] or [L, 1] is mono
    if arr.ndim != 1:
        raise AudioError(f"the codec takes mono audio; got shape {list(arr.shape)} ({min(arr.shape)} channels?)."
                         " Mix down to mono first, e.g. x.mean(axis=0) for [channels, samples]")
    if arr.size == 0:
        raise AudioError("audio is empty (0 samples)")
    arr = arr.astype(np.float32)
    if not np.all(np.isfinite(arr)):
        raise AudioError(f"audio contains {int(np.count_nonzero(~np.isfinite(arr)))} NaN or infinite "
                         "samples; the file is corrupt or the signal overflowed")
    return arr


def pad_to_hop(wav: np.ndarray, hop: int) -> np.ndarray:
    """The feature extractor's rule: right zero-pad to a whole number of code frames.
    The whole-frames padding at the start of `spec.latent`."""
    extra = -wav.shape[-1] % hop
    return np.pad(wav, (0, extra)) if extra else wav


def _semantic_frames(num_samples: int, cfg: HiggsAudioV2TokenizerConfig) -> int:
    n16 = math.ceil(cfg.semantic_sample_rate * num_samples / cfg.sample_rate) + 2 * SEMANTIC_PAD
    f = hubert.num_frames(n16, cfg.semantic_model_config)
    step = cfg.semantic_downsample_factor
    return -(-f // step) if f > 0 else 0  # frames kept by [::step]


def _acoustic_frames(num_samples: int, cfg: HiggsAudioV2TokenizerConfig) -> int:
    n = num_samples  # conv1 and the residual units keep the length; the strided convs do not
    for s in cfg.acoustic_model_config.downsampling_ratios:
        n = conv_out_len(n, 2 * s, s, 1, math.ceil(s / 2)) if n > 0 else 0
    return n  # conv2 (3 taps, padding 1) keeps it


def _semantic_features(enc: EncoderParams, wav, cfg: HiggsAudioV2TokenizerConfig):
    """wav [L] at 24 kHz -> averaged HuBERT states at the code frame rate [T, Ds]."""
    x16 = resample(wav, cfg.sample_rate, cfg.semantic_sample_rate)  # [L] -> [L16]
    x16 = np.pad(x16, (SEMANTIC_PAD, SEMANTIC_PAD))
    states = hubert.hidden_states(enc.hubert, x16, cfg.semantic_model_config)  # (layers+1) x [F, Ds]
    acc = states[0].copy()
    for h in states[1:]:
        acc += h  # float32, as the reference's mean of the stacked states
    mean = acc / xp.float32(len(states))  # uniform mean of every hidden state
    return mean[::cfg.semantic_downsample_factor]  # [F, Ds] -> [T, Ds]


def _elu(x):
    """`spec.elu`."""
    return xp.where(x > 0, x, xp.expm1(xp.minimum(x, 0)))


def _semantic_encode(enc: EncoderParams, cfg: HiggsAudioV2TokenizerConfig, x):
    """encoder_semantic: x [1, T, Ds] -> [1, T, Ds] (ELU residual units, stride-1 convs)."""
    k, uk = cfg.kernel_size, cfg.unit_kernel_size
    x = _conv(enc.sem_conv, x, padding=k // 2)
    for units, conv in enc.sem_blocks:
        for u in units:
            y = _conv(u.conv1, _elu(x), dilation=u.dilation, padding=(uk - 1) // 2 * u.dilation)
            x = x + _conv(u.conv2, _elu(y))
        x = _conv(conv, x, padding=1)  # 3 taps: strides other than 1 are rejected by the config
    return x


def _acoustic_encode(enc: EncoderParams, x):
    """DAC encoder: x [1, L, 1] -> [1, T, Ca]."""
    x = _conv(enc.ac_conv1, x, padding=3)
    for blk in enc.ac_blocks:
        for u in blk.res_units:
            x = _dac_res_unit(u, x)
        x = snake(x, blk.snake.alpha, blk.snake.inv_alpha)
        s = blk.stride
        x = _conv(blk.conv, x, stride=s, padding=math.ceil(s / 2))  # [1, S, C] -> [1, S/s, 2C]
    x = snake(x, enc.ac_snake.alpha, enc.ac_snake.inv_alpha)
    return _conv(enc.ac_conv2, x, padding=1)


def quantize(params: CodecParams, latent, cfg: HiggsAudioV2TokenizerConfig, *,
             num_quantizers: int | None = None, return_residuals: bool = False):
    """Residual VQ of latent [T, D] -> codes [Q, T] (int64); with return_residuals also the
    residual each quantizer saw, [Q, T, D].
    The fast form of the residual VQ loop of `spec.encode`."""
    enc, dec = params.encoder, params.decoder
    nq = cfg.num_quantizers if num_quantizers is None else num_quantizers
    r = to_device(latent, dtype=np.float32)  # host latents (encode_features') are accepted too
    codes, residuals = [], []
    for q in range(nq):
        residuals.append(r)
        z = r @ enc.in_w[q] + enc.in_b[q]  # [T, D] -> [T, d]
        # squared distance in the reference's order: |z|^2 - 2 z.e + |e|^2 (float32)
        dist = (z * z).sum(axis=1, keepdims=True) - 2 * (z @ enc.embed_t[q]) + enc.embed_sq[q]  # -> [T, N]
        code = dist.argmin(axis=1)  # first index on ties, like torch's max
        codes.append(code)
        r = r - (dec.embed[q][code] @ dec.out_w[q] + dec.out_b[q])  # [T, d] -> [T, D]
    shape = (0, latent.shape[0])
    # one copy back for all codebooks (and one for all residuals)
    codes = to_numpy(xp.stack(codes)).astype(np.int64) if codes else np.zeros(shape, np.int64)
    if return_residuals:
        res = to_numpy(xp.stack(residuals)) if residuals else np.zeros(shape + (latent.shape[1],), np.float32)
        return codes, res
    return codes


def _encoder_forward(params: CodecParams, waveform, cfg: HiggsAudioV2TokenizerConfig, sample_rate: int | None,
                     pad: bool) -> dict:
    if params.encoder is None:
        raise InputError("the codec was loaded without its encoder half; load it with "
                         "load_params(..., encoder=True) or load_encoder_params(...) before encoding")
    wav = check_audio(waveform, cfg.sample_rate if sample_rate is None else sample_rate, cfg)
    if pad:
        wav = pad_to_hop(wav, cfg.hop_length)
    enc = params.encoder
    t_sem = _semantic_frames(wav.shape[0], cfg)
    if t_sem < 1:
        raise AudioError(f"audio of {wav.shape[0]} samples is too short to encode; give at least "
                         f"{cfg.hop_length} samples ({1000 * cfg.hop_length // cfg.sample_rate} ms)")
    hub = _semantic_features(enc, wav, cfg)  # [T, Ds]
    sem = _semantic_encode(enc, cfg, hub[None])  # -> [1, T, Ds]

    ac_in = wav
    if _acoustic_frames(wav.shape[0], cfg) != t_sem:
        # the model's own rule for unpadded input: centre the acoustic frames on the semantic ones
        half = cfg.hop_length // 2
        ac_in = np.pad(wav, (half, half))
    if _acoustic_frames(ac_in.shape[0], cfg) != t_sem:
        raise AudioError(f"audio of {wav.shape[0]} samples gives {t_sem} semantic frames but "
                         f"{_acoustic_frames(ac_in.shape[0], cfg)} acoustic ones; encode with pad=True")
    ac = _acoustic_encode(enc, to_device(ac_in).reshape(1, -1, 1))  # [1, L, 1] -> [1, T, Ca]
    fused = xp.concatenate([ac, sem], axis=-1)[0] @ enc.fc_w + enc.fc_b  # [T, Ca + Ds] -> [T, D]
    return {"input": wav, "semantic_hubert": hub, "semantic": sem[0], "acoustic": ac[0], "fused": fused}


def encode_features(params: CodecParams, waveform, cfg: HiggsAudioV2TokenizerConfig, *, sample_rate: int | None = None,
                    pad: bool = True) -> dict:
    """The encoder's intermediate tensors as numpy arrays: `input` [L'] (the waveform after the
    padding rule), `semantic_hubert` [T, Ds] (mean of all HuBERT states, every second frame),
    `semantic` [T, Ds] (after the semantic conv encoder), `acoustic` [T, Ca], `fused` [T, D]
    (after `fc`, what the quantizer sees). Arguments as for `encode`.
    The fast form of `spec.latent` (its `fused`).
    """
    return {k: to_numpy(v) for k, v in _encoder_forward(params, waveform, cfg, sample_rate, pad).items()}


def encode(params: CodecParams, waveform, cfg: HiggsAudioV2TokenizerConfig, *, sample_rate: int | None = None,
           pad: bool = True) -> np.ndarray:
    """Mono float waveform [L] at cfg.sample_rate -> int64 codes [num_quantizers, T]
    (`sample_rate`, when given, must be that rate: a check, not a conversion).

    pad=True (default) applies the feature extractor's rule, right zero-padding to a multiple of
    the hop, so T = ceil(L / hop). pad=False feeds the samples as they are, like calling the
    reference model without its feature extractor: the model then zero-pads the acoustic branch
    by hop/2 per side whenever the two branches would give different frame counts.
    Bad input (empty, NaN/inf, wrong rate, several channels, integer PCM, too short) raises
    AudioError; silence is valid and encodes like any other signal.
    The fast form of `spec.encode`.
    """
    feats = _encoder_forward(params, waveform, cfg, sample_rate, pad)
    return quantize(params, feats["fused"], cfg)
