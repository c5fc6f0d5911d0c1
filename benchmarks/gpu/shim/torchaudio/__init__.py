"""A stand-in for torchaudio, for the GPU benchmark's reference side only.

The reference (omnivoice, transformers' Higgs codec) imports torchaudio but calls nothing from
it except `torchaudio.functional.resample`. torchaudio wheels must match the installed torch
exactly, which an offline GPU image may not allow; run.sh puts this directory on the
reference's path only when `import torchaudio` fails, and says so in the report.
"""

from . import functional  # noqa: F401

__version__ = "0+omnicore.shim"
