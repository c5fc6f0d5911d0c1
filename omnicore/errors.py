"""Typed errors: everything omnicore raises on purpose derives from OmniCoreError.

Callers (the CLI, the demo, apps) catch OmniCoreError and show its message; anything else
escaping omnicore is a bug. Each message says what went wrong *and* what to do about it. The two
warnings omnicore issues, RefTextMismatchWarning and KernelCacheWarning, are here too.
"""


class OmniCoreError(Exception):
    """Base class of every error omnicore raises deliberately."""


class ConfigError(OmniCoreError):
    """A config.json is missing, malformed, or describes a model omnicore cannot run."""


class WeightsError(OmniCoreError):
    """A weights file is unreadable, truncated, hostile, or does not match its config.

    The message always names the file and, where there is one, the tensor key.
    """


class ModelNotFoundError(OmniCoreError):
    """The model could not be found locally and could not be downloaded (offline, bad id)."""


class InputError(OmniCoreError, ValueError):
    """Bad user input: empty or huge text, unknown instruct, bad duration/speed, ..."""


class AudioError(OmniCoreError, ValueError):
    """Audio that cannot be used: unreadable, empty, NaN/inf, bad sample rate or channels."""


class VoicePromptError(OmniCoreError):
    """A saved voice prompt file is unreadable, of an unknown version, or inconsistent."""


class CancelledError(OmniCoreError):
    """The request was cancelled (`cancel()` on its handle, or its caller stopped listening)."""


class RefTextMismatchWarning(UserWarning):
    """A voice reference's transcript cannot be what its clip says: the speaking rate they imply
    is not speech (text/frontend.py: reference_pace_problem). The voice still works, but every
    length estimated from it is off by as much: outputs too long, or with their ends cut."""


class KernelCacheWarning(UserWarning):
    """No folder for Numba's kernel cache can be written: kernels are compiled in memory, again
    in every process (docs/configuration.md, "Kernel cache")."""
