"""How the model reads a checkpoint (model/weights.py's ParamReader): tensors by exact key,
shapes checked (from a file's header before any byte is read), non-finite weights refused, and
every key of the file used. The files themselves: test_checkpoint.py."""

import numpy as np
import pytest

from omnicore.machinery import checkpoint
from omnicore.errors import WeightsError
from omnicore.model.weights import ParamReader


@pytest.mark.parametrize("source", ["file", "dict"])
def test_param_reader_checks_keys_shapes_and_audit(good, source):
    path, ref = good
    r = checkpoint.open_params(path) if source == "file" else ParamReader(dict(ref), "mem")
    np.testing.assert_array_equal(r.take("w", (4, 3)), ref["w"])
    r.take("ids", (None,))
    with pytest.raises(WeightsError, match=r"'missing\.key'"):
        r.take("missing.key", (1,))
    with pytest.raises(WeightsError, match=r"'w' has shape \[4, 3\]"):
        r.take("w", (3, 4))
    with pytest.raises(WeightsError, match="not used.*'scalarish'"):
        r.finish()
    r.skip("scal")
    r.finish()
    r.close()


def test_non_finite_tensors_are_refused_naming_the_key():
    bad = np.ones((3, 2), np.float32)
    bad[1, 1] = np.nan
    with pytest.raises(WeightsError, match=r"'b' holds NaN or infinite values \(first at index \[1, 1\]"):
        ParamReader({"b": bad}, "mem").take("b", (3, 2))


def test_take_rows_from_memory_is_the_checked_array():
    table = np.random.default_rng(0).standard_normal((50, 6)).astype(np.float32)
    mem = ParamReader({"t": table}, "mem")
    assert mem.take_rows("t", (50, 6)) is table
    with pytest.raises(WeightsError, match="has shape"):
        ParamReader({"t": table}).take_rows("t", (49, 6))
