"""omnicore: OmniVoice text-to-speech in numpy + Numba, no torch.

    from omnicore import OmniVoice
    model = OmniVoice.from_pretrained("k2-fsa/OmniVoice")
    audio = model.generate("Hello world.")[0]      # float32, 24 kHz

The public names are loaded lazily so that `import omnicore` (and `omnicore --help`) stays fast.
"""

__version__ = "0.1.0"

__all__ = ["OmniVoice", "VoiceClonePrompt", "Synthesis", "Codec", "GenerationConfig", "__version__"]


def __getattr__(name):
    if name in ("OmniVoice", "VoiceClonePrompt", "Synthesis", "Codec"):
        from . import pipeline
        return getattr(pipeline, name)
    if name == "GenerationConfig":
        from .model.config import GenerationConfig
        return GenerationConfig
    raise AttributeError(f"module 'omnicore' has no attribute {name!r}")
