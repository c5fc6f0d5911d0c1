"""The product held to omnicore/model/spec.py, the model in one plain file, on the tiny checkpoint.

What each test holds:
  * the prompt row: the product's ids and audio mask, equal, in auto, design and clone modes;
  * the codes: equal to the spec's, for greedy and for seeded sampled settings (the reference's
    position temperature and a class temperature of 1), in auto, design and clone modes, each
    pass alone (the plain loop) and packed with the others on the engine (every forward shared
    by the three passes, as the engine's trace shows);
  * the backbone's logits within 1e-5 of the largest logit, the waveform within 2e-5 of its
    largest sample (float32 rounding of other operation orders: fused kernels, GEMMs of other
    shapes); docs/correctness.md states these bounds;
  * the codec encoder's fused latent within 1e-5 of its largest value, and its codes equal to
    the product's and to the reference's own (fixture);
  * `speak`, the spec end to end, against the product's `synthesize` on the same clip (of no
    whole number of frames: both drop its last part frame): the codes equal, the waveform within
    2e-5 of its largest sample.
Equal codes from logits that differ in their last bits hold wherever no decision is a near-tie
at float32 precision: the draws here were checked to be such; a seed whose draw landed within
rounding of a tie would differ, as the reference itself would.
"""

from pathlib import Path

import numpy as np
import pytest

from omnicore import OmniVoice
from omnicore.machinery import checkpoint
from omnicore.engine import Engine, PassSpec
from omnicore.model import backbone, higgs_codec, spec, unmasking
from omnicore.model.config import GenerationConfig

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "weights" / "tiny-random"
GREEDY = dict(num_step=8, position_temperature=0.0, class_temperature=0.0)
SAMPLED = dict(num_step=8, position_temperature=5.0, class_temperature=1.0)
WAIT_S = 120


@pytest.fixture(scope="module")
def model():
    return OmniVoice.from_pretrained(TINY)


@pytest.fixture(scope="module")
def plain():
    """The spec's own reading of the checkpoint: (config, weights, tokenizer, codec config and
    weights)."""
    return spec.load(TINY)


@pytest.fixture(scope="module")
def cases():
    """(text, frames, language, instruct, ref_text, ref_codes, seed) per mode."""
    ref = np.random.default_rng(3).integers(0, 1024, (8, 30))
    return {"auto": ("Hello there, how are you today?", 40, "en", None, None, None, 0),
            "design": ("A designed voice says this.", 30, "en", "female, low pitch", None, None, 11),
            "clone": ("A cloned voice reads a line.", 35, None, None, "A made up reference.", ref, 5)}


def _pass(case, settings) -> PassSpec:
    text, frames, lang, instruct, ref_text, ref_codes, seed = case
    return PassSpec(text, frames, lang, instruct, ref_text, ref_codes, seed,
                    GenerationConfig(**settings))


def _spec_codes(plain, case, settings):
    cfg, W, tok, _, _ = plain
    text, frames, lang, instruct, ref_text, ref_codes, seed = case
    row, mask = spec.prompt_row(cfg, tok, text, frames, lang, instruct, ref_text, ref_codes)
    return spec.unmask(cfg, W, row, mask, frames, seed=seed, **settings)


@pytest.mark.parametrize("mode", ["auto", "design", "clone"])
def test_the_prompt_row_is_the_products(model, plain, cases, mode):
    cfg, _, tok, _, _ = plain
    text, frames, lang, instruct, ref_text, ref_codes, _ = cases[mode]
    item = Engine.prepare(model.engine, _pass(cases[mode], GREEDY))
    row, mask = spec.prompt_row(cfg, tok, text, frames, lang, instruct, ref_text, ref_codes)
    np.testing.assert_array_equal(row, item.input_ids)
    np.testing.assert_array_equal(mask, item.audio_mask)


@pytest.mark.parametrize("settings", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("mode", ["auto", "design", "clone"])
def test_codes_alone_equal_the_specs(model, plain, cases, mode, settings):
    """The product's unmasking loop on one pass: the spec's codes, exactly."""
    p = _pass(cases[mode], settings)
    item = Engine.prepare(model.engine, p)
    got = unmasking.generate_codes(model.params, model.config, [item], p.gen, seed=p.seed)[0]
    np.testing.assert_array_equal(got, _spec_codes(plain, cases[mode], settings))


@pytest.mark.parametrize("settings", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_codes_packed_on_the_engine_equal_the_specs(model, plain, cases, settings):
    """The three modes at once on the engine, one request of three passes: every iteration is
    one forward of all three (the engine's trace names the passes of each), and each pass's
    codes are the spec's for that pass alone."""
    modes = ("auto", "design", "clone")
    engine = Engine(model.params, model.config, model.tokenizer)
    packs = []
    engine.trace = lambda ids: packs.append(len(ids))  # the passes of each iteration
    results = engine.submit([_pass(cases[m], settings) for m in modes]).result(timeout=WAIT_S)
    assert packs == [3] * settings["num_step"], packs  # every step's forward shared by all three
    for mode, result in zip(modes, results):
        np.testing.assert_array_equal(result.codes, _spec_codes(plain, cases[mode], settings),
                                      err_msg=mode)


def test_logits_within_the_stated_bound(model, plain, cases):
    """The backbone (fused kernels, packed rows) against the spec's plain layers: within 1e-5
    of the largest logit."""
    cfg, W, tok, _, _ = plain
    text, frames, lang, instruct, ref_text, ref_codes, _ = cases["clone"]
    row, mask = spec.prompt_row(cfg, tok, text, frames, lang, instruct, ref_text, ref_codes)
    half = frames // 2  # half the targets filled, as mid-way through the steps
    row[:, -half:] = np.random.default_rng(1).integers(0, 1024, (8, half))
    want = spec.logits(cfg, W, row, mask, frames)
    pack = backbone.make_packing([row.shape[1]], model.config)
    got = np.asarray(backbone.forward_rows(model.params, model.config, row, mask, pack, [frames])[0])
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("mode", ["auto", "clone"])
def test_the_waveform_within_the_stated_bound(model, plain, cases, mode):
    """The codec decoder (convolutions as GEMMs, Numba loops) against the spec's: within 2e-5
    of the largest sample."""
    codes = _spec_codes(plain, cases[mode], GREEDY)
    _, _, _, codec_cfg, codec_W = plain
    want = spec.decode(codec_cfg, codec_W, codes)
    got = model.codec.decode(codes)
    assert got.shape == want.shape == (960 * codes.shape[1],)
    assert np.abs(got - want).max() <= 2e-5 * np.abs(want).max()


def test_encoder_codes_equal_the_products_and_the_references(model, plain):
    """The codec encoder on the reference's own clip (tests/fixtures/reference): the spec's
    codes are the product's and the reference's, exactly; and on a clip of a length that is
    no whole number of frames, the product's."""
    _, _, _, codec_cfg, codec_W = plain
    fixture = np.load(ROOT / "tests" / "fixtures" / "reference" / "codec_encode.npz")
    got = spec.encode(codec_cfg, codec_W, fixture["input"])
    np.testing.assert_array_equal(got, fixture["codes"])
    np.testing.assert_array_equal(got, model.codec.encode(fixture["input"], 24000))
    clip = model.codec.decode(np.random.default_rng(4).integers(0, 1024, (8, 30)))[:27_777]
    np.testing.assert_array_equal(spec.encode(codec_cfg, codec_W, clip),
                                  model.codec.encode(clip, 24000))


def test_the_encoders_latent_within_the_stated_bound(plain):
    """The fused latent the quantizer sees (HuBERT, the semantic and acoustic encoders, `fc`):
    within 1e-5 of its largest value."""
    _, _, _, codec_cfg, codec_W = plain
    clip = np.load(ROOT / "tests" / "fixtures" / "reference" / "codec_encode.npz")["input"]
    want = spec.latent(codec_cfg, codec_W, clip)
    cfg, params = checkpoint.load_codec(TINY / "audio_tokenizer")
    got = higgs_codec.encode_features(params, clip, cfg)["fused"]
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_speak_is_the_product_on_the_same_clip(model):
    """The spec alone, from the checkpoint folder to a waveform in a voice cloned from a clip of
    25 frames and 500 samples, against the product's `synthesize` on that clip (its clean-up and
    post-processing off, which the spec leaves out): both drop the clip's last part frame
    (padding it would give 26 frames of voice and other codes: 67 of these 80 cells), then the
    codes are equal and the waveform within 2e-5 of its largest sample."""
    clip = 0.3 * np.sin(np.arange(24_500, dtype=np.float32) / 9.0)
    settings = dict(num_step=2, position_temperature=0.0, class_temperature=0.0)
    codes, wav = spec.speak(TINY, "Hello.", 10, lang="en", ref_text="A sound.", ref_wav=clip,
                            **settings)
    voice = model.create_voice_clone_prompt((clip, 24000), "A sound.", preprocess_prompt=False)
    assert voice.ref_audio_tokens.shape == (8, 25)
    got = model.synthesize("Hello.", language="en", voice_clone_prompt=voice, duration=0.4,
                           postprocess_output=False, pad_duration=0.0, fade_duration=0.0,
                           **settings)[0]
    np.testing.assert_array_equal(codes, got.codes)
    assert wav.shape == got.audio.shape == (9600,) and wav.dtype == np.float32
    assert np.abs(got.audio - wav).max() <= 2e-5 * np.abs(wav).max()  # measured 2.8e-6


# The public functions of the product's model modules that implement no line of the spec: the
# machinery around the model (loading and checking weights, packing rows, buffers, sizes, seeds)
NO_SPEC_COUNTERPART = {
    "backbone": {"make_packing", "make_workspace", "load_params"},
    "unmasking": {"pass_seeds"},
    "packed_unmasking": set(),
    "higgs_codec": {"load_decoder_params", "load_params", "load_encoder_params", "check_codes",
                    "decoder_receptive_field", "check_audio"},
    "hubert": {"load_params", "num_frames"},
    "resample": {"check_rate"},
    "tokenizer": set(),
}
# spec functions with no fast form in the model modules: the product reads checkpoints in
# omnicore.machinery.checkpoint and speaks in omnicore.pipeline; the codec's `linear` is a GEMM
DONE_ELSEWHERE = {"read_safetensors", "load", "speak", "linear"}


def test_every_fast_function_names_its_spec_function():
    """Each public function of the model modules that implements a function (or lines) of the
    spec names it in its docstring as `spec.<name>`, every name so given is a spec function,
    and every spec function is named by one (or is in DONE_ELSEWHERE)."""
    import ast
    import importlib
    import re

    spec_fns = {n for n, f in vars(spec).items()
                if callable(f) and getattr(f, "__module__", None) == spec.__name__}
    named, missing = set(), []
    modules = list(NO_SPEC_COUNTERPART) + ["kernels", "scoring_kernels", "conv_kernels"]
    for mod in modules:
        path = Path(importlib.import_module(f"omnicore.model.{mod}").__file__)
        for node in ast.parse(path.read_text("utf-8")).body:
            if not isinstance(node, ast.FunctionDef):
                continue
            refs = set(re.findall(r"`spec\.(\w+)", ast.get_docstring(node) or ""))
            assert refs <= spec_fns, f"{mod}.{node.name} names no spec function: {refs - spec_fns}"
            named |= refs
            required = (mod in NO_SPEC_COUNTERPART and not node.name.startswith("_")
                        and node.name not in NO_SPEC_COUNTERPART[mod])
            if required and not refs:
                missing.append(f"{mod}.{node.name}")
    assert missing == [], "name the spec function each implements (or list it above)"
    assert spec_fns - DONE_ELSEWHERE <= named, sorted(spec_fns - DONE_ELSEWHERE - named)


def test_the_spec_stands_alone():
    """Plain numpy and the tokenizers library: nothing of omnicore (no kernels, backend, engine
    or JIT), so what a reader reads there is all there is."""
    import ast

    tree = ast.parse(Path(spec.__file__).read_text("utf-8"))
    imported = {("." * n.level + (n.module or "") if isinstance(n, ast.ImportFrom) else a.name).split(".")[0] or "."
                for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in n.names}
    assert imported <= {"__future__", "json", "math", "re", "struct", "pathlib", "numpy",
                        "tokenizers"}, imported
