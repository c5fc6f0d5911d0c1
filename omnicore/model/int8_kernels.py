"""int8 GEMMs for the `int8` precision profile (W8A8): what they compute, in plain numpy.

The profile is an approximation, labelled wherever it is offered: the backbone's projections
(q/k/v/o and the MLP) multiply int8 activations by int8 weights, accumulate in int32 and scale
back to float32. Everything else (attention's two products, the audio heads, norms, RoPE,
softmax, the residual stream, the scoring) stays float32.

The plain algorithm, which every fast form equals:
    weights      per output channel, symmetric:  sw[n] = max_k |W[n, k]| / 127,
                 Wq[n, k] = rint(W[n, k] / sw[n])            (int8 in [-127, 127])
    activations  per token (row), symmetric:     sx[m] = max_k |x[m, k]| / 127,
                 xq[m, k] = rint(x[m, k] / sx[m])            (int8 in [-127, 127])
    product      acc[m, n] = sum_k xq[m, k] * Wq[n, k]        (exact in int32: |acc| < 127² K)
                 y[m, n] = float32(acc[m, n]) * sx[m] * sw[n]  (left to right, float32)
An all-zero row or channel gets scale 1 (its codes are all 0).

Dimension legend:
    M  rows (tokens)   K  input features   N  output features (a projection's [N, K] weight)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_QMAX = np.float32(127.0)


@dataclass(frozen=True, eq=False)
class Int8Weight:
    """A projection's weight quantised once, at load (the float32 copy is not kept).

    `q` holds the int8 codes in the layout the GEMM streams (plain: [N, K] as stored);
    `scale` [N] the per-channel scales; `colsum` [N] each channel's sum of codes (int32), which
    a u8 x s8 kernel needs to undo the +128 shift of its activations."""

    q: np.ndarray  # int8, the GEMM's layout
    scale: np.ndarray  # [N] float32
    colsum: np.ndarray  # [N] int32
    n_out: int  # N
    n_in: int  # K

    @property
    def nbytes(self) -> int:
        return int(self.q.nbytes + self.scale.nbytes + self.colsum.nbytes)


def _scales(a: np.ndarray) -> np.ndarray:
    """Symmetric scale of each row of a: max |a| / 127, or 1 for an all-zero row."""
    amax = np.max(np.abs(a), axis=1).astype(np.float32)  # [R, K] -> [R]
    return np.where(amax > 0, amax / _QMAX, np.float32(1.0)).astype(np.float32)


def quantize_rows(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Float32 a [R, K] -> (int8 codes [R, K], float32 scales [R]), symmetric per row."""
    a = np.asarray(a, dtype=np.float32)
    s = _scales(a)  # [R]
    q = np.rint(a / s[:, None])  # [R, K]; |q| <= 127 by construction
    return np.clip(q, -127, 127).astype(np.int8), s


def quantize_weight(w: np.ndarray) -> Int8Weight:
    """A float32 [N, K] projection (the checkpoint's [out, in] layout) -> its Int8Weight."""
    q, s = quantize_rows(w)  # [N, K] int8, [N]
    colsum = q.sum(axis=1, dtype=np.int32)  # [N]
    return Int8Weight(q=q, scale=s, colsum=colsum, n_out=w.shape[0], n_in=w.shape[1])


def int8_linear(x: np.ndarray, w: Int8Weight, out: np.ndarray | None = None) -> np.ndarray:
    """x [M, K] float32 @ the quantised weight's transpose -> [M, N] float32, into `out` when
    given: the module docstring's algorithm, with the integer product in int64 (exact)."""
    xq, sx = quantize_rows(x)  # [M, K] int8, [M]
    acc = xq.astype(np.int64) @ w.q.astype(np.int64).T  # [M, K] @ [K, N] -> [M, N], exact
    y = acc.astype(np.float32) * sx[:, None] * w.scale[None, :]  # [M, N] float32
    if out is None:
        return y
    out[...] = y
    return out
