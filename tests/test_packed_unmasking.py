"""The packed unmasking step (packed_unmasking.iterate, what the engine runs) is the readable one
(unmasking.unmask_step), bit for bit: the same codes and fill steps for greedy and seeded sampled
settings (position and class temperature), a pass alone or packed with others that joined at
other steps, with and without guidance, exact and fast profile (a step running a pass's
targets alone, or reusing its kept unconditional logits).

Each iteration's logits are taken from the packed forward itself and handed to `unmask_step`
on a twin of every pass: both sides see the same numbers, so any difference is one of the
step's own arithmetic, noise or ordering, never of BLAS rounding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omnicore.model import packed_unmasking as pu
from omnicore.model import unmasking as um
from omnicore.model.config import GenerationConfig
from omnicore.machinery.checkpoint import load_tokenizer
from omnicore.model.tokenizer import prepare_item

ROOT = Path(__file__).resolve().parents[1]
CKPT = ROOT / "weights" / "tiny-random"

GREEDY = GenerationConfig(num_step=6, position_temperature=0.0, class_temperature=0.0)
POSITION = GenerationConfig(num_step=6, position_temperature=5.0, class_temperature=0.0)
CLASS = GenerationConfig(num_step=6, position_temperature=5.0, class_temperature=0.8)
UNGUIDED = GenerationConfig(num_step=5, guidance_scale=0.0, position_temperature=5.0,
                            class_temperature=0.0, t_shift=0.5)
FAST = GenerationConfig(num_step=7, profile="fast", prefix_refresh=3, uncond_every=2,
                        position_temperature=5.0, class_temperature=0.0)
FAST_CLASS = GenerationConfig(num_step=6, profile="fast", prefix_refresh=2, uncond_every=3,
                              position_temperature=5.0, class_temperature=0.8)
SETTINGS = {"greedy": GREEDY, "position": POSITION, "class": CLASS, "unguided": UNGUIDED,
            "fast": FAST, "fast_class": FAST_CLASS}


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(CKPT)


def _items(tok, cfg, specs):
    """specs: (text, T, reference frames) -> prepared items."""
    out = []
    for i, (text, T, R) in enumerate(specs):
        codes = np.random.default_rng(i).integers(0, 1024, (8, R)) if R else None
        out.append(prepare_item(tok, cfg, text, T, ref_text="ref" if R else None, ref_codes=codes))
    return out


def run_both(params, cfg, items, gens, seeds, joins, monkeypatch):
    """Run the passes through `iterate` (pass b joins at iteration joins[b]) and, on the logits
    each packed forward produced, through `unmask_step`; assert equal tokens and fill steps after
    every step. Returns the codes and fill steps."""
    packed = [um.PassState(it, g, s, cfg) for it, g, s in zip(items, gens, seeds)]
    spec = [um.PassState(it, g, s, cfg) for it, g, s in zip(items, gens, seeds)]
    seen = []
    real = pu.forward_rows

    def keep(*args, **kwargs):
        out = real(*args, **kwargs)
        seen.append(np.array(out))  # [C, n, V]: the forward's scored rows, back to back
        return out

    monkeypatch.setattr(pu, "forward_rows", keep)
    cache, iteration = pu.PackCache(), 0
    while not all(s.done for s in packed):
        active = [b for b, s in enumerate(packed) if joins[b] <= iteration and not s.done]
        iteration += 1
        if not active:
            continue
        ran = {b: packed[b].runs_uncond for b in active}  # (the fast profile skips some)
        pu.iterate(params, cfg, [packed[b] for b in active], cache)
        logits, at, rows = seen[-1], 0, {}
        for b in active:  # the conditional rows, then the unconditional ones (as iterate packs)
            rows[b, 0], at = logits[:, at:at + packed[b].T], at + packed[b].T
        for b in active:
            if ran[b]:
                rows[b, 1], at = logits[:, at:at + packed[b].T], at + packed[b].T
        assert at == logits.shape[1]
        for b in active:
            uncond = rows.get((b, 1))
            if spec[b].kept is not None and spec[b].use_uncond:
                uncond = spec[b].kept.uncond_logits(uncond)
            um.unmask_step(spec[b], rows[b, 0], uncond)
            np.testing.assert_array_equal(spec[b].codes(), packed[b].codes(), err_msg=f"pass {b}")
            np.testing.assert_array_equal(spec[b].fill_step, packed[b].fill_step, err_msg=f"pass {b}")
    for b, s in enumerate(spec):
        assert s.done and s.step == packed[b].step
        for ids_spec, ids_packed in zip(s.rows, packed[b].rows):  # both rows' targets too
            np.testing.assert_array_equal(ids_spec[0], ids_packed[0])
    return [s.codes() for s in packed], [s.fill_step for s in packed]


@pytest.mark.parametrize("name", list(SETTINGS))
def test_one_pass_alone(params, cfg, tok, name, monkeypatch):
    items = _items(tok, cfg, [("One pass on its own, a sentence long.", 23, 0)])
    codes, fill = run_both(params, cfg, items, [SETTINGS[name]], [11], [0], monkeypatch)
    assert (codes[0] != cfg.audio_mask_id).all() and (fill[0] >= 0).all()


def test_passes_of_every_setting_packed_together_joining_at_other_steps(params, cfg, tok, monkeypatch):
    """Greedy, position-sampled, class-sampled and unguided passes in one pack, two of them
    joining later (the engine's continuous batching), one with a voice reference."""
    specs = [("Greedy pass.", 17, 0), ("Position noise, seeded.", 9, 6),
             ("Class sampling as well, seeded.", 21, 0), ("No guidance here.", 12, 3),
             ("The fast profile, with a reference.", 14, 5), ("Fast and class sampled.", 8, 0)]
    items = _items(tok, cfg, specs)
    gens = [GREEDY, POSITION, CLASS, UNGUIDED, FAST, FAST_CLASS]
    codes, fill = run_both(params, cfg, items, gens, [1, 2, 3, 4, 5, 6], [0, 0, 2, 3, 1, 4],
                           monkeypatch)
    for c, f, g in zip(codes, fill, gens):
        assert (c != cfg.audio_mask_id).all() and set(np.unique(f)) <= set(range(g.num_step))


@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_any_packing_of_seeded_passes(params, cfg, tok, data, monkeypatch_session):
    B = data.draw(st.integers(1, 3))
    specs = [(data.draw(st.sampled_from(["a b c", "hello there", "你好 world", "[laughter] ok"])),
              data.draw(st.integers(1, 15)), data.draw(st.sampled_from([0, 4]))) for _ in range(B)]
    fast = [data.draw(st.booleans()) for _ in range(B)]
    gens = [GenerationConfig(num_step=data.draw(st.integers(1, 7)),
                             profile="fast" if fast[b] else "exact",
                             prefix_refresh=data.draw(st.integers(1, 4)) if fast[b] else 1,
                             uncond_every=data.draw(st.integers(1, 4)) if fast[b] else 1,
                             guidance_scale=data.draw(st.sampled_from([0.0, 2.0])),
                             t_shift=data.draw(st.sampled_from([0.1, 1.0])),
                             layer_penalty_factor=data.draw(st.sampled_from([0.0, 5.0])),
                             position_temperature=data.draw(st.sampled_from([0.0, 5.0])),
                             class_temperature=data.draw(st.sampled_from([0.0, 0.8])))
            for b in range(B)]
    seeds = [data.draw(st.integers(0, 2**32 - 1)) for _ in range(B)]
    joins = [data.draw(st.integers(0, 3)) for _ in range(B)]
    run_both(params, cfg, _items(tok, cfg, specs), gens, seeds, joins, monkeypatch_session)


@pytest.fixture(scope="module")
def monkeypatch_session():
    """A monkeypatch that hypothesis's repeated calls can share (undone after the module)."""
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()
