"""The numpy sgemm roofline of one forward pass: how long numpy's BLAS alone takes for exactly
its GEMMs (FLOPs: omnicore.text.forward_flops). Shared by the benchmarks."""

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
