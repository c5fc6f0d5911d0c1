"""The ONNX split of OmniVoice on ONNX Runtime, driven by omnicore's own unmasking loop: what a
user who picks the public ONNX export would run, measured beside omnicore (bench_generate.py).

The sub-models are the reference's own modules exported in float32 by
`tools/reference/export_onnx.py --external-data` (the folder holds NAME.onnx + NAME.onnx.data):

    audio_embeddings_encoder   ids [1, C, L], audio mask [1, L]       -> embeddings [1, L, D]
    llm_decoder                embeddings [1, L, D], mask [1, 1, L, L] -> hidden [1, L, D]
                               (the 28 bidirectional Qwen3 layers and the final norm)
    audio_heads_decoder        hidden [1, n, D]                        -> logits [1, C, n, V]
    higgs_decoder              codes [1, C, T]                         -> audio [1, 1, 960 T]

Everything else is omnicore's: the prompt, the schedule, the guided scoring and filling
(`packed_unmasking.iterate`, through the engine), the planner and the post-processing. Only the
backbone forward and the codec decode change hands, so the two columns differ in nothing but
the runtime that does the model's arithmetic. Each row runs unpadded on its own (the
unconditional row is the targets alone, as in omnicore), and the heads see the target frames
only: the same FLOPs as omnicore's packed forward.

    model = onnx_model(checkpoint_dir, onnx_dir, threads)   # an omnicore OmniVoice whose
    model.generate(...)                                     # backbone and decoder are ORT's

Dimension legend: C codebooks (8), V audio vocabulary (1025), L positions of one row,
D hidden size, n target frames of a row, T frames of audio.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

PARTS = ("audio_embeddings_encoder", "llm_decoder", "audio_heads_decoder", "higgs_decoder")


def missing_parts(folder: Path) -> list[str]:
    """The sub-models `folder` lacks (export them with tools/reference/export_onnx.py)."""
    return [p for p in PARTS if not (Path(folder) / f"{p}.onnx").is_file()]


class OnnxBackbone:
    """ORT sessions of the exported sub-models; stands where omnicore's backbone params go."""

    precision = "fp32"

    def __init__(self, folder: Path, threads: int):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads  # the same thread count as the other columns
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.version = ort.__version__
        self.sessions = {p: ort.InferenceSession(str(Path(folder) / f"{p}.onnx"), opts,
                                                 providers=["CPUExecutionProvider"])
                         for p in PARTS}

    def _run(self, part, **inputs):
        return self.sessions[part].run(None, inputs)[0]

    def logits(self, ids: np.ndarray, audio_mask: np.ndarray, lengths, num_out) -> np.ndarray:
        """Packed rows (ids [C, N], audio_mask [N], back to back) -> [C, sum(num_out), V]:
        the last num_out[r] positions of every row r, as omnicore's forward_rows(whole=True)."""
        out, at = [], 0
        for L, n in zip(lengths, num_out):
            row_ids = np.ascontiguousarray(ids[:, at:at + L], dtype=np.int64)[None]  # [1, C, L]
            row_mask = np.ascontiguousarray(audio_mask[at:at + L], dtype=bool)[None]  # [1, L]
            x = self._run("audio_embeddings_encoder", input_ids=row_ids, audio_mask=row_mask)
            every = np.ones((1, 1, L, L), dtype=bool)  # bidirectional: each position sees the row
            h = self._run("llm_decoder", inputs_embeds=x, attention_mask=every)  # [1, L, D]
            tail = np.ascontiguousarray(h[:, L - n:])  # [1, n, D]: the heads read targets only
            out.append(self._run("audio_heads_decoder", hidden=tail)[0])  # [C, n, V]
            at += L
        return np.concatenate(out, axis=1)

    def decode(self, codes) -> np.ndarray:
        """[C, T] codes -> float32 [960 T] audio."""
        codes = np.ascontiguousarray(np.asarray(codes, dtype=np.int64))[None]  # [1, C, T]
        return self._run("higgs_decoder", audio_codes=codes)[0, 0]


class OnnxCodec:
    """What the pipeline asks of a codec, with the decode done by ORT (no omnicore weights).
    Voices must come as ready prompts: there is no encoder here."""

    def __init__(self, checkpoint_dir: Path, backbone: OnnxBackbone):
        from omnicore.machinery import checkpoint
        from omnicore.model.config import HiggsAudioV2TokenizerConfig

        self.cfg = checkpoint.read_config(Path(checkpoint_dir) / "audio_tokenizer" / "config.json",
                                          HiggsAudioV2TokenizerConfig)
        self.sampling_rate, self.frame_rate = self.cfg.sample_rate, self.cfg.frame_rate
        self.hop_length = self.cfg.hop_length
        self.decode = backbone.decode

    def encode(self, waveform, sample_rate):
        raise NotImplementedError("the ONNX column takes ready voice prompts (no encoder export)")


def install(loop) -> None:
    """Route the forward of `loop` (omnicore.model.packed_unmasking: what the engine runs) to
    ORT when the params are an OnnxBackbone (omnicore's own forward otherwise), so one process
    can hold both columns. Idempotent."""
    orig = loop.forward_rows
    if getattr(orig, "_onnx_dispatch", False):
        return
    from omnicore.model.backend import to_numpy

    def forward_rows(params, cfg, ids, audio_mask, pack, num_out, work=None, whole=False):
        if not isinstance(params, OnnxBackbone):
            return orig(params, cfg, ids, audio_mask, pack, num_out, work=work, whole=whole)
        logits = params.logits(to_numpy(ids), to_numpy(audio_mask), pack.lengths, num_out)
        return logits if whole else np.split(logits, np.cumsum(num_out)[:-1].tolist(), axis=1)

    forward_rows._onnx_dispatch = True
    loop.forward_rows = forward_rows


def onnx_model(checkpoint_dir: Path, onnx_dir: Path, threads: int):
    """An omnicore OmniVoice (tokenizer, planner, engine, scoring, post-processing) whose
    backbone forward and codec decode run on ONNX Runtime."""
    from omnicore import OmniVoice
    from omnicore.machinery import checkpoint, settings
    from omnicore.model import packed_unmasking

    settings.configure()  # omnicore's scoring kernels run here too
    install(packed_unmasking)
    checkpoint_dir = Path(checkpoint_dir)
    cfg = checkpoint.read_config(checkpoint_dir / "config.json")
    backbone = OnnxBackbone(onnx_dir, threads)
    return OmniVoice(checkpoint_dir, cfg, backbone, checkpoint.load_tokenizer(checkpoint_dir),
                     OnnxCodec(checkpoint_dir, backbone))
