"""Where the time goes in a generate run (``task=generate gen.profile=true``).

The search's own phases (encoder, decoder, candidates, selection, finalisation, reorder; see
`convseq.search.PHASES`), the decoder split by forward hooks into convolutions, attention,
output projection (fconv: fc2 + fc3; LightConv: its output projection) and the rest of the layer
stack (fconv: embeddings, fc1, GLU, residuals; LightConv: embeddings, the layers' linear
projections, GLU, feed-forward, layer norms, residuals), plus data loading, detokenisation and
scoring; the rest of the wall time (Lightning's loop,
setup) is reported as such, never hidden.

Timing reads the clock (and on a GPU synchronises) at every boundary, so a profiled run is a
little slower than a plain one; nothing is timed unless profiling is asked for.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from convseq.models.lightconv import LightConvDecoder
from convseq.search import PHASES, PhaseTimer

# rows of the generation table: (key, label, indented under the row above)
GEN_ROWS = (
    ("data", "data loading and Lightning's predict loop (setup, hooks)", False),
    ("encoder", "encoder", False),
    ("decoder", "decoder (incl. log-softmax)", False),
    ("decoder.convolutions", "convolutions", True),
    ("decoder.attention", "attention", True),
    ("decoder.output", "output projection (fc2, fc3)", True),
    ("decoder.layers", "embeddings, fc1, GLU, residuals", True),
    ("decoder.log_softmax", "log-softmax and step glue", True),
    ("candidates", "search: candidates (masking, topk)", False),
    ("selection", "search: active selection", False),
    ("finalisation", "finalisation", False),
    ("reorder", "state reordering and batch shrinking", False),
    ("glue", "search set-up and bookkeeping (between phases)", False),
    ("detok", "detokenisation and records", False),
    ("scoring", "scoring (sacreBLEU)", False),
)
TOP_PARTS = ("data", *PHASES, "glue", "detok", "scoring")
# the rows whose label names fconv's modules, as a LightConv decoder's are named
LIGHTCONV_LABELS = {
    "decoder.output": "output projection",
    "decoder.layers": "embeddings, linear1/2, GLU, FFN, norms, residuals",
}


class _ModuleClock:
    """Forward pre/post hooks summing the wall time of groups of modules."""

    def __init__(self, synchronize: Callable[[], None] | None):
        self.synchronize = synchronize
        self.seconds: dict[str, float] = {}
        self._handles: list[Any] = []
        self._starts: dict[int, float] = {}

    def add(self, group: str, module: nn.Module) -> None:
        def pre(mod: nn.Module, args: Any) -> None:
            if self.synchronize is not None:
                self.synchronize()
            self._starts[id(mod)] = time.perf_counter()

        def post(mod: nn.Module, args: Any, output: Any) -> None:
            if self.synchronize is not None:
                self.synchronize()
            start = self._starts.pop(id(mod), None)
            if start is not None:
                self.seconds[group] = self.seconds.get(group, 0.0) + time.perf_counter() - start

        self._handles.append(module.register_forward_pre_hook(pre))
        self._handles.append(module.register_forward_hook(post))

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


class GenerationProfiler:
    """Collects a generate run's breakdown; see the module docstring.

    Args:
        models: the models being searched (their decoders get timing hooks while profiling).
        synchronize: called at every clock reading (default: CUDA's synchronize when the
            models are on a GPU), so queued kernels are charged to the phase that launched them.
    """

    def __init__(self, models: Sequence[nn.Module], synchronize: Callable[[], None] | None = None):
        self.models = list(models)
        if synchronize is None and any(
            p.is_cuda for m in self.models for p in m.parameters(recurse=True)
        ):
            synchronize = torch.cuda.synchronize
        self.synchronize = synchronize
        self.timer = PhaseTimer(synchronize=synchronize)
        self.hooks = _ModuleClock(synchronize)
        self.wall = 0.0
        self._t0 = self._last = 0.0
        self.families: set[str] = set()  # the families whose decoders have hooks

    def _now(self) -> float:
        if self.synchronize is not None:
            self.synchronize()
        return time.perf_counter()

    def start(self) -> None:
        """Begin the wall clock and put the decoder hooks in place."""
        for m in self.models:
            decoder = getattr(m, "decoder", None)
            if isinstance(decoder, LightConvDecoder):
                self._hook_lightconv(decoder)
                continue
            if decoder is None or not hasattr(decoder, "convolutions"):
                continue  # neither family's decoder: its time stays in one "decoder" row
            self.families.add("fconv")
            self.hooks.add("decoder.whole", decoder)
            for conv in decoder.convolutions:
                self.hooks.add("decoder.convolutions", conv)
            for att in decoder.attention:
                if att is not None:
                    self.hooks.add("decoder.attention", att)
            self.hooks.add("decoder.output", decoder.fc2)
            self.hooks.add("decoder.output", decoder.fc3)
        self._t0 = self._last = self._now()

    def _hook_lightconv(self, decoder: LightConvDecoder) -> None:
        """A LightConv decoder's parts: each layer's convolution and encoder attention, the
        projection out (and to the output width where it differs); the rest is the stack."""
        self.hooks.add("decoder.whole", decoder)
        for layer in decoder.layers:
            self.hooks.add("decoder.convolutions", layer.conv)
            if layer.encoder_attn is not None:
                self.hooks.add("decoder.attention", layer.encoder_attn)
        if decoder.project_out_dim is not None:
            self.hooks.add("decoder.output", decoder.project_out_dim)
        self.hooks.add("decoder.output", decoder.output_projection)
        self.families.add("lightconv")

    def batch_start(self) -> None:
        """A batch reaches the step: the time since the last one was data loading and loop."""
        now = self._now()
        self.timer.seconds["data"] = self.timer.seconds.get("data", 0.0) + now - self._last

    def batch_end(self) -> None:
        self._last = self._now()

    def predict_done(self) -> None:
        """trainer.predict returned: its teardown joins the loop's time."""
        self.batch_start()

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """Around a whole predict step: its time outside the phases is the search's glue."""
        before = sum(self.timer.seconds.values())
        start = self._now()
        try:
            yield
        finally:
            inside = sum(self.timer.seconds.values()) - before
            glue = self._now() - start - inside
            self.timer.seconds["glue"] = self.timer.seconds.get("glue", 0.0) + glue

    def phase(self, name: str) -> contextlib.AbstractContextManager:
        """Time a phase of the run (``detok``, ``scoring``) with the same clock."""
        return self.timer.phase(name)

    def stop(self) -> None:
        """End the wall clock and remove the hooks."""
        self.wall = self._now() - self._t0
        self.hooks.remove()

    def parts(self) -> dict[str, float]:
        """Seconds per row of `GEN_ROWS` (decoder sub-rows only where hooks could time them)."""
        secs = dict(self.timer.seconds)
        out = {key: secs.get(key, 0.0) for key in TOP_PARTS}
        hooked = self.hooks.seconds
        if "decoder.whole" in hooked:
            whole = hooked["decoder.whole"]
            conv = hooked.get("decoder.convolutions", 0.0)
            att = hooked.get("decoder.attention", 0.0)
            proj = hooked.get("decoder.output", 0.0)
            out["decoder.convolutions"] = conv
            out["decoder.attention"] = att
            out["decoder.output"] = proj
            out["decoder.layers"] = max(whole - conv - att - proj, 0.0)
            out["decoder.log_softmax"] = max(out["decoder"] - whole, 0.0)
        return out

    def report(self) -> dict[str, Any]:
        """Plain figures: seconds per part, the wall time and what the parts leave unexplained."""
        parts = self.parts()
        total = sum(parts[k] for k in TOP_PARTS)
        return {
            "wall_seconds": self.wall,
            "parts_seconds": parts,
            "sum_of_parts": total,
            "other_seconds": self.wall - total,
        }

    def rows(self) -> list[tuple[str, float, bool]]:
        """The table's rows: (label, seconds, is a decoder sub-row), "not attributed" last."""
        parts = self.parts()
        labels = {key: label for key, label, _ in GEN_ROWS}
        if self.families == {"lightconv"}:  # an ensemble of both families keeps fconv's names
            labels.update(LIGHTCONV_LABELS)
        rows = [(labels[key], parts[key], sub) for key, _, sub in GEN_ROWS if key in parts]
        total = sum(parts[k] for k in TOP_PARTS)
        rows.append(("not attributed", self.wall - total, False))
        return rows

    def table(self) -> str:
        """The breakdown as a text table (seconds and % of the wall time)."""
        rows = [(("  " if sub else "") + label, secs) for label, secs, sub in self.rows()]
        return format_table("Where the time goes (generate)", rows, self.wall)


def format_table(title: str, rows: Sequence[tuple[str, float]], wall: float) -> str:
    """``label  seconds  %`` rows under a title, with the wall time last."""
    width = max(len(r[0]) for r in [*rows, ("wall time", 0.0)])
    lines = [title, f"{'part'.ljust(width)}  {'seconds':>9}  {'%':>6}"]
    for label, secs in rows:
        pct = 100.0 * secs / wall if wall > 0 else 0.0
        lines.append(f"{label.ljust(width)}  {secs:9.3f}  {pct:6.1f}")
    lines.append(f"{'wall time'.ljust(width)}  {wall:9.3f}  {100.0:6.1f}")
    return "\n".join(lines)
