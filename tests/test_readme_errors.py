"""The "What bad input gets" table of docs/errors.md, row by row: each input raises the stated
error type with a message that starts as the table says, so the table stays true."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest

import omnicore.errors as errors
from omnicore import OmniVoice, VoiceClonePrompt

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "weights" / "tiny-random"


def _rows() -> list[tuple[str, str, str]]:
    text = (REPO / "docs" / "errors.md").read_text(encoding="utf-8")
    table = re.search(r"<!-- bad-input-table:start -->\n(.*?)<!-- bad-input-table:end -->", text, re.S)
    assert table, "docs/errors.md lost its bad-input table markers"
    rows = []
    for line in table.group(1).splitlines()[2:]:  # skip the header and the |---| line
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        assert len(cells) == 3, line
        rows.append((cells[0].strip("`"), cells[1].strip("`"), cells[2]))
    return rows


ROWS = _rows()


@pytest.fixture(scope="module")
def m():
    return OmniVoice.from_pretrained(str(TINY))


def test_the_table_has_rows():
    assert len(ROWS) >= 15


@pytest.mark.parametrize("code, error, message", ROWS, ids=[r[0][:60] for r in ROWS])
def test_readme_row(m, code, error, message):
    cls = getattr(errors, error)
    here = os.getcwd()
    os.chdir(REPO)  # the table names README.md as a file that is not audio / not a prompt
    try:
        with pytest.raises(cls) as info:
            eval(code, {"m": m, "np": np, "OmniVoice": OmniVoice, "VoiceClonePrompt": VoiceClonePrompt})
    finally:
        os.chdir(here)
    assert type(info.value) is cls, f"{type(info.value).__name__} is not exactly {error}"
    assert str(info.value).startswith(message), str(info.value)
