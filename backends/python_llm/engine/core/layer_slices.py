"""Layer slices: a long prompt under pacing advances by a few layers of a
big chunk per step rather than by a small chunk through all layers.

Late in an 8k prompt a paced step's budget buys ~17 tokens through all 30
layers, and such chunks cost ~1.4x per token what 512-token chunks cost:
each re-reads the whole context's K/V for a few queries, and the GEMMs run
at a few rows. Cut the other way, a chunk of a few hundred tokens runs one
or more whole layers each step (`LayerSlice`; the runner keeps its hidden
states between slices), and every layer runs as efficiently as it does for
the prompt alone. The step's time stays what pacing allows: a layer of n
tokens is 1/layers of the chunk's pacing units.

Sizing, in seconds: the runner times the layers a slice ran against the
ones it did not (`RunnerOutput.slice_seconds`), so each step tells apart
what its decodes cost now and what the slice cost. A step may take the
pacer's aim (`PrefillPacer.aim_s`: the bound of (1 + prefill_time_ratio) x
the decode-only step measured before, what the streams' inter-token latency
is judged against, less the margin of the steps' recent spread), so the
slice gets that less the decodes' share now: decodes slow down as their
contexts grow, and counting their growth as prefill would shrink every
later chunk. But never less than MIN_SLICE_SHARE of its share before: where
the prompt takes thousands of steps (an 8k prompt beside 16 streams on a
fast 2-core Zen 5) the streams' growth alone came to fill the step, the
slices shrank to one layer of a few dozen tokens and the prompt starved (no
first token after 1,900 steps). A layer's seconds come from the chunk's own
slices (each of its layers is the same work), else from the last chunk's,
scaled by the cost model; before any slice ran, the pacer's units. The plan
that moves the most tokens per step wins, the biggest chunk within
PLAN_TOLERANCE of it (the cost model prices a token the same in any chunk;
the machine does not).

One request at a time has a chunk in slices; its blocks are allocated with
the first slice, its tokens count as computed (and its blocks as cached)
only after the last layer, and a preemption or an ending drops the chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

from .prefill_pacer import PrefillPacer
from .request import Request
from .scheduler_output import LayerSlice

# a slice may take this part of one more layer than the budget buys: the
# estimate moves a few percent step to step
SLICE_SLACK = 0.1
# a plan may move this part of the best plan's tokens per step, for a bigger chunk
PLAN_TOLERANCE = 0.9
# the least a slice's budget may be, as a part of the aim less the decode
# step before: the prompt still advances when the decodes' own growth fills the
# step (the streams' latency then grows by at most this part of its allowance)
MIN_SLICE_SHARE = 0.5
# a plan fills this part of the budget: a layer estimated 10% low still
# leaves its slices their planned layers (one fewer would waste a share of
# every step of the chunk)
PLAN_FILL = 0.9


@dataclass
class LayerTime:
    """Seconds of one layer of a chunk of `tokens` from `start`: the mean of
    `samples` slices."""

    start: int
    tokens: int
    seconds: float
    samples: int


class LayerSlicer:
    def __init__(self, pacer: PrefillPacer, num_layers: int) -> None:
        self.pacer = pacer
        self.num_layers = num_layers
        self.slicing: Request | None = None  # the request with a chunk in slices
        self._chunk: LayerTime | None = None  # measured on its slices
        self._last: LayerTime | None = None  # the chunk before it
        self._rest_s: float | None = None  # a slice step's seconds less the slice's
        self.at_floor = False  # the last slice is longer than the step's plan allowed

    def next_slice(
        self, req: Request, start: int, available: int, units: float | None, num_decodes: int, spent_units: float
    ) -> tuple[LayerSlice | None, int]:
        """This step's slice of `req` and its chunk's tokens; (None, 0): a
        chunk through all layers. A chunk in flight always advances (at
        least one layer; all of them when nothing limits the step). A new
        one (of a long prompt: the caller asks only for those) is cut only
        under pacing while no other request is in slices, when the budget
        does not let it finish the prompt at full depth, and once the unit
        cost is known.
        `units`: the step's pacing units left; `spent_units`: spent on it."""
        layers = self.num_layers
        self.at_floor = False
        if req.slice_tokens:
            done = req.slice_layers_done
            step = self._layers(start, req, self._budget_s(units, num_decodes, spent_units))
            return LayerSlice(req.request_id, done, done + step), req.slice_tokens
        pacer = self.pacer
        if (
            not layers
            or units is None
            or units <= 0
            or pacer.unit_s is None
            or self.slicing is not None
            or available <= pacer.max_tokens(start, units)
        ):
            return None, 0
        tokens, step = self.plan(start, available, self._budget_s(units, num_decodes, spent_units))
        if step >= layers:
            return None, 0  # a plain chunk after all
        return LayerSlice(req.request_id, 0, step), tokens

    def plan(self, start: int, available: int, budget_s: float | None) -> tuple[int, int]:
        """(chunk tokens, layers per step) for a chunk from `start` of at most
        `available` tokens within `budget_s` seconds a step."""
        layers = self.num_layers
        if budget_s is None:
            return available, layers
        budget_s *= PLAN_FILL
        per_unit = self._layer_seconds_per_unit()
        plans: list[tuple[float, int, int]] = []
        for step in range(1, layers + 1):
            tokens = min(available, self.pacer.max_tokens(start, budget_s / (step * per_unit)))
            if tokens >= 2:
                plans.append((tokens / -(-layers // step), tokens, step))
        if not plans:
            self.at_floor = True
            return min(available, 2), 1
        best = max(per_step for per_step, _, _ in plans)
        tokens, _, step = max(
            (tokens, per_step, step) for per_step, tokens, step in plans if per_step >= PLAN_TOLERANCE * best
        )
        return tokens, step

    def _layer_seconds_per_unit(self) -> float:
        """Seconds of a layer per pacing unit of its chunk (a chunk's units
        cover all its layers)."""
        known = self._chunk if self._chunk is not None else self._last
        if known is not None:
            return known.seconds / self.pacer.cost(known.start, known.tokens)
        unit_s = self.pacer.unit_s
        if unit_s is None:  # next_slice sizes slices only once the unit cost is known
            raise RuntimeError("layer slice sized before the pacing unit cost is known")
        return unit_s / self.num_layers

    def _budget_s(self, units: float | None, num_decodes: int, spent_units: float) -> float | None:
        """Seconds this step's slice may take; None: no limit."""
        pacer = self.pacer
        if units is None or pacer.unit_s is None:
            return None
        decode_s = pacer.decode_step_s(num_decodes)
        aim_s = pacer.aim_s(num_decodes)
        if self._rest_s is None or decode_s is None or aim_s is None:
            return max(units, 0.0) * pacer.unit_s
        budget_s = aim_s - self._rest_s - spent_units * pacer.unit_s
        least_s = MIN_SLICE_SHARE * (aim_s - decode_s)
        if budget_s < least_s:
            self.at_floor = True
            return least_s
        return budget_s

    def _layers(self, start: int, req: Request, budget_s: float | None) -> int:
        left = self.num_layers - req.slice_layers_done
        if budget_s is None:
            return left
        layer_s = self._layer_seconds_per_unit() * self.pacer.cost(start, req.slice_tokens)
        fits = int(budget_s / layer_s + SLICE_SLACK)
        if fits < 1:
            self.at_floor = True
        return max(1, min(left, fits))

    def scheduled(self, req: Request, layer_slice: LayerSlice, tokens: int) -> None:
        """`req`'s slice is in this step."""
        if layer_slice.first_layer == 0:
            if self._chunk is not None:
                self._last = self._chunk
            self._chunk = None
        self.slicing = req
        req.slice_tokens = tokens

    def observe(self, req: Request, layer_slice: LayerSlice, step_s: float, slice_s: float | None) -> None:
        """A step whose only prefill was this slice took `step_s`, the slice
        `slice_s` of it (None: not measured)."""
        if slice_s is None or slice_s <= 0.0:
            # 0: its layers timed no slower than the others (the slice is
            # small against the noise; seen on a Zen 5): no cost to learn
            return
        rest = step_s - slice_s
        self._rest_s = rest if self._rest_s is None else self._rest_s + self.pacer.smoothing * (rest - self._rest_s)
        sample = slice_s / (layer_slice.end_layer - layer_slice.first_layer)
        chunk = self._chunk
        if chunk is None:
            self._chunk = LayerTime(req.num_computed_tokens, req.slice_tokens, sample, 1)
        else:
            chunk.samples += 1
            chunk.seconds += (sample - chunk.seconds) / chunk.samples

    def ran(self, req: Request, layer_slice: LayerSlice) -> bool:
        """After the step: True when the slice ended the chunk (its tokens are computed now)."""
        if layer_slice.end_layer < self.num_layers:
            req.slice_layers_done = layer_slice.end_layer
            return False
        self.drop(req)
        return True

    def drop(self, req: Request) -> None:
        """`req`'s chunk in slices is gone (done, preempted, ended)."""
        req.slice_tokens = req.slice_layers_done = 0
        if self.slicing is req:
            self.slicing = None
