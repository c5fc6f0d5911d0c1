"""int8 GEMMs for the `int8` precision profile (W8A8): the plain algorithm, and the kernels
that run it on the CPU's integer dot-product units.

The profile is an approximation, labelled wherever it is offered: the backbone's projections
(q/k/v/o and the MLP) multiply int8 activations by int8 weights, accumulate in int32 and scale
back to float32. Everything else (attention's two products, the audio heads, norms, RoPE,
softmax, the residual stream, the scoring) stays float32.

The plain algorithm (`quantize_rows`, `int8_linear_plain`), which every fast form equals:
    weights      per output channel, symmetric:  sw[n] = max_k |W[n, k]| / 127,
                 Wq[n, k] = rint(W[n, k] / sw[n])            (int8 in [-127, 127])
    activations  per token (row), symmetric:     sx[m] = max_k |x[m, k]| / 127,
                 xq[m, k] = rint(x[m, k] / sx[m])            (int8 in [-127, 127])
    product      acc[m, n] = sum_k xq[m, k] * Wq[n, k]        (exact in int32: |acc| < 127² K)
                 y[m, n] = float32(acc[m, n]) * sx[m] * sw[n]  (left to right, float32)
An all-zero row or channel gets scale 1 (its codes are all 0). Inputs are finite.

The fast form (`int8_linear`), equal to it bit for bit (tests/test_int8_kernels.py holds the
product equal to numpy's int64 one on every path this machine runs, `int8_linear` equal to
`int8_linear_plain`, and the fused activation quantisation equal to `quantize_rows`):
  - the weights are quantised and packed once (`quantize_weight`) into 32-column panels,
    [N/32, K/4, 32, 4]: for each 4 k a panel holds 32 columns' 4 bytes side by side, the
    operand of a dot-product instruction (N padded to 32, K to 64, with zero codes);
  - each call quantises x, row by row, in one Numba loop (the same float32 division and rint
    as `quantize_rows`), into the path's layout: row blocks [M/8, K/4, 8, 4], whose 4-byte
    groups the microkernel broadcasts, or rows as they are, [M, K] (AMX's tiles load rows);
  - a microkernel multiplies a tile of rows by a tile of columns over the whole K in one
    LLVM loop, its accumulators in registers: AVX512-VNNI `vpdpbusd` on 512 bits (8 rows x 32
    columns, 16 accumulators), its 256-bit form where only AVX-VNNI (or AVX512VL) has it (4 x 16),
    Arm's `sdot` with the dot-product extension (4 x 16), plain Numba loops elsewhere; where
    the CPU has AMX-int8 (Xeon since Sapphire Rapids) and Linux grants the process its tile
    state, 32 x 32 blocks on the tile unit (`tdpbusd`, 64 k an instruction), whose sums are
    stored to a small buffer (the tile unit converts nothing) and scaled from there in vectors;
  - `vpdpbusd` and `tdpbusd` multiply unsigned by signed bytes: the activations are stored
    +128 (u8) and 128 x the channel's code sum is taken off after the K loop (exact in int32);
  - the product goes back to float32 in the tile's epilogue, as the plain algorithm says.
Which path runs is chosen once, from the features LLVM compiles for (`cpu_features`:
llvmlite's host CPU features, or Numba's NUMBA_CPU_FEATURES where that is set; on Arm, the core
LLVM names): the instruction must be one the compiler may emit, not only one the CPU has.
`force_path` overrides it (tests, comparisons).
Tiles run in parallel, column panels outermost (a panel stays in cache across row blocks),
through the parallel twin: inside `jit.one_pool`, as the int8 backbone runs them (BLAS then
keeps to one thread, so Numba's pool has the cores), or when parallel kernels are on.
The rows of one input are quantised once for all its projections (`quantize_activations`:
q/k/v, gate/up).

Dimension legend:
    M  rows (tokens)   K  input features   N  output features (a projection's [N, K] weight)
    Mp, Kp, Np  M, K, N padded to the row block (8; AMX 32), 64 (an AMX tile row), the panel (32)
    MR, NR  a microkernel tile's rows and columns
"""

from __future__ import annotations

import platform
from dataclasses import dataclass

import numpy as np

from . import cpu_features, jit
from .jit import prange

_QMAX = np.float32(127.0)
_MB = 8  # rows in a packed row block of activations
_NP = 32  # columns in a packed panel of weights
_KG = 4  # k in one byte group (one int32 lane of a dot-product instruction)
_KP = 64  # K is padded to this (one AMX tile row's bytes); zero codes add nothing elsewhere
_A_STRIDE = _MB * _KG  # bytes of a row block per byte group
_B_STRIDE = _NP * _KG  # bytes of a panel per byte group
_K_MAX = (2 ** 31 - 1) // (255 * 128)  # K up to which a shifted u8 x s8 sum fits in int32


# ---------------------------------------------------------------------------------------------
# The plain algorithm (the specification)
# ---------------------------------------------------------------------------------------------


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


def int8_linear_plain(x: np.ndarray, w: "Int8Weight") -> np.ndarray:
    """x [M, K] float32 @ the quantised weight's transpose -> [M, N] float32: the module
    docstring's algorithm as written, the integer product in int64 (exact)."""
    xq, sx = quantize_rows(x)  # [M, K] int8, [M]
    acc = xq.astype(np.int64) @ w.codes().astype(np.int64).T  # [M, K] @ [K, N] -> [M, N]
    return acc.astype(np.float32) * sx[:, None] * w.scale[None, :]  # [M, N] float32


# ---------------------------------------------------------------------------------------------
# Packed weights
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Int8Weight:
    """A projection's weight quantised once, at load (the float32 copy is not kept).

    `q` holds the int8 codes packed for the microkernels, [Np/32, Kp/4, 32, 4] (`codes()`
    gives them back as [N, K]); `scale` [N] the per-channel scales; `colsum` [N] each
    channel's sum of codes (int32), which a u8 x s8 kernel needs to undo the +128 shift of its
    activations."""

    q: np.ndarray  # [Np/32, Kp/4, 32, 4] int8, zero where padded
    scale: np.ndarray  # [N] float32
    colsum: np.ndarray  # [N] int32
    n_out: int  # N
    n_in: int  # K

    @property
    def nbytes(self) -> int:
        return int(self.q.nbytes + self.scale.nbytes + self.colsum.nbytes)

    def codes(self) -> np.ndarray:
        """The int8 codes as the plain algorithm has them, [N, K] (a copy)."""
        panels, groups = self.q.shape[:2]
        full = self.q.transpose(0, 2, 1, 3).reshape(panels * _NP, groups * _KG)  # -> [Np, Kp]
        return np.ascontiguousarray(full[:self.n_out, :self.n_in])


def _up(n: int, m: int) -> int:
    return -(-n // m) * m


def pack_weight(codes: np.ndarray) -> np.ndarray:
    """int8 codes [N, K] -> the panels the microkernels stream, [Np/32, Kp/4, 32, 4]."""
    n, k = codes.shape
    full = np.zeros((_up(n, _NP), _up(k, _KP)), np.int8)  # [Np, Kp], zero codes where padded
    full[:n, :k] = codes
    panels = full.reshape(-1, _NP, full.shape[1] // _KG, _KG)  # [Np/32, 32, Kp/4, 4]
    return np.ascontiguousarray(panels.transpose(0, 2, 1, 3))  # -> [Np/32, Kp/4, 32, 4]


def quantize_weight(w: np.ndarray) -> Int8Weight:
    """A float32 [N, K] projection (the checkpoint's [out, in] layout) -> its Int8Weight."""
    if w.shape[1] > _K_MAX:
        raise ValueError(f"int8 GEMM: K = {w.shape[1]} over {_K_MAX}, where int32 sums overflow")
    q, s = quantize_rows(w)  # [N, K] int8, [N]
    colsum = q.sum(axis=1, dtype=np.int32)  # [N]
    return Int8Weight(q=pack_weight(q), scale=s, colsum=colsum, n_out=w.shape[0], n_in=w.shape[1])


# ---------------------------------------------------------------------------------------------
# The microkernels: one LLVM loop over K, accumulators in registers
#
# Numba's loop vectoriser turns an int32 sum of byte products into widening multiplies (no
# faster than float32), so the tile is written in LLVM IR around the dot-product intrinsic.
# They stay in the file of the loops that call them: Numba's kernel cache keys a compiled loop
# to its own source file, so an edit to an intrinsic kept elsewhere would run stale code.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Tile:
    intrinsic: str  # the LLVM intrinsic: acc <W x i32> += dot(a, b) per 4-byte lane
    lanes: int  # W: int32 lanes per vector
    rows: int  # MR (divides the row block's 8)
    cols: int  # NR (divides the panel's 32; a multiple of W)
    bytes_type: bool  # whether a and b are passed as <4W x i8> (Arm) or <W x i32> (x86)


_TILES = {
    "vnni512": _Tile("llvm.x86.avx512.vpdpbusd.512", 16, 8, 32, False),
    "vnni256": _Tile("llvm.x86.avx512.vpdpbusd.256", 8, 4, 16, False),
    "sdot": _Tile("llvm.aarch64.neon.sdot.v4i32.v16i8", 4, 4, 16, True),
}


def emit_tile(builder, tile: _Tile, a_ptr, b_ptr, kq, c_ptr, epilogue=None) -> None:
    """Emit, at `builder`, c[r, j] = sum over kq byte groups of dot(a's 4 bytes of row r,
    b's 4 bytes of column j), for a tile.rows x tile.cols tile.

    a_ptr: i8* at the tile's first row in a row block (a group every 32 bytes, a row every 4);
    b_ptr: i8* at the tile's first column in a panel (a group every 128 bytes, a column every
    4); kq: i64 byte groups; c_ptr: i8* at MR x NR int32, row-major. The accumulators are phi
    nodes of one loop, so they stay in registers across the whole K.

    With `epilogue` (bias, sx, sw, out, stride, scaled), the sums go from the registers to a
    full tile of the output instead of c: out[r, j] = float32(c[r, j] - bias[j]) * sx[r] * sw[j]
    (scaled, float32 out) or c[r, j] - bias[j] (int32 out); bias, sw: i8* at the tile's first
    column's int32 / float32, sx: i8* at its first row's float32, out: i8* at out[first row,
    first column], stride: i64 bytes between output rows."""
    from llvmlite import ir

    i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
    vec = ir.VectorType(i32, tile.lanes)  # [W] int32
    bvec = ir.VectorType(i8, 4 * tile.lanes)  # [4W] bytes
    opnd = bvec if tile.bytes_type else vec
    module = builder.module
    fn = module.globals.get(tile.intrinsic) or ir.Function(
        module, ir.FunctionType(vec, [vec, opnd, opnd]), tile.intrinsic)
    nv = tile.cols // tile.lanes
    zero = ir.Constant(vec, None)

    entry = builder.block
    loop = builder.append_basic_block("int8_tile_loop")
    done = builder.append_basic_block("int8_tile_done")
    builder.cbranch(builder.icmp_signed(">", kq, ir.Constant(i64, 0)), loop, done)

    builder.position_at_end(loop)
    i = builder.phi(i64)
    accs = [[builder.phi(vec) for _ in range(nv)] for _ in range(tile.rows)]
    pa = builder.gep(a_ptr, [builder.mul(i, ir.Constant(i64, _A_STRIDE))], source_etype=i8)
    pb = builder.gep(b_ptr, [builder.mul(i, ir.Constant(i64, _B_STRIDE))], source_etype=i8)
    bs = []
    for v in range(nv):  # the tile's columns for this group: NR/W vectors of W columns
        p = builder.gep(pb, [ir.Constant(i64, 4 * tile.lanes * v)], source_etype=i8)
        b = builder.load(builder.bitcast(p, vec.as_pointer()), align=1, typ=vec)
        bs.append(builder.bitcast(b, opnd))
    new = []
    for r in range(tile.rows):  # each row's 4 bytes, broadcast to every lane
        p = builder.gep(pa, [ir.Constant(i64, _KG * r)], source_etype=i8)
        word = builder.load(builder.bitcast(p, i32.as_pointer()), align=1, typ=i32)
        one = builder.insert_element(ir.Constant(vec, ir.Undefined), word, ir.Constant(i32, 0))
        splat = builder.shuffle_vector(one, ir.Constant(vec, ir.Undefined), ir.Constant(vec, None))
        a = builder.bitcast(splat, opnd)
        new.append([builder.call(fn, [accs[r][v], a, bs[v]]) for v in range(nv)])
    i_next = builder.add(i, ir.Constant(i64, 1))
    builder.cbranch(builder.icmp_signed("<", i_next, kq), loop, done)
    i.add_incoming(ir.Constant(i64, 0), entry)
    i.add_incoming(i_next, loop)
    for r in range(tile.rows):
        for v in range(nv):
            accs[r][v].add_incoming(zero, entry)
            accs[r][v].add_incoming(new[r][v], loop)

    builder.position_at_end(done)
    outs = [[builder.phi(vec) for _ in range(nv)] for _ in range(tile.rows)]  # phis first
    for r in range(tile.rows):
        for v in range(nv):
            outs[r][v].add_incoming(zero, entry)
            outs[r][v].add_incoming(new[r][v], loop)
    if epilogue is None:
        for r in range(tile.rows):
            for v in range(nv):
                p = builder.gep(c_ptr, [ir.Constant(i64, 4 * (r * tile.cols + v * tile.lanes))],
                                source_etype=i8)
                builder.store(outs[r][v], builder.bitcast(p, vec.as_pointer()), align=4)
        return
    emit_epilogue(builder, tile.rows, nv, tile.lanes, lambda r, v: outs[r][v], epilogue)


def emit_epilogue(builder, rows: int, nv: int, lanes: int, sum_at, epilogue) -> None:
    """Emit the scaling of a full tile's int32 sums (sum_at(r, v): row r's v-th <lanes x i32>,
    of `rows` rows of nv vectors) into the output: out[r, j] = float32(c[r, j] - bias[j]) *
    sx[r] * sw[j] (scaled, float32 out) or c[r, j] - bias[j] (int32 out), as `emit_tile`'s
    `epilogue` describes."""
    from llvmlite import ir

    i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
    bias, sx, sw, out, stride, scaled = epilogue
    vec, f32 = ir.VectorType(i32, lanes), ir.FloatType()
    fvec = ir.VectorType(f32, lanes)

    def at(ptr, offset, ty):
        p = builder.gep(ptr, [offset if isinstance(offset, ir.Value) else ir.Constant(i64, offset)],
                        source_etype=i8)
        return builder.bitcast(p, ty.as_pointer())
    col_bias = [builder.load(at(bias, 4 * lanes * v, vec), align=4, typ=vec) for v in range(nv)]
    col_sw = [builder.load(at(sw, 4 * lanes * v, fvec), align=4, typ=fvec) for v in range(nv)]
    for r in range(rows):
        row = builder.mul(stride, ir.Constant(i64, r))
        if scaled:
            s = builder.load(at(sx, 4 * r, f32), align=4, typ=f32)
            one = builder.insert_element(ir.Constant(fvec, ir.Undefined), s, ir.Constant(i32, 0))
            s_all = builder.shuffle_vector(one, ir.Constant(fvec, ir.Undefined), ir.Constant(vec, None))
        for v in range(nv):
            val = builder.sub(sum_at(r, v), col_bias[v])  # exact: the true sum fits in int32
            if scaled:  # float32(acc) * sx[m] * sw[n], left to right, IEEE (no fast-math flags)
                val = builder.fmul(builder.fmul(builder.sitofp(val, fvec), s_all), col_sw[v])
            builder.store(val, at(out, builder.add(row, ir.Constant(i64, 4 * lanes * v)), val.type),
                          align=4)


def _operands(context, builder, sig, args):
    """An intrinsic's arguments as LLVM values: (i64(k): argument k as an i64, ptr(k, off):
    array k's data as i8*, `off` bytes on, arr(k): array k's structure)."""
    from llvmlite import ir
    from numba.core import types

    i8p = ir.IntType(8).as_pointer()

    def arr(k):
        return context.make_array(sig.args[k])(context, builder, args[k])

    def i64(k):
        return context.cast(builder, args[k], sig.args[k], types.int64)

    def ptr(k, off=None):
        data = builder.bitcast(arr(k).data, i8p)
        return data if off is None else builder.gep(data, [off], source_etype=ir.IntType(8))
    return i64, ptr, arr


def _epilogue_operands(context, builder, sig, args, k):
    """`emit_epilogue`'s operands from an intrinsic's arguments k.. (bias, sx, sw, out, m0,
    n0): the tile's first column of bias and sw, its first row of sx, out at [m0, n0]."""
    from llvmlite import ir
    from numba.core import types

    i64, ptr, arr = _operands(context, builder, sig, args)
    four = ir.Constant(ir.IntType(64), 4)
    m0, n0 = i64(k + 4), i64(k + 5)
    stride = builder.extract_value(arr(k + 3).strides, 0)  # bytes between output rows
    out = ptr(k + 3, builder.add(builder.mul(m0, stride), builder.mul(n0, four)))
    col = builder.mul(n0, four)
    return (ptr(k, col), ptr(k + 1, builder.mul(m0, four)), ptr(k + 2, col), out, stride,
            sig.args[k + 3].dtype == types.float32)


def _tile_intrinsic(name: str, epilogue: bool = False):
    """A Numba intrinsic running `emit_tile` for the path: tile(a, a_off, b, b_off, kq, c) (a, b
    the packed operands as 1-D byte arrays, offsets in bytes, c the MR x NR int32 sums) or, with
    `epilogue`, tile(a, a_off, b, b_off, kq, bias, sx, sw, out, m0, n0) writing a full tile of
    out [M, N] (float32: scaled; int32: the bare sums) at row m0, column n0."""
    tile = _TILES[name]

    def typer(a, a_off, b, b_off, kq, *rest):
        from numba.core import types

        def codegen(context, builder, sig, args):
            i64, ptr, _ = _operands(context, builder, sig, args)
            a_ptr, b_ptr, kq_ = ptr(0, i64(1)), ptr(2, i64(3)), i64(4)
            if epilogue:
                emit_tile(builder, tile, a_ptr, b_ptr, kq_, None,
                          _epilogue_operands(context, builder, sig, args, 5))
            else:
                emit_tile(builder, tile, a_ptr, b_ptr, kq_, ptr(5))
            return context.get_dummy_value()
        return types.void(a, a_off, b, b_off, kq, *rest), codegen

    if epilogue:
        def intrinsic(typingctx, a, a_off, b, b_off, kq, bias, sx, sw, out, m0, n0):
            return typer(a, a_off, b, b_off, kq, bias, sx, sw, out, m0, n0)
    else:
        def intrinsic(typingctx, a, a_off, b, b_off, kq, c):
            return typer(a, a_off, b, b_off, kq, c)
    intrinsic.__name__ = intrinsic.__qualname__ = f"_tile_{name}{'_epilogue' if epilogue else ''}"
    return jit.intrinsic(intrinsic)


_tile_vnni512 = _tile_intrinsic("vnni512")
_tile_vnni256 = _tile_intrinsic("vnni256")
_tile_sdot = _tile_intrinsic("sdot")
_tile_vnni512_epilogue = _tile_intrinsic("vnni512", epilogue=True)
_tile_vnni256_epilogue = _tile_intrinsic("vnni256", epilogue=True)
_tile_sdot_epilogue = _tile_intrinsic("sdot", epilogue=True)


# AMX (Intel Xeon since Sapphire Rapids): eight tile registers of 16 rows x 64 bytes, and one
# instruction (`tdpbusd`) that adds a [16, 64] u8 tile times a [64, 16] s8 tile (16 byte groups
# of 16 columns x 4) into a [16, 16] int32 tile. A block is 32 rows x a 32-column panel: tiles
# 0-3 its four [16, 16] quarters, 4-5 two row tiles of A (row-major codes, 64 k each), 6-7 the
# panel's two column halves, read in the panel's own layout (a byte group every 128 bytes).
_AMX_ROWS = 32
_AMX_CONFIG = bytes([1] + [0] * 15 + [64, 0] * 8 + [0, 0] * 8 + [16] * 8 + [0] * 8)  # palette 1


def _amx_fn(builder, name, *args):
    from llvmlite import ir

    module = builder.module
    return module.globals.get(name) or ir.Function(module, ir.FunctionType(ir.VoidType(), args), name)


def emit_amx_configure(builder, cfg_ptr) -> None:
    """Emit the tile configuration of `emit_amx_block` (cfg_ptr: i8* at 64 bytes, written here):
    once per thread before its blocks; `emit_amx_release` after them."""
    from llvmlite import ir

    i8 = ir.IntType(8)
    builder.store(ir.Constant(ir.ArrayType(i8, 64), bytearray(_AMX_CONFIG)),
                  builder.bitcast(cfg_ptr, ir.ArrayType(i8, 64).as_pointer()))
    builder.call(_amx_fn(builder, "llvm.x86.ldtilecfg", cfg_ptr.type), [cfg_ptr])


def emit_amx_release(builder) -> None:
    builder.call(_amx_fn(builder, "llvm.x86.tilerelease"), [])


def emit_amx_block(builder, a_ptr, a_stride, b_ptr, kc, c_ptr, epilogue=None) -> None:
    """Emit, at `builder`, the int32 sums of a 32-row x 32-column block over kc chunks of 64 k
    into c [32, 32] (row-major): a_ptr i8* at the block's first row of A ([Mp, Kp] bytes,
    a_stride i64 bytes a row), b_ptr i8* at its panel, c_ptr i8*. The tiles must be
    configured (`emit_amx_configure`) on this thread. With `epilogue` (`emit_tile`'s), a full
    block of the output is written from c as well, in vectors of 16 columns."""
    from llvmlite import ir

    i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
    ptr = a_ptr.type
    fn = lambda name, *args: _amx_fn(builder, name, *args)  # noqa: E731
    zero, dot = fn("llvm.x86.tilezero", i8), fn("llvm.x86.tdpbusd", i8, i8, i8)
    load, store = fn("llvm.x86.tileloadd64", i8, ptr, i64), fn("llvm.x86.tilestored64", i8, ptr, i64)
    t = lambda n: ir.Constant(i8, n)  # noqa: E731  (a tile register's number)
    c64 = lambda n: ir.Constant(i64, n)  # noqa: E731

    def at(p, offset):
        return builder.gep(p, [offset if isinstance(offset, ir.Value) else c64(offset)],
                           source_etype=i8)
    for q in range(4):
        builder.call(zero, [t(q)])
    entry = builder.block
    loop = builder.append_basic_block("amx_loop")
    done = builder.append_basic_block("amx_done")
    builder.cbranch(builder.icmp_signed(">", kc, c64(0)), loop, done)
    builder.position_at_end(loop)
    i = builder.phi(i64)
    pa = at(a_ptr, builder.mul(i, c64(64)))  # 64 k of the block's rows
    pb = at(b_ptr, builder.mul(i, c64(16 * _B_STRIDE)))  # 16 byte groups of the panel
    builder.call(load, [t(4), pa, a_stride])
    builder.call(load, [t(5), at(pa, builder.mul(a_stride, c64(16))), a_stride])
    builder.call(load, [t(6), pb, c64(_B_STRIDE)])
    builder.call(load, [t(7), at(pb, 64), c64(_B_STRIDE)])
    for q, (a, b) in enumerate(((4, 6), (4, 7), (5, 6), (5, 7))):
        builder.call(dot, [t(q), t(a), t(b)])
    i_next = builder.add(i, c64(1))
    builder.cbranch(builder.icmp_signed("<", i_next, kc), loop, done)
    i.add_incoming(c64(0), entry)
    i.add_incoming(i_next, loop)
    builder.position_at_end(done)
    for q, offset in enumerate((0, 64, 16 * 128, 16 * 128 + 64)):  # quarters of c [32, 32]
        builder.call(store, [t(q), at(c_ptr, offset), c64(128)])
    if epilogue is not None:  # the tile unit has no conversions: the sums come back from c
        vec = ir.VectorType(i32, 16)

        def sum_at(r, v):
            p = builder.bitcast(at(c_ptr, 4 * (r * _NP + 16 * v)), vec.as_pointer())
            return builder.load(p, align=4, typ=vec)
        emit_epilogue(builder, _AMX_ROWS, _NP // 16, 16, sum_at, epilogue)


def _amx_intrinsic(epilogue: bool):
    """A Numba intrinsic running `emit_amx_block`: block(a, a_off, a_stride, b, b_off, kc, c),
    the int32 sums of the 32 x 32 block whose A rows start at byte a_off of a (a_stride bytes
    a row) and whose panel starts at byte b_off of b, over kc chunks of 64 k, into c (32 * 32
    int32); with `epilogue`, block(..., c, bias, sx, sw, out, m0, n0) also writes the full
    block of out [M, N] at row m0, column n0 (as `_tile_intrinsic`'s)."""

    def typer(a, a_off, a_stride, b, b_off, kc, c, *rest):
        from numba.core import types

        def codegen(context, builder, sig, args):
            i64, ptr, _ = _operands(context, builder, sig, args)
            epi = _epilogue_operands(context, builder, sig, args, 7) if epilogue else None
            emit_amx_block(builder, ptr(0, i64(1)), i64(2), ptr(3, i64(4)), i64(5), ptr(6), epi)
            return context.get_dummy_value()
        return types.void(a, a_off, a_stride, b, b_off, kc, c, *rest), codegen

    if epilogue:
        def intrinsic(typingctx, a, a_off, a_stride, b, b_off, kc, c, bias, sx, sw, out, m0, n0):
            return typer(a, a_off, a_stride, b, b_off, kc, c, bias, sx, sw, out, m0, n0)
    else:
        def intrinsic(typingctx, a, a_off, a_stride, b, b_off, kc, c):
            return typer(a, a_off, a_stride, b, b_off, kc, c)
    intrinsic.__name__ = intrinsic.__qualname__ = f"_amx_block{'_epilogue' if epilogue else ''}"
    return jit.intrinsic(intrinsic)


_amx_block = _amx_intrinsic(False)
_amx_block_epilogue = _amx_intrinsic(True)


@jit.intrinsic
def _amx_tiles(typingctx, on):
    """Configure this thread's tiles for `_amx_block` (on: True) or release them (False)."""
    from llvmlite import ir
    from numba.core import cgutils, types

    def codegen(context, builder, sig, args):
        if sig.args[0].literal_value:
            cfg = cgutils.alloca_once(builder, ir.ArrayType(ir.IntType(8), 64))
            emit_amx_configure(builder, builder.bitcast(cfg, ir.IntType(8).as_pointer()))
        else:
            emit_amx_release(builder)
        return context.get_dummy_value()
    if not isinstance(on, types.BooleanLiteral):
        return None
    return types.void(on), codegen


# ---------------------------------------------------------------------------------------------
# Numba loops: activation quantisation and packing, the tiles' driver and epilogue
# ---------------------------------------------------------------------------------------------

_ABS_BITS = np.int32(0x7FFFFFFF)  # a float32's bits without its sign
_TINY = np.finfo(np.float32).tiny  # the smallest normal float32


def _quantize_pack_impl(x, xbits, shift, mb, groups, ap, sx):
    """Rows of x [M, K] (xbits: the same memory as int32) -> sx [M] and their codes + shift,
    packed [Mp/mb, Kp/4, mb, 4] in ap (groups = Kp/4; mb = 1: row-major [Mp, Kp]). A row block
    at a time: its rows' codes side by side in a small buffer, then written out in ap's order
    (sequential stores, not a 32-byte stride). Rows past M (to ap's Mp) get zero codes."""
    m, k = x.shape
    blocks = ap.size // (groups * _KG * mb)  # Mp/mb
    words = ap.view(np.uint32)  # [Mp/mb, Kp/4, mb]: a row's 4 bytes of a group are one word
    for blk in prange(blocks):
        if mb == 1:  # row-major: a row's codes go straight to their place
            codes = ap[blk * groups * _KG:(blk + 1) * groups * _KG].reshape((1, groups * _KG))
            codes[0, (k if blk < m else 0):] = np.uint8(shift)  # padding: zero codes
        else:
            codes = np.full((mb, groups * _KG), np.uint8(shift))  # [mb, Kp]; padding: zero codes
        for r in range(min(mb, m - blk * mb)):  # past M: padding rows
            i = blk * mb + r
            row, bits, out = x[i], xbits[i], codes[r]
            # max |x| on the bit patterns: for finite floats, ordered as the values (and an
            # int32 max vectorises, where a float one waits on NaN rules).
            top = np.int32(0)
            for j in range(k):
                v = np.int32(bits[j] & _ABS_BITS)
                top = v if v > top else top
            amax = jit.f32_from_bits(top)
            # The plain algorithm's float32 division and rint (no fastmath here: a division
            # must not become a reciprocal multiply).
            s = amax / _QMAX if amax > 0 else np.float32(1.0)
            sx[i] = s
            if s >= _TINY:  # |x / s| <= 127 (1 + 2^-23) < 127.5: rint is within [-127, 127]
                for j in range(k):
                    out[j] = np.uint8(np.int32(np.rint(row[j] / s)) + shift)
            else:  # a subnormal scale: its rounding can push x / s past 127, so clip
                for j in range(k):
                    qv = np.rint(row[j] / s)
                    qv = np.float32(-127.0) if qv < np.float32(-127.0) else qv
                    qv = np.float32(127.0) if qv > np.float32(127.0) else qv
                    out[j] = np.uint8(np.int32(qv) + shift)
        if mb == 1:
            continue
        cw = codes.reshape(-1).view(np.uint32)  # [mb * Kp/4]: row r's group g at r * Kp/4 + g
        base = blk * groups * mb
        for g in range(groups):
            for r in range(mb):
                words[base + g * mb + r] = cw[r * groups + g]


def _pack_codes_impl(xq, shift, mb, groups, ap):
    """Int8 codes xq [M, K] + shift -> packed [Mp/mb, Kp/4, mb, 4] in ap (the bare product's
    A; rows past M get zero codes)."""
    m, k = xq.shape
    words = ap.view(np.uint32)
    for i in prange(ap.size // (groups * _KG)):  # Mp
        codes = np.full(groups * _KG, np.uint8(shift))  # [Kp]
        if i < m:
            row = xq[i]
            for j in range(k):
                codes[j] = np.uint8(np.int32(row[j]) + shift)
        cw = codes.view(np.uint32)
        base = (i // mb) * groups * mb + i % mb
        for g in range(groups):
            words[base + g * mb] = cw[g]


_quantize_pack_nb, _quantize_pack_nb_par = jit.twice(_quantize_pack_impl, pooled=True)
_pack_codes_nb, _pack_codes_nb_par = jit.twice(_pack_codes_impl)


@jit.njit(inline="always", error_model="numpy")
def _epilogue(c, mr, nr, m0, n0, m, n, bias, sx, sw, out, acc):
    """A tile's int32 sums c [MR, NR] -> out (float32, the plain algorithm's scaling) or, when
    out is empty (the bare product), acc (int32); the shift undone (bias [N]: shift x the
    code sums; exact, the true sum fits in int32); rows and columns past M, N dropped. The
    full tiles do this in the microkernel's IR (`emit_tile`); this is the tails' form."""
    cols = min(nr, n - n0)
    bs, ws = bias[n0:n0 + cols], sw[n0:n0 + cols]
    for r in range(min(mr, m - m0)):
        cr = c[r * nr:r * nr + cols]
        if out.shape[0] == 0:
            arow = acc[m0 + r, n0:n0 + cols]
            for j in range(cols):
                arow[j] = cr[j] - bs[j]
        else:
            orow, s = out[m0 + r, n0:n0 + cols], sx[m0 + r]
            for j in range(cols):
                orow[j] = np.float32(np.int32(cr[j] - bs[j])) * s * ws[j]


_CHUNK = 16  # row tiles one task runs, one after another, against the same column tile


@jit.njit(inline="always", error_model="numpy")
def _task(t, m, n, mr, nr):
    """Task t -> (column tile, its first and end row tile): column tiles outermost (a task
    keeps its weight panel in cache across its row tiles), then chunks of row tiles."""
    n_rt = (m + mr - 1) // mr
    chunks = (n_rt + _CHUNK - 1) // _CHUNK
    col, ch = t // chunks, t % chunks
    return col, ch * _CHUNK, min(n_rt, (ch + 1) * _CHUNK)


@jit.njit(inline="always", error_model="numpy")
def _tile_origin(col, rt, kq, mr, nr):
    """(column tile, row tile) -> (byte offset in A, in B, first row, first column)."""
    per_panel = _NP // nr
    panel, ct = col // per_panel, col % per_panel
    m0, n0 = rt * mr, panel * _NP + ct * nr
    a_off = (m0 // _MB) * kq * _A_STRIDE + (m0 % _MB) * _KG
    b_off = panel * kq * _B_STRIDE + ct * nr * _KG
    return a_off, b_off, m0, n0


@jit.njit(inline="always", error_model="numpy")
def _n_tasks(m, n, mr, nr):
    n_rt = (m + mr - 1) // mr
    return (n_rt + _CHUNK - 1) // _CHUNK * ((n + _NP - 1) // _NP) * (_NP // nr)


def _gemm_vnni512_impl(ap, bp, kq, m, n, bias, sx, sw, out, acc):
    raw = out.shape[0] == 0
    for t in prange(_n_tasks(m, n, 8, 32)):
        col, rt0, rt1 = _task(t, m, n, 8, 32)
        c = np.empty(8 * 32, np.int32)  # [MR, NR], for a tile in the tails
        for rt in range(rt0, rt1):
            a_off, b_off, m0, n0 = _tile_origin(col, rt, kq, 8, 32)
            if m0 + 8 <= m and n0 + 32 <= n:  # a full tile: the epilogue in registers
                if raw:
                    _tile_vnni512_epilogue(ap, a_off, bp, b_off, kq, bias, sx, sw, acc, m0, n0)
                else:
                    _tile_vnni512_epilogue(ap, a_off, bp, b_off, kq, bias, sx, sw, out, m0, n0)
            else:
                _tile_vnni512(ap, a_off, bp, b_off, kq, c)
                _epilogue(c, 8, 32, m0, n0, m, n, bias, sx, sw, out, acc)


def _gemm_vnni256_impl(ap, bp, kq, m, n, bias, sx, sw, out, acc):
    raw = out.shape[0] == 0
    for t in prange(_n_tasks(m, n, 4, 16)):
        col, rt0, rt1 = _task(t, m, n, 4, 16)
        c = np.empty(4 * 16, np.int32)  # [MR, NR], for a tile in the tails
        for rt in range(rt0, rt1):
            a_off, b_off, m0, n0 = _tile_origin(col, rt, kq, 4, 16)
            if m0 + 4 <= m and n0 + 16 <= n:  # a full tile: the epilogue in registers
                if raw:
                    _tile_vnni256_epilogue(ap, a_off, bp, b_off, kq, bias, sx, sw, acc, m0, n0)
                else:
                    _tile_vnni256_epilogue(ap, a_off, bp, b_off, kq, bias, sx, sw, out, m0, n0)
            else:
                _tile_vnni256(ap, a_off, bp, b_off, kq, c)
                _epilogue(c, 4, 16, m0, n0, m, n, bias, sx, sw, out, acc)


def _gemm_sdot_impl(ap, bp, kq, m, n, bias, sx, sw, out, acc):
    raw = out.shape[0] == 0
    for t in prange(_n_tasks(m, n, 4, 16)):
        col, rt0, rt1 = _task(t, m, n, 4, 16)
        c = np.empty(4 * 16, np.int32)  # [MR, NR], for a tile in the tails
        for rt in range(rt0, rt1):
            a_off, b_off, m0, n0 = _tile_origin(col, rt, kq, 4, 16)
            if m0 + 4 <= m and n0 + 16 <= n:  # a full tile: the epilogue in registers
                if raw:
                    _tile_sdot_epilogue(ap, a_off, bp, b_off, kq, bias, sx, sw, acc, m0, n0)
                else:
                    _tile_sdot_epilogue(ap, a_off, bp, b_off, kq, bias, sx, sw, out, m0, n0)
            else:
                _tile_sdot(ap, a_off, bp, b_off, kq, c)
                _epilogue(c, 4, 16, m0, n0, m, n, bias, sx, sw, out, acc)


def _gemm_plain_impl(ap, bp, kq, m, n, bias, sx, sw, out, acc):
    # Plain loops over the same packed operands (signed codes, no shift), 4 rows x 32 columns
    # a tile. Written so that LLVM vectorises every loop: a group's 128 weight bytes widened
    # once, each row's 4 codes repeated across 128 lanes, lane-wise products summed per lane,
    # and each column's 4 lanes added at the end.
    for t in prange(_n_tasks(m, n, 4, 32)):
        col, rt0, rt1 = _task(t, m, n, 4, 32)
        lanes = np.empty(4 * _B_STRIDE, np.int32)  # [4 rows, 32 columns x 4 bytes]
        bw = np.empty(_B_STRIDE, np.int32)
        pat = np.empty(_B_STRIDE, np.int32)
        c = np.empty(4 * 32, np.int32)
        for rt in range(rt0, rt1):
            a_off, b_off, m0, n0 = _tile_origin(col, rt, kq, 4, 32)
            lanes[:] = 0
            for g in range(kq):
                pa, pb = a_off + g * _A_STRIDE, b_off + g * _B_STRIDE
                for e in range(_B_STRIDE):
                    bw[e] = bp[pb + e]
                for r in range(4):
                    for e in range(_B_STRIDE):
                        pat[e] = ap[pa + _KG * r + (e & 3)]
                    lr = lanes[r * _B_STRIDE:(r + 1) * _B_STRIDE]
                    for e in range(_B_STRIDE):
                        lr[e] += pat[e] * bw[e]
            for r in range(4):
                for j in range(32):
                    q = r * _B_STRIDE + j * _KG
                    c[r * 32 + j] = lanes[q] + lanes[q + 1] + lanes[q + 2] + lanes[q + 3]
            _epilogue(c, 4, 32, m0, n0, m, n, bias, sx, sw, out, acc)


def _gemm_amx_impl(ap, bp, kq, m, n, bias, sx, sw, out, acc):
    # A is row-major [Mp, Kp] here (Mp: M padded to 32 rows), the tile loads' layout.
    raw = out.shape[0] == 0
    for t in prange(_n_tasks(m, n, _AMX_ROWS, _NP)):
        col, rt0, rt1 = _task(t, m, n, _AMX_ROWS, _NP)
        c = np.empty(_AMX_ROWS * _NP, np.int32)  # [32, 32]
        _amx_tiles(True)  # tile state is per thread: configured by each task, released after
        for rt in range(rt0, rt1):
            m0, n0 = rt * _AMX_ROWS, col * _NP
            a_off, b_off = m0 * kq * _KG, col * kq * _B_STRIDE
            if m0 + _AMX_ROWS <= m and n0 + _NP <= n:  # a full block: the epilogue vectorised
                if raw:
                    _amx_block_epilogue(ap, a_off, kq * _KG, bp, b_off, kq // 16, c,
                                        bias, sx, sw, acc, m0, n0)
                else:
                    _amx_block_epilogue(ap, a_off, kq * _KG, bp, b_off, kq // 16, c,
                                        bias, sx, sw, out, m0, n0)
            else:
                _amx_block(ap, a_off, kq * _KG, bp, b_off, kq // 16, c)
                _epilogue(c, _AMX_ROWS, _NP, m0, n0, m, n, bias, sx, sw, out, acc)
        _amx_tiles(False)


_GEMMS = {
    "amx": jit.twice(_gemm_amx_impl, pooled=True),
    "vnni512": jit.twice(_gemm_vnni512_impl, pooled=True),
    "vnni256": jit.twice(_gemm_vnni256_impl, pooled=True),
    "sdot": jit.twice(_gemm_sdot_impl, pooled=True),
    "plain": jit.twice(_gemm_plain_impl, pooled=True),
}
_SHIFT = {"amx": 128, "vnni512": 128, "vnni256": 128, "sdot": 0, "plain": 0}  # u8 x s8: +128
# A's layout where it is not row blocks of 8 padded to 8: (rows per block, [Mp/mb, Kp/4, mb, 4],
# 1 being row-major; the rows M is padded to)
_A_LAYOUT = {"amx": (1, _AMX_ROWS)}


# ---------------------------------------------------------------------------------------------
# The path, chosen once
# ---------------------------------------------------------------------------------------------

PATHS = ("amx", "vnni512", "vnni256", "sdot", "plain")  # fastest first
_path: str | None = None


def paths() -> tuple[str, ...]:
    """The paths this machine can run (its compiler may emit their instructions), fastest first."""
    f = cpu_features.compiler_features()
    arm = platform.machine().lower() in ("aarch64", "arm64")
    ok = {"amx": not arm and {"amx-int8", "amx-tile"} <= f and cpu_features.amx_permitted(),
          "vnni512": not arm and "avx512vnni" in f,
          "vnni256": not arm and ("avxvnni" in f or {"avx512vnni", "avx512vl"} <= f),
          "sdot": arm and cpu_features.arm_dotprod(f),
          "plain": True}
    return tuple(p for p in PATHS if ok[p])


def path() -> str:
    """The path `int8_linear` runs: the fastest this machine can, chosen at the first call."""
    global _path
    if _path is None:
        _path = paths()[0]
    return _path


def force_path(name: str | None) -> None:
    """Run `name` ("amx", "vnni512", "vnni256", "sdot", "plain") from now on, or choose again (None).
    A path this machine cannot run is refused (ValueError), before anything compiles."""
    global _path
    if name is not None and name not in paths():
        raise ValueError(f"int8 path {name!r} cannot run here (this machine runs {paths()})")
    _path = name


# ---------------------------------------------------------------------------------------------
# The public GEMMs
# ---------------------------------------------------------------------------------------------

_EMPTY_F32 = np.empty((0, 0), np.float32)
_EMPTY_I32 = np.empty((0, 0), np.int32)


def idle_kernels(in_use: bool) -> set[str]:
    """The compiled kernels of this module a process will not call (by qualified name, both
    twins), so that a warm-up does not wait for them: all of them where the int8 profile is
    not in use, else the GEMMs of the paths other than `path()` and the bare product's packing
    (int8_matmul). (Which twin of the others runs, `jit.uncached` knows.)"""
    impls = {name: fn.__qualname__ for name, fn in (
        ("amx", _gemm_amx_impl), ("vnni512", _gemm_vnni512_impl), ("vnni256", _gemm_vnni256_impl),
        ("sdot", _gemm_sdot_impl), ("plain", _gemm_plain_impl))}
    twins = lambda q: {q, q + "_par"}  # noqa: E731  (jit.twice names the parallel twin so)
    every = set().union(*(twins(q) for q in impls.values()), twins(_quantize_pack_impl.__qualname__),
                        twins(_pack_codes_impl.__qualname__))
    if not in_use:
        return every
    return every - twins(impls[path()]) - twins(_quantize_pack_impl.__qualname__)


def _packed_a(m: int, k: int, name: str) -> tuple[np.ndarray, int, int]:
    """A's buffer for path `name` ([Mp * Kp] bytes), its rows per block and Kp/4."""
    kp, (mb, pad) = _up(k, _KP), _A_LAYOUT.get(name, (_MB, _MB))
    return np.empty(_up(m, pad) * kp, np.uint8), mb, kp // _KG


def _run(name: str, ap, w: Int8Weight, m: int, sx, out, acc) -> None:
    serial, par = _GEMMS[name]
    ap_ = ap if _SHIFT[name] else ap.view(np.int8)
    kern = jit.serial_or_parallel(serial, par, m * w.n_out, pooled=True)
    bias = w.colsum * np.int32(_SHIFT[name])  # [N] int32: what the shift added to each sum
    kern(ap_, w.q.reshape(-1), w.q.shape[1], m, w.n_out, bias, sx, w.scale, out, acc)


@dataclass(frozen=True, eq=False)
class Int8Rows:
    """Activations quantised and packed once (`quantize_activations`), for every projection
    of the same input (q/k/v, gate/up): `int8_linear` takes them in the float rows' place."""

    packed: np.ndarray  # [Mp * Kp] uint8: the codes + the path's shift, in its A layout
    scale: np.ndarray  # [M] float32, sx
    shape: tuple  # (M, K) of the float rows
    path: str  # the path whose shift the codes carry


def quantize_activations(x: np.ndarray) -> Int8Rows:
    """Float32 rows x [M, K] -> their codes and scales as `quantize_rows` gives them, packed
    for this machine's path (one fused Numba loop)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    m, k = x.shape
    name = path()
    (ap, mb, groups), sx = _packed_a(m, k, name), np.empty(m, np.float32)
    quant = jit.serial_or_parallel(_quantize_pack_nb, _quantize_pack_nb_par, x.size, pooled=True)
    quant(x, x.view(np.int32), np.int32(_SHIFT[name]), mb, groups, ap, sx)
    return Int8Rows(ap, sx, (m, k), name)


def int8_linear(x, w: Int8Weight, out: np.ndarray | None = None) -> np.ndarray:
    """x [M, K] float32 (or its Int8Rows) @ the quantised weight's transpose -> [M, N]
    float32, into `out` when given: equal bit for bit to `int8_linear_plain`, on this
    machine's fastest path."""
    rows = x if isinstance(x, Int8Rows) else quantize_activations(x)
    m, k = rows.shape
    if k != w.n_in:
        raise ValueError(f"int8_linear: x has {k} features, the weight takes {w.n_in}")
    if out is not None and out.shape != (m, w.n_out):
        raise ValueError(f"int8_linear: out is {out.shape}, the product is {(m, w.n_out)}")
    if rows.path != path():
        raise ValueError(f"int8_linear: rows packed for path {rows.path!r}, running {path()!r}")
    direct = out is not None and out.dtype == np.float32 and out.flags.c_contiguous
    y = out if direct else np.empty((m, w.n_out), np.float32)  # [M, N]
    if m:
        _run(rows.path, rows.packed, w, m, rows.scale, y, _EMPTY_I32)
    if out is None or direct:
        return y
    out[...] = y
    return out


def int8_matmul(xq: np.ndarray, w: Int8Weight) -> np.ndarray:
    """The bare integer product: int8 codes xq [M, K] @ the weight's codes transposed ->
    int32 [M, N], exact (|sum| < 127² K), on this machine's path: what the microkernel
    computes, without the scales."""
    xq = np.ascontiguousarray(xq, dtype=np.int8)
    m, k = xq.shape
    if k != w.n_in:
        raise ValueError(f"int8_matmul: xq has {k} features, the weight takes {w.n_in}")
    name = path()
    ap, mb, groups = _packed_a(m, k, name)
    jit.serial_or_parallel(_pack_codes_nb, _pack_codes_nb_par, xq.size)(
        xq, np.int32(_SHIFT[name]), mb, groups, ap)
    acc = np.empty((m, w.n_out), np.int32)  # [M, N]
    if m:
        _run(name, ap, w, m, np.ones(m, np.float32), _EMPTY_F32, acc)
    return acc


def quantize_rows_fast(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`quantize_rows` through the fused Numba loop that `int8_linear` runs (unpacked again,
    for tests): (int8 codes [M, K], float32 scales [M]), equal to the plain one's."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    m, k = x.shape
    (ap, mb, groups), sx = _packed_a(m, k, "plain"), np.empty(m, np.float32)
    _quantize_pack_nb(x, x.view(np.int32), np.int32(0), mb, groups, ap, sx)
    blocks = ap.reshape(-1, groups, _MB, _KG)  # [Mp/8, Kp/4, 8, 4]
    codes = blocks.transpose(0, 2, 1, 3).reshape(_up(m, _MB), -1)  # -> [Mp, Kp]
    return codes[:m, :k].view(np.int8).copy(), sx
