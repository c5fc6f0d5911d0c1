"""omnicore: a numpy + Numba runtime for the OmniVoice text-to-speech model."""

__version__ = "0.1.0"
