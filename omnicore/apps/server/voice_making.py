"""Making a voice for the library, the same for every door that makes one (the HTTP voice
routes, MCP's design_voice and clone_voice): a clip's or a description's work, checked before
admission, the consent it names, and the voice kept (library.py) once made in an admitted slot.
"""

from __future__ import annotations

from ...errors import AudioError, InputError, OmniCoreError
from ...model.config import GenerationConfig, validate_seed
from ...text import frontend
from .library import consent_required
from .protocol import HTTPError, blame, body_field, checked
from .state import ServerState
from .uploads import decode_clip
from .voices import PRESET_SAMPLE_TEXT, PRESET_VOICES, designed_voice, maker


def clip_voice_work(server: ServerState, data: bytes, ref_text, file_field: str):
    """An uploaded clip (the form's `file_field`) and its transcript -> work(on_step) -> the
    clip's voice prompt. The transcript is required: nothing here recognises speech."""
    if not isinstance(ref_text, str) or not ref_text.strip():
        raise HTTPError(400, "a cloned voice needs its clip's transcript as the form field "
                             "'ref_text' (there is no speech recognition here; with the openai "
                             "client: extra_body={'ref_text': ...})", "ref_text",
                        "ref_text_required")

    def work(on_step):
        with blame({AudioError: file_field, InputError: "ref_text"}):
            wav, sr = decode_clip(data)  # [C, N]: checked by its header before decoding
            return server.model.create_voice_clone_prompt((wav, sr), ref_text=ref_text)
    return work


async def check_consent(server: ServerState, consent) -> str | None:
    """The consent id a cloned voice names, which must exist; None when none is named, which
    a library (or a server run with --require-consent) that requires consent refuses."""
    if consent is None or consent == "":
        if server.require_consent or getattr(server.voices, "require_consent", False):
            raise consent_required()
        return None
    if await server.in_thread(server.voices.consent, consent) is None:
        raise HTTPError(400, f"unknown consent {consent!r}", "consent", "consent_not_found",
                        hint="list_consents")
    return consent


def designed_voice_work(server: ServerState, body: dict, instruct_key: str, text_key: str):
    """A designed voice's fields -> (its instruct, work(on_step) -> its prompt). The instruct
    is checked now, before admission, naming the closest known item for an unknown one."""
    instruct = body_field(body, instruct_key, str, None)
    sample = body_field(body, text_key, str, None)
    if sample is not None and not sample.strip():
        raise HTTPError(400, f"{text_key} must not be blank", text_key, "invalid_value")
    canonical = checked(instruct_key, frontend.resolve_instruct, instruct,
                        sample or PRESET_SAMPLE_TEXT, code="invalid_instruct")
    if not canonical:
        raise HTTPError(400, f"a designed voice needs '{instruct_key}', a description such as "
                             f"{PRESET_VOICES['alloy'][0]!r}", instruct_key, "invalid_instruct")
    seed = body_field(body, "seed", int, 0)
    checked("seed", validate_seed, seed)
    language = body_field(body, "language", str, None)
    num_step = body_field(body, "num_step", int, GenerationConfig.num_step)
    checked("num_step", GenerationConfig, num_step)

    def work(on_step):
        with blame({OmniCoreError: text_key}):
            return designed_voice(server.model, instruct, seed, language, sample, on_step,
                                  num_step)
    return instruct, work


async def make_voice(server: ServerState, admitted, name: str, work, record: dict,
                     consent: str | None):
    """`admitted(work)` (the door's admission: work(on_step) in a slot) -> the prompt, then
    kept: (its prompt, its record). 409 if another request, here or in another server on the
    folder, took the name meanwhile."""
    prompt = await admitted(work)
    made = await server.in_thread(maker, server.model)
    if made is not None:  # the record names the checkpoint whose codes these are
        record = {**record, "made_by": made.record(designed=record.get("type") == "prompt")}
    return prompt, await server.in_thread(server.voices.add, name, prompt, record, consent)
