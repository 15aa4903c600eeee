"""The decoupled senders keep only the outputs a request asked for
(ensemble/requested_outputs.py says why)."""

from __future__ import annotations

import numpy as np

from ensemble.requested_outputs import requested_only


def test_outputs_not_asked_for_are_left_out_and_the_rest_keep_their_arrays():
    arrays = {
        "output_ids": np.asarray([[[7]]]),
        "request_key": np.asarray([[b"k"]], dtype=np.object_),
        "sequence_length": np.asarray([[1]]),
    }
    kept = requested_only(arrays, frozenset({"output_ids", "sequence_length", "not_produced"}))
    assert list(kept) == ["output_ids", "sequence_length"]
    assert kept["output_ids"] is arrays["output_ids"]
    assert requested_only(arrays, frozenset()) == {}
