"""The int8 GEMM kernels (omnicore/model/int8_kernels.py) against the plain algorithm.

Held EQUAL, bit for bit, on every path this machine can run (each forced in turn, serial and
parallel): the integer product to numpy's int64 product on drawn shapes (tails in M, K and N,
M = 1, K < 4); `int8_linear` to `int8_linear_plain`; the fused activation quantisation to
`quantize_rows` (all-zero rows, huge, tiny and subnormal values, ties at .5). Paths the machine cannot run
are skipped with the reason; their generated code is still checked for the instruction (the
microkernel's IR compiled for a core that has it)."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omnicore.model import cpu_features
from omnicore.model import int8_kernels as I
from omnicore.model import jit

SETTINGS = settings(max_examples=30, deadline=None, derandomize=True)


@pytest.fixture(params=I.PATHS)
def path(request):
    """Each path forced in turn (skipped where this machine cannot run it), then chosen again."""
    name = request.param
    if name not in I.paths():
        pytest.skip(f"the {name} path cannot run here: this machine's compiler has no "
                    f"{ {'sdot': 'dot-product', 'amx': 'AMX tile'}.get(name, 'VNNI')} instruction "
                    f"for it ({I.paths()})")
    I.force_path(name)
    yield name
    I.force_path(None)


@pytest.fixture(params=["serial", "parallel", "pooled"])
def parallel(request, monkeypatch):
    """The serial twins; the parallel ones (parallel kernels on); the parallel ones as the
    int8 backbone runs them, inside jit.one_pool (BLAS on one thread)."""
    if request.param == "pooled" and not jit.pool_available():
        pytest.skip("numpy's OpenBLAS cannot be reached here: one_pool changes nothing")
    monkeypatch.setattr(jit, "PARALLEL_KERNELS", request.param == "parallel")
    monkeypatch.setattr(jit, "PARALLEL_MIN", 0)
    with jit.one_pool(request.param == "pooled"):
        yield request.param


def _codes(rng, shape, extreme=False):
    if extreme:  # every code at a bound: the largest sums, where an overflow would show
        return rng.choice(np.array([-127, 127], np.int8), size=shape)
    return rng.integers(-127, 128, size=shape, dtype=np.int8)


def _weight_from_codes(codes):
    """An Int8Weight holding exactly these codes (scale 1)."""
    n, k = codes.shape
    return I.Int8Weight(q=I.pack_weight(codes), scale=np.ones(n, np.float32),
                        colsum=codes.sum(axis=1, dtype=np.int32), n_out=n, n_in=k)


dims = dict(m=st.integers(1, 40), k=st.integers(1, 70), n=st.integers(1, 80))


@SETTINGS
@given(**dims, seed=st.integers(0, 2**16), extreme=st.booleans())
def _product_case(path_name, m, k, n, seed, extreme):
    rng = np.random.default_rng(seed)
    xq, wq = _codes(rng, (m, k), extreme), _codes(rng, (n, k), extreme)
    w8 = _weight_from_codes(wq)
    assert np.array_equal(w8.codes(), wq)
    got = I.int8_matmul(xq, w8)
    assert got.dtype == np.int32 and got.shape == (m, n)
    assert np.array_equal(got, xq.astype(np.int64) @ wq.astype(np.int64).T)


def test_product_equals_int64_numpy_on_drawn_shapes(path, parallel):
    _product_case(path)


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (1, 3, 33), (9, 5, 31), (300, 1024, 64), (17, 3072, 40)])
def test_product_equals_int64_numpy_at_tails_and_full_k(path, parallel, m, k, n):
    rng = np.random.default_rng(m * k + n)
    for extreme in (False, True):
        xq, wq = _codes(rng, (m, k), extreme), _codes(rng, (n, k), extreme)
        got = I.int8_matmul(xq, _weight_from_codes(wq))
        assert np.array_equal(got, xq.astype(np.int64) @ wq.astype(np.int64).T)


@SETTINGS
@given(**dims, seed=st.integers(0, 2**16), scale=st.sampled_from([1e-3, 1.0, 1e4]))
def _linear_case(path_name, m, k, n, seed, scale):
    rng = np.random.default_rng(seed)
    x = (scale * rng.standard_normal((m, k))).astype(np.float32)
    x[rng.random(m) < 0.2] = 0  # all-zero rows: scale 1, codes 0
    w = rng.standard_normal((n, k)).astype(np.float32)
    w[rng.random(n) < 0.2] = 0
    w8 = I.quantize_weight(w)
    want = I.int8_linear_plain(x, w8)
    got = I.int8_linear(x, w8)
    assert got.dtype == np.float32 and np.array_equal(got, want)


def test_int8_linear_equals_the_plain_algorithm(path, parallel):
    _linear_case(path)


@pytest.mark.parametrize("m,k,n", [(64, 128, 64), (70, 130, 100)])
def test_int8_linear_equals_the_plain_algorithm_over_full_blocks_and_tails(path, parallel, m, k, n):
    # Whole blocks of every path (AMX's 32 x 32, VNNI's 8 x 32) scale in the microkernel's
    # own epilogue, the tails in the loop's: both are held here, with and without tails.
    rng = np.random.default_rng(m + n)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w8 = I.quantize_weight(rng.standard_normal((n, k)).astype(np.float32))
    assert np.array_equal(I.int8_linear(x, w8), I.int8_linear_plain(x, w8))


def test_int8_linear_writes_into_out(path):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((13, 40)).astype(np.float32)
    w8 = I.quantize_weight(rng.standard_normal((37, 40)).astype(np.float32))
    want = I.int8_linear_plain(x, w8)
    out = np.full((13, 37), np.nan, np.float32)
    assert I.int8_linear(x, w8, out=out) is out and np.array_equal(out, want)
    strided = np.full((13, 74), np.nan, np.float32)[:, ::2]  # not contiguous: through a copy
    assert I.int8_linear(x, w8, out=strided) is strided and np.array_equal(strided, want)
    xs = np.asfortranarray(x)
    assert np.array_equal(I.int8_linear(xs, w8), want)
    assert I.int8_linear(x[:0], w8).shape == (0, 37)


def test_rows_quantised_once_give_each_projection_the_plain_product(path, parallel):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((21, 40)).astype(np.float32)
    ws = [I.quantize_weight(rng.standard_normal((n, 40)).astype(np.float32)) for n in (64, 32, 7)]
    rows = I.quantize_activations(x)
    for w8 in ws:
        assert np.array_equal(I.int8_linear(rows, w8), I.int8_linear_plain(x, w8))


def test_rows_packed_for_another_path_are_refused():
    rows = I.quantize_activations(np.ones((2, 8), np.float32))
    I.force_path("plain")
    try:
        if rows.path != "plain":
            with pytest.raises(ValueError, match="packed for path"):
                I.int8_linear(rows, I.quantize_weight(np.ones((4, 8), np.float32)))
    finally:
        I.force_path(None)


def test_warm_up_waits_for_the_twins_the_int8_backbone_calls_only():
    from omnicore.model import kernels as K

    gemm, quant = I._GEMMS[I.path()][0].py_func.__qualname__, I._quantize_pack_impl.__qualname__
    others = {q for p, (f, _) in I._GEMMS.items() if p != I.path() for q in (f.py_func.__qualname__,)}
    assert not {gemm, quant, gemm + "_par", quant + "_par"} & I.idle_kernels(in_use=True)
    assert others <= I.idle_kernels(in_use=True)
    assert {gemm, quant, gemm + "_par", quant + "_par"} <= I.idle_kernels(in_use=False)
    # inside one_pool the backbone's kernels run their parallel twins, never the serial ones
    for kern in (I._GEMMS[I.path()][0], I._quantize_pack_nb, K._softmax_unnormalized_nb,
                 K._qk_norm_rope_nb, K._swiglu_nb, K._add_rms_norm_nb, K._scale_heads_into_nb):
        name = kern.py_func.__qualname__
        assert name + "_par" in jit.POOLED
        assert jit.called(name + "_par", True, pooled=True) and not jit.called(name, False, pooled=True)
        assert jit.called(name, False) and jit.called(name + "_par", True) == jit.PARALLEL_KERNELS


def test_int8_linear_refuses_a_wrong_width_or_out():
    w8 = I.quantize_weight(np.ones((4, 8), np.float32))
    with pytest.raises(ValueError, match="features"):
        I.int8_linear(np.ones((2, 9), np.float32), w8)
    with pytest.raises(ValueError, match="out is"):  # the kernel writes rows by the array's stride
        I.int8_linear(np.ones((2, 8), np.float32), w8, out=np.empty((1, 4), np.float32))
    with pytest.raises(ValueError, match="features"):
        I.int8_matmul(np.ones((2, 9), np.int8), w8)


# --- quantisation --------------------------------------------------------------------------


def _rows_with_edge_values(rng, m, k):
    x = rng.standard_normal((m, k)).astype(np.float32)
    kinds = rng.integers(0, 6, m)
    for i, kind in enumerate(kinds):
        if kind == 0:
            x[i] = 0  # all zero
        elif kind == 1:
            x[i] *= np.float32(1e30)  # huge
        elif kind == 2:
            x[i] *= np.float32(1e-30)  # tiny (the scale stays a normal float32)
        elif kind == 3:  # max 127 -> scale exactly 1: every x.5 is a tie, rounded to even
            x[i] = rng.integers(-254, 255, k) / np.float32(2.0)
            x[i, 0] = 127.0
        elif kind == 4:  # subnormal: the scale too, whose rounding can push x / s past 127
            x[i] *= np.float32(1e-41)
    return x


@SETTINGS
@given(m=st.integers(1, 30), k=st.integers(1, 90), seed=st.integers(0, 2**16))
def test_fused_quantisation_equals_quantize_rows(m, k, seed):
    x = _rows_with_edge_values(np.random.default_rng(seed), m, k)
    want_q, want_s = I.quantize_rows(x)
    got_q, got_s = I.quantize_rows_fast(x)
    assert np.array_equal(got_s, want_s) and np.array_equal(got_q, want_q)


def test_ties_round_to_even():
    x = np.array([[127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5]], np.float32)
    q, s = I.quantize_rows_fast(x)
    assert s[0] == 1 and q.tolist() == [[127, 0, 2, 2, 0, -2, -2, 126]]
    assert np.array_equal(q, I.quantize_rows(x)[0])


# --- packed weights ---------------------------------------------------------------------------


def test_packed_weight_holds_the_plain_codes_and_counts_its_bytes():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((45, 70)).astype(np.float32)
    w8 = I.quantize_weight(w)
    q, s = I.quantize_rows(w)
    assert w8.q.shape == (2, 32, 32, 4) and w8.q.dtype == np.int8  # N 45 -> 64, K 70 -> 128
    assert np.array_equal(w8.codes(), q) and np.array_equal(w8.scale, s)
    assert np.array_equal(w8.colsum, q.sum(axis=1, dtype=np.int32))
    assert w8.nbytes == 64 * 128 + 45 * 4 + 45 * 4
    full = w8.q.transpose(0, 2, 1, 3).reshape(64, 128)
    assert not full[45:].any() and not full[:, 70:].any()  # padding holds zero codes


def test_a_k_whose_sums_could_overflow_int32_is_refused():
    with pytest.raises(ValueError, match="int32"):
        I.quantize_weight(np.ones((1, I._K_MAX + 1), np.float32))


# --- the path, chosen once ----------------------------------------------------------------------


def test_the_chosen_path_is_the_fastest_this_machine_runs():
    I.force_path(None)
    assert I.path() == I.paths()[0] and I.paths()[-1] == "plain"
    with pytest.raises(ValueError, match="cannot run here"):
        I.force_path("no-such-path")
    features = cpu_features.compiler_features()
    if {"amx-int8", "amx-tile"} <= features and cpu_features.amx_permitted():
        assert I.paths()[0] == "amx"
    elif "avx512vnni" in features:
        assert I.paths()[0] == "vnni512"


def _asm_for(triple, cpu, features, tile):
    """The microkernel's IR for `tile`, compiled for a core (not run): its assembly."""
    import llvmlite.binding as ll
    from llvmlite import ir

    ll.initialize_all_targets()
    ll.initialize_all_asmprinters()
    mod = ir.Module("tile")
    mod.triple = triple
    i8p, i64 = ir.IntType(8).as_pointer(), ir.IntType(64)
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [i8p, i8p, i64, i8p]), "tile")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    I.emit_tile(b, tile, fn.args[0], fn.args[1], fn.args[2], fn.args[3])
    b.ret_void()
    m = ll.parse_assembly(str(mod))
    m.verify()
    try:
        target = ll.Target.from_triple(triple)
    except RuntimeError:
        pytest.skip(f"this llvmlite has no {triple.split('-')[0]} back end")
    tm = target.create_target_machine(cpu=cpu, features=features, opt=3)
    return tm.emit_assembly(m)


def test_each_microkernel_compiles_to_its_dot_product_instruction():
    # What the paths this machine cannot run would execute, compiled for a core that has it.
    asm = _asm_for("aarch64-unknown-linux-gnu", "cortex-a76", "+neon,+dotprod", I._TILES["sdot"])
    assert asm.count("sdot") == 16  # 4 rows x 4 vectors of 4 columns
    asm = _asm_for("x86_64-unknown-linux-gnu", "alderlake", "", I._TILES["vnni256"])
    assert asm.count("{vex}\tvpdpbusd") == 8  # AVX-VNNI's encoding, no AVX-512
    asm = _asm_for("x86_64-unknown-linux-gnu", "sapphirerapids", "", I._TILES["vnni512"])
    assert asm.count("vpdpbusd") == 16 and "zmm" in asm


def test_the_amx_block_compiles_to_tile_instructions():
    # The AMX path's block, compiled for a Sapphire Rapids (not run): a configuration, per
    # 64 k two row tiles and two column tiles loaded and four products, four sums stored, a
    # release.
    import llvmlite.binding as ll
    from llvmlite import ir

    ll.initialize_all_targets()
    ll.initialize_all_asmprinters()
    mod = ir.Module("amx")
    mod.triple = "x86_64-unknown-linux-gnu"
    i8p, i64 = ir.IntType(8).as_pointer(), ir.IntType(64)
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [i8p, i64, i8p, i64, i8p]), "block")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    I.emit_amx_configure(b, b.bitcast(b.alloca(ir.ArrayType(ir.IntType(8), 64)), i8p))
    I.emit_amx_block(b, fn.args[0], fn.args[1], fn.args[2], fn.args[3], fn.args[4])
    I.emit_amx_release(b)
    b.ret_void()
    m = ll.parse_assembly(str(mod))
    m.verify()
    tm = ll.Target.from_triple(mod.triple).create_target_machine(cpu="sapphirerapids", opt=3)
    asm = tm.emit_assembly(m)
    counts = {op: len(re.findall(rf"\t{op}\b", asm)) for op in
              ("ldtilecfg", "tilezero", "tileloadd", "tdpbusd", "tilestored", "tilerelease")}
    assert counts == dict(ldtilecfg=1, tilezero=4, tileloadd=4, tdpbusd=4, tilestored=4,
                          tilerelease=1), counts


_AVX_VNNI_ONLY = r"""
import numpy as np
from omnicore.model import int8_kernels as I
assert I.paths() == ("vnni256", "plain"), I.paths()
rng = np.random.default_rng(0)
for m, k, n in [(1, 3, 5), (19, 70, 45), (64, 1024, 96)]:
    x = rng.standard_normal((m, k)).astype(np.float32)
    w8 = I.quantize_weight(rng.standard_normal((n, k)).astype(np.float32))
    assert np.array_equal(I.int8_linear(x, w8), I.int8_linear_plain(x, w8))
    xq = rng.integers(-127, 128, (m, k)).astype(np.int8)
    assert np.array_equal(I.int8_matmul(xq, w8), xq.astype(np.int64) @ w8.codes().astype(np.int64).T)
print("ok", I.path())
"""


@pytest.mark.slow
@pytest.mark.subprocess
def test_an_avx_vnni_only_cpu_takes_the_256_bit_path(tmp_path):
    # Numba compiled for an Alder Lake's features (AVX-VNNI, no AVX-512) on this machine: the
    # path choice follows what the compiler may emit, and the VEX-encoded kernel runs equal.
    if "avxvnni" not in cpu_features.compiler_features():
        pytest.skip("this machine has no AVX-VNNI to run an Alder Lake's code on")
    import llvmlite.binding as ll

    feats = ",".join(f for f in ll.get_host_cpu_features().flatten().split(",")
                     if not (f.startswith("+avx512") or f.startswith("+amx") or f.startswith("+evex")))
    env = dict(os.environ, NUMBA_CPU_NAME="alderlake", NUMBA_CPU_FEATURES=feats,
               NUMBA_CACHE_DIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", _AVX_VNNI_ONLY], env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "ok vnni256"


_AMX_REFUSED = r"""
import sys
sys.path.insert(0, sys.argv[1])
from bench_int8_gemm import refuse_amx  # a seccomp filter: arch_prctl's tile request -> EPERM
refuse_amx()
import numpy as np
from omnicore.model import int8_kernels as I
assert "amx" not in I.paths() and I.path() == I.paths()[0], I.paths()
rng = np.random.default_rng(0)
x = rng.standard_normal((40, 130)).astype(np.float32)
w8 = I.quantize_weight(rng.standard_normal((45, 130)).astype(np.float32))
assert np.array_equal(I.int8_linear(x, w8), I.int8_linear_plain(x, w8))
print("ok", I.path())
"""


@pytest.mark.subprocess
def test_a_process_linux_refuses_the_tile_state_takes_the_next_path():
    # The CPU and the compiler have AMX, but the process may not use it (a seccomp filter, as
    # some containers have): asking fails, and the path choice goes on to VNNI, not to a SIGILL.
    if "amx" not in I.paths():
        pytest.skip(f"this machine runs no AMX path ({I.paths()})")
    bench = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks")
    r = subprocess.run([sys.executable, "-c", _AMX_REFUSED, bench], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == f"ok {I.paths()[1]}"
