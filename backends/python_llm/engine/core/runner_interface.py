"""What the engine and its scheduler need from a model runner, declared:
`ModelRunner` (`worker/runner.py`) is one, tests' fakes are others, and
mypy checks each structurally.

The runner is sent one `SchedulerOutput` a step and answers one
`RunnerOutput`. Layer slices (`layer_slices.py`) need more of it: keeping a
chunk's hidden states between its slices, and timing a slice's layers
against the step's others (`RunnerOutput.slice_seconds`). A runner that
cannot says so with `runs_layer_slices`, and the scheduler then never cuts a
chunk in layers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .scheduler_output import RunnerOutput, SchedulerOutput


class RunnerModelInfo(Protocol):
    """What the engine reads about the runner's model (`worker/model_info.py`)."""

    @property
    def max_model_len(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def num_layers(self) -> int: ...

    @property
    def eos_token_ids(self) -> Sequence[int]: ...

    @property
    def attention_parity_context(self) -> float:
        """Prefill pacing's cost model (`prefill_pacer.py`); 0 = unknown."""
        ...


class Runner(Protocol):
    @property
    def model_info(self) -> RunnerModelInfo: ...

    @property
    def num_blocks(self) -> int:
        """KV cache blocks the runner allocated: the scheduler's to hand out."""
        ...

    @property
    def runs_layer_slices(self) -> bool:
        """Whether `execute` runs a `SchedulerOutput.layer_slice` (see above)."""
        ...

    def execute(self, scheduled: SchedulerOutput) -> RunnerOutput: ...
