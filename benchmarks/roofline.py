"""The numpy sgemm roofline of one forward pass: how long numpy's BLAS alone takes for exactly
its GEMMs (FLOPs: omnicore.model.cost.forward_flops). Shared by the benchmarks."""

from __future__ import annotations

import time

import numpy as np


def sgemm_roofline_seconds(params, cfg, rows, heads_positions, repeats=3):
    """Time numpy's BLAS alone takes for the GEMMs of one forward pass over `rows`: every
    layer's projections with the model's real (memory-mapped) weights, as x @ W.T like
    omnicore, the per-row attention GEMMs, and the heads; best of `repeats` full sweeps.
    Weights stream from memory as in a real step (a single layer's weights repeated would sit
    in cache and flatter the roofline)."""
    q = cfg.llm_config
    D, F, E = q.hidden_size, q.intermediate_size, q.head_dim
    H, K = q.num_attention_heads, q.num_key_value_heads
    G, N = H // K, sum(rows)
    rng = np.random.default_rng(0)
    x = {n: rng.standard_normal((N, n), dtype=np.float32) for n in (D, H * E, F)}
    out = {n: np.empty((N, n), np.float32) for n in (D, K * E, H * E, F)}
    att = [(rng.standard_normal((L * G, E), dtype=np.float32), rng.standard_normal((L, E), dtype=np.float32),
            np.empty((L * G, L), np.float32), np.empty((L * G, E), np.float32)) for L in rows]
    hx = rng.standard_normal((heads_positions, D), dtype=np.float32)

    def sweep():
        for lp in params.layers:
            np.matmul(x[D], lp.q_proj.T, out=out[H * E])
            np.matmul(x[D], lp.k_proj.T, out=out[K * E])
            np.matmul(x[D], lp.v_proj.T, out=out[K * E])
            for qm, km, s, o in att:
                for _ in range(K):
                    np.matmul(qm, km.T, out=s)
                    np.matmul(s, km, out=o)
            np.matmul(x[H * E], lp.o_proj.T, out=out[D])
            np.matmul(x[D], lp.gate_proj.T, out=out[F])
            np.matmul(x[D], lp.up_proj.T, out=out[F])
            np.matmul(x[F], lp.down_proj.T, out=out[D])
        hx @ params.audio_heads.T

    sweep()
    return min(_timed(sweep) for _ in range(repeats))


def _timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# ---------------------------------------------------------------------------------------------
# The machine's physical fp32 peak, found at run time
# ---------------------------------------------------------------------------------------------


def _cpuinfo():
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:
        return ""


def _physical_cores(cpus):
    """Distinct (package, core) pairs among the logical CPUs we may run on (SMT siblings
    share one core's FMA units)."""
    seen = set()
    for c in cpus:
        base = f"/sys/devices/system/cpu/cpu{c}/topology/"
        try:
            with open(base + "physical_package_id") as f1, open(base + "core_id") as f2:
                seen.add((f1.read().strip(), f2.read().strip()))
        except OSError:
            seen.add(("?", c))
    return len(seen)


def physical_peak(threads=None):
    """(GFLOP/s, how it was found): cores x FMA units x float32 SIMD lanes x 2 FLOP x clock.

    Lanes from the ISA flags (avx512f 16, avx2/avx 8, else 4); FMA units 2 per core with FMA
    (true of every AVX2 core since Haswell and of Zen; some AVX-512 parts have 1, which
    /proc/cpuinfo cannot tell), else 1 (separate mul and add); cores: the physical cores in
    this process's affinity mask, at most `threads`; clock: cpufreq's cpuinfo_max_freq, else a
    GHz figure in the model name, else /proc/cpuinfo's "cpu MHz" (under a hypervisor often the
    base or TSC rate, so boosted runs can exceed this "peak")."""
    import os
    import re

    info = _cpuinfo()
    flags = set()
    model = "?"
    for line in info.splitlines():
        if line.startswith("flags") and not flags:
            flags = set(line.split(":", 1)[1].split())
        elif line.startswith("model name") and model == "?":
            model = line.split(":", 1)[1].strip()
    lanes, isa = (16, "avx512f") if "avx512f" in flags else (8, "avx2" if "avx2" in flags else "avx") \
        if "avx" in flags else (4, "sse")
    fma = 2 if "fma" in flags or "avx512f" in flags else 1
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count()))
    cores = _physical_cores(cpus)
    if threads:
        cores = min(cores, int(threads))
    ghz, src = None, None
    try:
        with open("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq") as f:
            ghz, src = int(f.read()) / 1e6, "cpufreq cpuinfo_max_freq"
    except (OSError, ValueError):
        m = re.search(r"([0-9.]+)\s*GHz", model)
        if m:
            ghz, src = float(m.group(1)), "model name"
        else:
            m = re.search(r"^cpu MHz\s*:\s*([0-9.]+)", info, re.M)
            if m:
                ghz, src = float(m.group(1)) / 1e3, "/proc/cpuinfo cpu MHz (current clock; boost may exceed it)"
    if ghz is None:
        return None, "clock unknown (no cpufreq, no GHz in the model name, no cpu MHz)"
    peak = cores * fma * lanes * 2 * ghz
    how = (f"{cores} cores x {fma} FMA units x {lanes} fp32 lanes ({isa}) x 2 FLOP x {ghz:.2f} GHz "
           f"(clock from {src}; cores from sched_getaffinity + sysfs topology)")
    return peak, how


# ---------------------------------------------------------------------------------------------
# The codec's GEMMs (omnicore's im2col / polyphase forms), for a codec sgemm roofline
# ---------------------------------------------------------------------------------------------


def codec_decode_gemms(cfg, frames):
    """[(m, k, n), ...] of decoding `frames` code frames: row-major [m, k] @ [k, n] GEMMs as
    the conv layers are computed (taps side by side), dequantisation included."""
    ac = cfg.acoustic_model_config
    d, D, Ca = cfg.codebook_dim, cfg.hidden_size, ac.hidden_size
    out = [(frames, d, D)] * cfg.num_quantizers + [(frames, D, Ca)]
    c = ac.decoder_hidden_size
    out.append((frames, 7 * Ca, c))
    t = frames
    for s in ac.upsampling_ratios:
        m = 2  # K = 2 * stride taps: two input steps per output phase
        out.append((t + m - 1, m * c, s * (c // 2)))
        t, c = t * s, c // 2
        out += [(t, 7 * c, c), (t, c, c)] * 3
    out.append((t, 7 * c, 1))
    return out


def codec_encode_gemms(cfg, samples):
    """[(m, k, n), ...] of encoding `samples` 24 kHz samples (a whole number of hops)."""
    import math

    sm, ac = cfg.semantic_model_config, cfg.acoustic_model_config
    out = []
    from omnicore.model.higgs_codec import SEMANTIC_PAD

    n16 = math.ceil(cfg.semantic_sample_rate * samples / cfg.sample_rate) + 2 * SEMANTIC_PAD
    cin = 1
    for cout, k, s in zip(sm.conv_dim, sm.conv_kernel, sm.conv_stride):
        n16 = (n16 - k) // s + 1
        out.append((n16, k * cin, cout))
        cin = cout
    f, D, I = n16, sm.hidden_size, sm.intermediate_size
    g, kp = sm.num_conv_pos_embedding_groups, sm.num_conv_pos_embeddings
    out.append((f, cin, D))
    out += [(f, kp * (D // g), D // g)] * g
    H, dh = sm.num_attention_heads, D // sm.num_attention_heads
    for _ in range(sm.num_hidden_layers):
        out += [(f, D, 3 * D)] + [(f, dh, f), (f, f, dh)] * H + [(f, D, D), (f, D, I), (f, I, D)]
    t = -(-f // cfg.semantic_downsample_factor)
    ks, uk = cfg.kernel_size, cfg.unit_kernel_size
    out.append((t, ks * D, D))
    for _ in cfg.strides:
        out += [(t, uk * D, D), (t, D, D)] * len(cfg.block_dilations) + [(t, 3 * D, D)]
    c, L = ac.encoder_hidden_size, samples
    out.append((L, 7, c))
    for s in ac.downsampling_ratios:
        out += [(L, 7 * c, c), (L, c, c)] * 3
        L = L // s
        out.append((L, 2 * s * c, 2 * c))
        c *= 2
    out.append((L, 3 * c, ac.hidden_size))
    Dq = cfg.hidden_size
    out.append((L, Dq, Dq))
    out += [(L, Dq, cfg.codebook_dim), (L, cfg.codebook_dim, cfg.codebook_size),
            (L, cfg.codebook_dim, Dq)] * cfg.num_quantizers
    return out


def gemm_flops(shapes):
    return sum(2.0 * m * k * n for m, k, n in shapes)


def sgemm_seconds(shapes, repeats=3, max_rows=1 << 14):
    """Time numpy's BLAS takes for these GEMMs, best of `repeats` sweeps. GEMMs with more than
    `max_rows` rows are timed as row blocks of that size (the codec computes long convs chunk
    by chunk too) and scaled, so the operands stay a realistic size."""
    rng = np.random.default_rng(0)
    ops = {}
    for m, k, n in set(shapes):
        rows = min(m, max_rows)
        if (rows, k, n) not in ops:
            ops[(rows, k, n)] = (rng.standard_normal((rows, k), dtype=np.float32),
                                 rng.standard_normal((k, n), dtype=np.float32),
                                 np.empty((rows, n), np.float32))

    def sweep():
        total = 0.0
        for m, k, n in shapes:
            rows = min(m, max_rows)
            a, b, o = ops[(rows, k, n)]
            t0 = time.perf_counter()
            np.matmul(a, b, out=o)
            total += (time.perf_counter() - t0) * (m / rows)
        return total

    sweep()
    return min(sweep() for _ in range(repeats))
