#!/usr/bin/env python3
"""Float32 GEMM error against float64, numpy's BLAS next to torch's, on the model's shapes.

    $OMNICORE_REF_VENV/bin/python benchmarks/accuracy_gemm.py      # numpy and torch
    python3 benchmarks/accuracy_gemm.py                            # numpy alone

Where omnicore's layers are further from a float64 run than the reference's float32 is
(benchmarks/README.md, accuracy), the difference is in the projections: numpy's OpenBLAS and
torch's MKL both multiply in float32, but sum the inner dimension in another order. This prints
||x @ W.T - exact|| / ||exact|| for random x, W (W scaled by 1/sqrt(K)) on the backbone's GEMM
shapes, and for numpy also with the inner dimension cut into 2, 4 and 8 GEMMs whose results are
added: the exact float32 reformulation that would match MKL's error, at the price of passes.
"""

from __future__ import annotations

import numpy as np

# (rows, inner K, outputs): small-checkpoint widths, then full size (q, k/v, MLP up, down, heads)
SHAPES = [(170, 64, 64), (170, 256, 256), (170, 768, 256), (290, 1024, 2048), (290, 1024, 1024),
          (290, 1024, 3072), (290, 3072, 1024), (56, 1024, 8200)]


def rel(got, exact) -> float:
    return float(np.linalg.norm(got - exact) / np.linalg.norm(exact))


def main() -> None:
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        torch = None
    rng = np.random.default_rng(0)
    head = "| rows, K, out | numpy | " + ("torch | " if torch else "") + "numpy, K in 2 | in 4 | in 8 |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for m, k, n in SHAPES:
        a = rng.standard_normal((m, k)).astype(np.float32)
        w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
        exact = a.astype(np.float64) @ w.astype(np.float64).T
        cells = [rel(a @ w.T, exact)]
        if torch:
            cells.append(rel(torch.nn.functional.linear(torch.from_numpy(a), torch.from_numpy(w)).numpy(), exact))
        for parts in (2, 4, 8):
            step = k // parts
            cells.append(rel(sum(a[:, i:i + step] @ w[:, i:i + step].T for i in range(0, k, step)), exact))
        print(f"| {m}, {k}, {n} | " + " | ".join(f"{c:.2e}" for c in cells) + " |")


if __name__ == "__main__":
    main()
