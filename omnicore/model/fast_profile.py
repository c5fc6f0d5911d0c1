"""The fast profile's kept state: what a pass keeps from one unmasking step to the next so that
later steps run less (GenerationConfig.profile "fast", and "live" on top of it). An
approximation, labelled as one wherever it is offered; the exact profile keeps nothing, and
the plain statement of the loop (`spec.unmask`) has no such state at all.

The profile changes which rows a step runs, never the step itself:
  * between refresh steps (every `prefix_refresh`) the conditional row runs its targets alone,
    attending to its prompt's keys and values kept from the last step that ran it whole
    (`PromptCache`: the backbone writes it on a whole run and reads it on a targets-alone one);
  * with guidance, the unconditional row runs every `uncond_every` steps, and its logits stand
    in for the steps between (`Kept.uncond_logits`).
`Kept.rows_now` says which rows a step runs; the plain loop (`unmasking.generate_codes`) and
the engine's packed step (`packed_unmasking.iterate`) both ask it, so they run the same rows.

Dimension legend:
    C  codebooks (8)    T  target frames    V  audio vocabulary (1025)
    P  prompt positions (the row before its targets)    K  key/value heads    E  head dim
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .backend import xp
from .config import GenerationConfig, OmniVoiceConfig


@dataclass(frozen=True)
class PromptCache:
    """The keys and values of the first P positions of one row (a pass's prompt: style and text
    tokens, reference frames), after q/k norm and rotation, per layer: written by the steps
    that run the row in full, read by the steps that run only its targets."""

    k: np.ndarray  # [layers, P, K*E]
    v: np.ndarray  # [layers, P, K*E]

    @property
    def length(self) -> int:
        return self.k.shape[1]


def make_prompt_cache(cfg: OmniVoiceConfig, length: int) -> PromptCache:
    q = cfg.llm_config
    shape = (q.num_hidden_layers, length, q.num_key_value_heads * q.head_dim)  # [layers, P, K*E]
    return PromptCache(xp.zeros(shape, dtype=xp.float32), xp.zeros(shape, dtype=xp.float32))


class Kept:
    """One pass's kept state under the fast profile (cost.kept_bytes counts it): its prompt
    cache, and (with guidance and uncond_every > 1) its last unconditional logits."""

    def __init__(self, cfg: OmniVoiceConfig, gen: GenerationConfig, prompt: int, T: int,
                 guided: bool):
        self.gen, self.prompt = gen, prompt
        self.cache = make_prompt_cache(cfg, prompt)
        reuse = guided and gen.uncond_every > 1
        self.uncond = (xp.zeros((cfg.num_audio_codebook, T, cfg.audio_vocab_size), xp.float32)
                       if reuse else None)  # [C, T, V]

    def rows_now(self, rows, step: int, runs_uncond: bool):
        """The rows `step` runs, as (ids [C, L], audio_mask [L], offset, cache), from a pass's
        rows [(ids, audio_mask)]: its conditional row whole (which rewrites the cache) or its
        targets alone after the cached prompt, then its unconditional row if it runs."""
        (ids, mask), P = rows[0], self.prompt
        if self.gen.full_row_at(step):
            now = [(ids, mask, 0, self.cache)]
        else:
            now = [(ids[:, P:], mask[P:], P, self.cache)]  # [C, L] -> [C, T]
        if runs_uncond:
            now.append((*rows[1], 0, None))
        return now

    def uncond_logits(self, fresh):
        """The unconditional logits [C, T, V] a step scores with: `fresh` from its forward
        (kept for the steps that skip the row), or, when it skipped it (None), the kept ones."""
        if fresh is None:
            return self.uncond
        if self.uncond is not None:
            self.uncond[...] = fresh
        return fresh
