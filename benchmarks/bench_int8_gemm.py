#!/usr/bin/env python3
"""int8 GEMM rates at the backbone's shapes: omnicore's kernels beside MLAS and numpy.

    python3 benchmarks/bench_int8_gemm.py [--rounds 3] [--threads 1,2] [--path vnni512]

One table, GOP/s (2·M·K·N operations per product) at M = 300 rows and the full-size backbone's
projections: q (1024 -> 2048), k/v (1024 -> 1024), o (2048 -> 1024), gate/up (1024 -> 3072),
down (3072 -> 1024), and their sum over one layer's seven products. Columns:
  numpy fp32      x @ W.T in float32 (numpy's BLAS)
  MLAS int8       ONNX Runtime's MatMulInteger, u8 activations x s8 weights -> int32, the
                  weights a constant initializer (prepacked by ORT), the activations already
                  quantised: the bare product. Where the CPU has AMX-int8 (Sapphire Rapids
                  and later) MLAS and omnicore take their AMX kernels; so each runs twice:
                  "AMX" as it comes, and "VNNI" with the AMX permission request refused (a
                  seccomp filter makes arch_prctl(ARCH_REQ_XCOMP_PERM) fail, and both fall back
                  to their AVX512-VNNI kernels): the like-for-like yardstick of a CPU without AMX
  omnicore int8   int8_kernels.int8_linear: float32 in, float32 out, with the activations'
                  quantisation, the scales and the tails
  omnicore bare   int8_kernels.int8_matmul: int8 codes in, int32 out (packing of A included)
One child process per thread count holds numpy, MLAS VNNI and omnicore VNNI side by side and
times them in turn, shape by shape, --rounds times over, each cell keeping its fastest burst of
4 calls: a busy spell of a shared machine falls on every column alike, so the ratios hold where
the absolute rates do not. MLAS AMX and omnicore AMX run in a second child (a process either
may or may not use AMX). MLAS's product is checked equal to omnicore's. onnxruntime is
imported here only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

M = 300
SHAPES = [("q", 1024, 2048), ("k/v", 1024, 1024), ("o", 2048, 1024), ("gate/up", 1024, 3072),
          ("down", 3072, 1024)]
LAYER = {"q": 1, "k/v": 2, "o": 1, "gate/up": 2, "down": 1}  # products per layer of each shape
COLUMNS = ("numpy", "mlas", "omnicore", "bare", "mlas_amx", "omnicore_amx", "bare_amx")
HEAD = {"numpy": "numpy fp32", "mlas_amx": "MLAS AMX", "mlas": "MLAS VNNI", "omnicore": "omnicore int8",
        "bare": "omnicore bare", "omnicore_amx": "omnicore int8 AMX", "bare_amx": "omnicore bare AMX"}


# --- a one-node ONNX model, encoded by hand (the `onnx` package is not needed) ----------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(num: int, value) -> bytes:
    if isinstance(value, int):
        return _varint(num << 3) + _varint(value)
    value = value.encode() if isinstance(value, str) else value
    return _varint(num << 3 | 2) + _varint(len(value)) + value


def _value_info(name: str, elem: int, shape) -> bytes:
    dims = b"".join(_field(1, _field(1, d)) for d in shape)  # TensorShapeProto.dim.dim_value
    tensor_type = _field(1, elem) + _field(2, dims)
    return _field(1, name) + _field(2, _field(1, tensor_type))


def matmul_integer_model(wt) -> bytes:
    """ModelProto: Y int32 [M, N] = MatMulInteger(A uint8 [M, K], B int8 [K, N] constant,
    A's zero point 128): the product of the signed codes A - 128 and B, exact."""
    k, n = wt.shape
    UINT8, INT8, INT32 = 2, 3, 6
    b = _field(1, k) + _field(1, n) + _field(2, INT8) + _field(8, "B") + _field(9, wt.tobytes())
    za = _field(2, UINT8) + _field(8, "za") + _field(9, bytes([128]))  # a scalar
    node = (_field(1, "A") + _field(1, "B") + _field(1, "za") + _field(2, "Y") + _field(3, "mm")
            + _field(4, "MatMulInteger"))
    graph = (_field(1, node) + _field(2, "g") + _field(5, b) + _field(5, za)
             + _field(11, _value_info("A", UINT8, (M, k))) + _field(12, _value_info("Y", INT32, (M, n))))
    return _field(1, 8) + _field(7, graph) + _field(8, _field(1, "") + _field(2, 13))


def refuse_amx() -> None:
    """Make this process's request for the AMX tile state fail (EPERM), for it and its threads:
    a seccomp filter on arch_prctl(ARCH_REQ_XCOMP_PERM, ...). Linux x86-64 only."""
    import ctypes
    import struct

    allow, eperm = 0x7FFF0000, 0x00050000 | 1
    prog = [(0x20, 0, 0, 4), (0x15, 0, 5, 0xC000003E),  # arch == x86-64, else allow
            (0x20, 0, 0, 0), (0x15, 0, 3, 158),  # nr == arch_prctl
            (0x20, 0, 0, 16), (0x15, 0, 1, 0x1023),  # args[0] == ARCH_REQ_XCOMP_PERM
            (0x06, 0, 0, eperm), (0x06, 0, 0, allow)]
    filt = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *ins) for ins in prog))

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    libc = ctypes.CDLL(None, use_errno=True)
    fprog = Prog(len(prog), ctypes.cast(filt, ctypes.c_void_p))
    if libc.prctl(38, 1, 0, 0, 0) or libc.prctl(22, 2, ctypes.byref(fprog), 0, 0):  # NO_NEW_PRIVS, SECCOMP
        raise OSError(ctypes.get_errno(), "seccomp filter refused")


# --- one child: one column at one thread count --------------------------------------------


def _burst(fn, calls: int) -> float:
    """Seconds per call over `calls` calls, after one untimed call (which wakes the library's
    threads and lets the previous library's spinning ones go idle)."""
    fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def child(group: str, threads: int, path: str | None, rounds: int) -> dict:
    """One process, one thread count: the columns of `group` built for every shape, then timed
    in turn, shape by shape and column by column, `rounds` times over (so a busy spell of
    the machine falls on every column alike); each cell keeps its fastest burst."""
    import numpy as np

    from omnicore.machinery import settings
    from omnicore.model import int8_kernels as I

    settings.configure(threads=threads, parallel_kernels=threads > 1)
    if group == "side":
        refuse_amx()  # before onnxruntime loads (MLAS asks for AMX once, at its start) and
        # before omnicore chooses its path
    if path:
        I.force_path(path)
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    runs = {}  # (column, shape) -> callable
    for name, k, n in SHAPES:
        x = rng.standard_normal((M, k)).astype(np.float32)
        w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
        sess = ort.InferenceSession(matmul_integer_model(I.quantize_rows(w)[0].T.copy()), opts,
                                    providers=["CPUExecutionProvider"])
        a = (I.quantize_rows(x)[0].astype(np.int16) + 128).astype(np.uint8)
        mlas = (lambda sess=sess, a=a: sess.run(None, {"A": a}))
        w8, xq = I.quantize_weight(w), I.quantize_rows(x)[0]
        wt, out, y = np.ascontiguousarray(w.T), np.empty((M, n), np.float32), np.empty((M, n), np.float32)
        assert np.array_equal(mlas()[0], I.int8_matmul(xq, w8))  # the same exact product
        tag = "_amx" if group == "amx" else ""
        if not tag:
            runs["numpy", name] = lambda x=x, wt=wt, out=out: np.matmul(x, wt, out=out)
        runs["mlas" + tag, name] = mlas
        runs["omnicore" + tag, name] = lambda x=x, w8=w8, y=y: I.int8_linear(x, w8, y)
        runs["bare" + tag, name] = lambda xq=xq, w8=w8: I.int8_matmul(xq, w8)
    best = {key: float("inf") for key in runs}
    for _ in range(rounds):
        for key, fn in runs.items():
            for _ in range(3):
                best[key] = min(best[key], _burst(fn, 4))
    rates: dict = {}
    for (column, name), secs in best.items():
        k, n = next((k, n) for s_, k, n in SHAPES if s_ == name)
        rates.setdefault(column, {})[name] = 2.0 * M * k * n / secs / 1e9
    return {"rates": rates, "path": I.path()}


def _layer_rate(rates: dict) -> float:
    ops = sum(LAYER[name] * 2.0 * M * k * n for name, k, n in SHAPES)
    secs = sum(LAYER[name] * 2.0 * M * k * n / (rates[name] * 1e9) for name, k, n in SHAPES)
    return ops / secs / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--path", default=None, help="force omnicore's path (int8_kernels.force_path)")
    ap.add_argument("--child", nargs=2, metavar=("GROUP", "THREADS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.path, args.rounds)))
        return
    repo = str(Path(__file__).resolve().parent.parent)
    best: dict = {}
    path = {}
    for threads in (int(t) for t in args.threads.split(",")):
        for group in ("side", "amx"):
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]),
                       NUMBA_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
                       OPENBLAS_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
            cmd = [sys.executable, __file__, "--child", group, str(threads), "--rounds", str(args.rounds)]
            res = json.loads(subprocess.run(cmd + (["--path", args.path] if args.path else []), env=env,
                                            check=True, capture_output=True, text=True).stdout)
            path[group] = res["path"]
            for column, rates in res["rates"].items():
                best[threads, column] = rates
    print(f"int8 GEMMs, M = {M} rows, GOP/s (fastest burst of {args.rounds} rounds); omnicore's path: "
          f"{path['side']} (AMX refused), {path['amx']} (as it comes); load average at the end "
          f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print("| threads | shape (K -> N) | " + " | ".join(HEAD[c] for c in COLUMNS)
          + " | omnicore / MLAS, VNNI | omnicore / MLAS, AMX | omnicore AMX / numpy |")
    print("|---:|---|" + "---:|" * (len(COLUMNS) + 3))
    for threads in (int(t) for t in args.threads.split(",")):
        rows = [(f"{name} ({k} -> {n})", {c: best[threads, c][name] for c in COLUMNS}) for name, k, n in SHAPES]
        rows.append(("**one layer's 7 products**", {c: _layer_rate(best[threads, c]) for c in COLUMNS}))
        for label, r in rows:
            print(f"| {threads} | {label} | " + " | ".join(f"{r[c]:.0f}" for c in COLUMNS)
                  + f" | {r['omnicore'] / r['mlas']:.2f}x | {r['omnicore_amx'] / r['mlas_amx']:.2f}x"
                  + f" | {r['omnicore_amx'] / r['numpy']:.1f}x |")


if __name__ == "__main__":
    main()
