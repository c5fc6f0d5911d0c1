"""The model: what turns text and an optional voice into codes, and codes into a waveform.

Start with spec.py: the whole model (text and a voice's clip -> codes -> waveform) in one plain
numpy file, which the product is held to (tests/test_spec.py: codes equal, stages within
stated bounds).

Then the product's implementation, one module per stage, each naming the spec function it
implements and held to it:
    tokenizer.py      text -> token ids; the prompt rows of one generation pass
    backbone.py       fused embeddings -> bidirectional Qwen3 -> audio-head logits
    unmasking.py      32 steps of guided, confidence-ordered unmasking -> codes [8, T]
    higgs_codec.py    Higgs Audio V2: codes -> 24 kHz waveform, and a clip -> codes
    hubert.py         the codec encoder's semantic branch
    resample.py       the band-limited resampler both ends of the codec rely on

Then how it is made fast (each fast form tested against the plain one it stands for):
    kernels.py           the Numba loops between the backbone's GEMMs, each beside its numpy twin
    scoring_kernels.py   the unmasking step's scoring: guided log-softmax, pick and fill
    conv_kernels.py      the codec's convolutions as GEMMs, and its Numba loops (Snake, GELU, ...)
    packed_unmasking.py  unmasking's step for every pass of an iteration at once (what runs)
    fast_profile.py      the fast profile's kept state: the prompt's keys and values, reused
                         unconditional logits, which rows a step runs (an approximation)
    jit.py               the kernels' machinery: Numba on demand, one implementation per kernel
    backend.py           the one numpy/CuPy switch (`xp`), device transfers, CUDA graphs
    cost.py              what one forward pass costs (memory, FLOPs), the limits a pass is held to

Then how a checkpoint is read:
    config.py         config.json -> one frozen dataclass per stage (HF field names); the
                      generation knobs with the reference's defaults and bounds
    weights.py        every tensor taken by its exact key, shape-checked, every key used

docs/walkthrough.md follows one sentence through these stages with real shapes and values.
Nothing here imports the product around it (engine, API, streaming, server, CLI, ...); the
shared vocabulary is `omnicore.errors`. The product finds and reads the files
(omnicore/machinery/checkpoint.py) and hands the model checked tensors. Nothing here reads a
setting when it is imported: the configuration step (`omnicore.machinery.settings.configure`)
hands the backend and threads to `backend` and `jit` before the first kernel.
"""
