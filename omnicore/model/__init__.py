"""The model: what turns text and an optional voice into codes, and codes into a waveform.

Read it top-down, in this order:
    config.py      one frozen dataclass per stage, from the checkpoint's config.json
    weights.py     safetensors -> arrays; every layout change done once, every key checked
    tokenizer.py   text -> token ids; the prompt rows of one generation pass
    backbone.py    fused embeddings -> bidirectional Qwen3 -> audio-head logits
    unmasking.py   32 steps of guided, confidence-ordered unmasking -> codes [8, T]
    codec.py       Higgs Audio V2: codes -> 24 kHz waveform, and a clip -> codes
    hubert.py      the codec encoder's semantic branch
    resample.py    the band-limited resampler both ends of the codec rely on
    kernels.py     the Numba loops between the backbone's GEMMs, each beside its numpy twin
    packed_unmasking.py  the fast form of unmasking's step: every pass of an iteration at once
    scoring_kernels.py  the unmasking step's scoring: guided log-softmax, pick and fill
    conv_kernels.py  the codec's convolutions as GEMMs, and its Numba loops (Snake, GELU, ...)
    cost.py        what one forward pass costs (memory, FLOPs) and the limits a pass is held to
    jit.py         the kernels' shared machinery: Numba on demand, one implementation per kernel
    backend.py     the one numpy/CuPy switch (`xp`)

docs/walkthrough.md follows one sentence through these stages with real shapes and values.
Nothing here imports the product around it (engine, API, streaming, server, CLI, ...); the
shared vocabulary is `omnicore.errors`. Nothing here reads a setting when it is imported: the
configuration step (`omnicore.settings.configure`) hands the backend and threads to `backend`
and `jit` before the first kernel.
"""
