"""The fast profile's kept state (model/fast_profile.py), on its own: which rows each step runs,
the unconditional logits kept and standing in, and that what a pass keeps is what
cost.kept_bytes counts before it is allocated. What the profile does to the codes is in
tests/test_profile.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from omnicore import GenerationConfig
from omnicore.machinery import checkpoint
from omnicore.model import cost
from omnicore.model.fast_profile import Kept, PromptCache, make_prompt_cache

CKPT = Path(__file__).resolve().parents[1] / "weights" / "tiny-random"


@pytest.fixture(scope="module")
def cfg():
    return checkpoint.read_config(CKPT / "config.json")


def _rows(cfg, P, T):
    C = cfg.num_audio_codebook
    cond = (np.arange(C * (P + T)).reshape(C, P + T), np.arange(P + T) >= P)
    uncond = (np.arange(C * T).reshape(C, T), np.ones(T, bool))
    return [cond, uncond]


@pytest.mark.parametrize("refresh,every", [(1, 1), (3, 1), (1, 4), (4, 3)])
def test_the_rows_each_step_runs(cfg, refresh, every):
    P, T = 6, 5
    gen = GenerationConfig(profile="fast", num_step=9, prefix_refresh=refresh, uncond_every=every)
    kept, rows = Kept(cfg, gen, P, T, guided=True), _rows(cfg, P, T)
    for step in range(9):
        now = kept.rows_now(rows, step, runs_uncond=gen.uncond_at(step))
        ids, mask, offset, cache = now[0]
        assert cache is kept.cache  # a whole row writes it, a targets-alone row reads it
        if step % refresh == 0:
            assert offset == 0 and ids is rows[0][0] and mask is rows[0][1]
        else:  # the targets alone, after the cached prompt: views of the row, not copies
            assert offset == P and ids.shape[1] == T and np.shares_memory(ids, rows[0][0])
            np.testing.assert_array_equal(mask, rows[0][1][P:])
        assert len(now) == (2 if step % every == 0 else 1)
        if len(now) == 2:
            assert now[1][0] is rows[1][0] and now[1][2:] == (0, None)


def test_unconditional_logits_are_kept_and_stand_in(cfg):
    C, V, T = cfg.num_audio_codebook, cfg.audio_vocab_size, 4
    kept = Kept(cfg, GenerationConfig(profile="fast", uncond_every=3), 3, T, guided=True)
    fresh = np.random.default_rng(0).standard_normal((C, T, V)).astype(np.float32)
    assert kept.uncond_logits(fresh) is fresh  # a step that ran the row scores its own ...
    fresh_copy = fresh.copy()
    fresh[...] = 0  # ... and what is kept is a copy, not the forward's buffer
    np.testing.assert_array_equal(kept.uncond_logits(None), fresh_copy)  # a skipping step
    # Nothing to keep when every step runs the row, or without guidance.
    for gen, guided in ((GenerationConfig(profile="fast", uncond_every=1), True),
                        (GenerationConfig(profile="fast", uncond_every=3), False)):
        assert Kept(cfg, gen, 3, T, guided).uncond is None


@pytest.mark.parametrize("guided", [True, False])
@pytest.mark.parametrize("every", [1, 3])
def test_what_a_pass_keeps_is_what_the_cost_model_counts(cfg, guided, every):
    P, T = 37, 11
    gen = GenerationConfig(profile="fast", uncond_every=every)
    kept = Kept(cfg, gen, P, T, guided)
    held = kept.cache.k.nbytes + kept.cache.v.nbytes
    held += 0 if kept.uncond is None else kept.uncond.nbytes
    assert held == cost.kept_bytes(cfg, gen, P, T, guided)
    assert cost.kept_bytes(cfg, GenerationConfig(), P, T, guided) == 0  # exact keeps nothing


def test_a_prompt_cache_has_a_row_per_layer_and_position(cfg):
    q = cfg.llm_config
    c = make_prompt_cache(cfg, 9)
    assert isinstance(c, PromptCache) and c.length == 9
    assert c.k.shape == c.v.shape == (q.num_hidden_layers, 9, q.num_key_value_heads * q.head_dim)
    assert c.k.dtype == np.float32
