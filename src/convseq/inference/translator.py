"""Translating text with trained models: the API behind predict_step, task=generate/interactive
and notebooks.

    from convseq import Translator
    t = Translator.from_checkpoints(["outputs/.../checkpoints/best.ckpt"])
    t.translate(["a sentence .", "another one ."], beam=5)   # -> list of strings

or, from a loaded module, ``ConvSeqModule.load_from_checkpoint(path).translate([...], beam=5)``.

A `Translator` holds one or more models (several: an ensemble, probabilities averaged per step),
their dictionaries and the segmentation of each side. Raw text goes through the segmentation the
training data used (sentencepiece when there was one: its model travels inside convseq's
checkpoints), the dictionary and the tensorized beam search; hypotheses come back detokenised.

A translation record (one per input sentence, what `translate_batch` and predict_step return):

    id            int        the sentence's index in the input
    src_symbols   list[str]  the source pieces the model saw, EOS included
    hypotheses    list       the n-best, best first, each a dict:
        text               str          detokenised translation
        symbols            list[str]    output pieces, EOS included
        tokens             LongTensor   (L,) output ids, ending in EOS
        score              float        log-prob sum / L ** lenpen (or the plain sum)
        positional_scores  FloatTensor  (L,) log-prob of each output token
        attention          FloatTensor  (src_len, L) layer-averaged attention, or None
        alignment          list[int]    for each output token, the source position it attends most
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from convseq.data.batching import source_batches
from convseq.data.dataset import LanguagePairDataset
from convseq.data.dictionary import Dictionary
from convseq.data.subword import Segmenter, segmenters
from convseq.errors import CheckpointError
from convseq.inference.data_match import TrainedOn, trained_on
from convseq.inference.ensemble import EnsembleModel
from convseq.inference.errors import GenerationError, is_oom, out_of_memory
from convseq.inference.loading import load_any
from convseq.inference.options import DEFAULT_MAX_TOKENS, GenConfig
from convseq.inference.precision import for_generation
from convseq.inference.records import in_input_order
from convseq.search import SearchTimer, as_search_model, beam_search

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------- the translator


class Translator:
    """Models + dictionaries + segmentation: text in, hypotheses out.

    Args:
        models: one model, or several (an ensemble); FConvModels, LightConvModels or any
            fairseq-style incremental-decoder models, all over ``src_dict`` -> ``tgt_dict``.
        src_dict, tgt_dict: the dictionaries the models were trained with.
        src_segmenter, tgt_segmenter: how raw text is split into the dictionary's pieces and
            joined back (default: whitespace).
        options: default search settings (`GenConfig`).
        trained_on: what the checkpoints record of their training data (`from_checkpoints`
            fills it; generation translates that data unless told otherwise, and refuses
            other data).
    """

    def __init__(
        self,
        models: Sequence[nn.Module],
        src_dict: Dictionary,
        tgt_dict: Dictionary,
        src_segmenter: Segmenter | None = None,
        tgt_segmenter: Segmenter | None = None,
        options: GenConfig | None = None,
        trained_on: TrainedOn | None = None,
    ):
        if not models:
            raise ValueError("a Translator needs at least one model")
        self.trained_on = trained_on or TrainedOn((), None, None)
        self.models = list(models)
        self.src_dict, self.tgt_dict = src_dict, tgt_dict
        self.src_segmenter = src_segmenter or Segmenter(None)
        self.tgt_segmenter = tgt_segmenter or Segmenter(None)
        self.options = options or GenConfig()
        self.search_model = self._search_model()

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def from_checkpoints(
        cls,
        paths: str | os.PathLike | Sequence[str | os.PathLike],
        dict_dir: str | os.PathLike | None = None,
        map_location: Any = "cpu",
        options: GenConfig | None = None,
    ) -> Translator:
        """Load convseq checkpoints (``.ckpt``) and/or fairseq fconv or LightConv checkpoints (``.pt``).

        Several paths make an ensemble; their dictionaries (and the data they were trained on,
        where they record it) must be identical. A fairseq
        checkpoint needs its ``dict.<lang>.txt`` files beside it (or in ``dict_dir``); its text
        is split on whitespace (apply the model's own tokenisation/BPE to the input first).
        """
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        if not paths:
            raise CheckpointError("no checkpoint given")
        loaded = [load_any(p, dict_dir=dict_dir, map_location=map_location) for p in paths]
        first = loaded[0]
        for p, other in zip(paths[1:], loaded[1:]):
            for side in ("src_dict", "tgt_dict"):
                if getattr(other, side) != getattr(first, side):
                    raise CheckpointError(
                        f"{p}: its {side[:3]} dictionary differs from {paths[0]}'s; ensemble "
                        "members must be trained on the same dictionaries"
                    )
        data = trained_on(loaded, paths)
        src_seg, tgt_seg = segmenters(first.text)
        models = [m.model for m in loaded]
        return cls(models, first.src_dict, first.tgt_dict, src_seg, tgt_seg, options, data)

    def with_precision(
        self, precision: str, device: torch.device | str | None = None
    ) -> Translator:
        """Translate in ``precision`` from now on: fp32 (as trained), bf16 or int8 copies of the
        models (`convseq.inference.precision`); refused where ``device`` cannot run it."""
        self.models = [for_generation(m, precision, device) for m in self.models]
        self.search_model = self._search_model()
        return self

    def _search_model(self):
        """The search's view of the models: the model itself, or their ensemble."""
        if len(self.models) == 1:
            return as_search_model(self.models[0])
        return EnsembleModel(self.models)

    # -- properties -----------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        for p in self.models[0].parameters():
            return p.device
        return torch.device("cpu")

    def to(self, device: str | torch.device) -> Translator:
        for m in self.models:
            m.to(device)
        return self

    def max_source_positions(self) -> int | None:
        """The longest source (EOS included) every model can number; None if unlimited."""
        limits = []
        for m in self.models:
            fn = getattr(m, "max_positions", None)
            if fn is None:
                continue
            value = fn()
            value = value[0] if isinstance(value, (tuple, list)) else value
            if value is not None:
                limits.append(int(value))
        return min(limits) if limits else None

    # -- text -----------------------------------------------------------------------------------
    def encode(self, line: str) -> tuple[np.ndarray, bool]:
        """(ids ending in EOS, whether it was truncated to the model's source positions)."""
        pieces = self.src_segmenter.segment(line.strip())
        ids = self.src_dict.encode(pieces, append_eos=True)
        limit = self.max_source_positions()
        if limit is not None and len(ids) > limit:
            ids = np.concatenate([ids[: limit - 1], ids[-1:]])
            return ids, True
        return ids, False

    def encode_lines(
        self,
        lines: Iterable[str],
        what: Callable[[list[int]], str],
        warn: Callable[[str], Any] = log.warning,
    ) -> tuple[list[np.ndarray], list[int]]:
        """The ids of every line (`encode`) and the 0-based indices of the truncated ones.

        Lines longer than the model's source positions are reported in one message to ``warn``,
        ``what(indices)`` naming them (e.g. ``"input.txt: 2 line(s) (lines 4, 9)"``).
        """
        encoded, truncated = [], []
        for i, line in enumerate(lines):
            ids, cut = self.encode(line)
            encoded.append(ids)
            if cut:
                truncated.append(i)
        if truncated:
            limit = self.max_source_positions()
            warn(
                f"{what(truncated)}: longer than the model's {limit} source positions; truncated "
                f"to the first {limit - 1} tokens and the EOS"
            )
        return encoded, truncated

    def decode(self, ids: Iterable[int]) -> str:
        """Detokenised target text of output ids (specials dropped)."""
        pieces = self.tgt_dict.string(ids, strip_special=True).split()
        return self.tgt_segmenter.detokenize(pieces)

    # -- translation ----------------------------------------------------------------------------
    def translate_batch(
        self,
        batch: Mapping[str, Any],
        options: GenConfig | None = None,
        timer: SearchTimer | None = None,
    ) -> list[dict[str, Any]]:
        """Translation records (module docstring) of a collated batch, in the batch's row order.

        A dummy (rank-evening) batch gives no record.

        Raises:
            GenerationOOM: the device ran out of memory; the message says to lower
                ``gen.max_tokens``.
        """
        if batch.get("is_dummy", False):
            return []
        opts = options or self.options
        net = batch["net_input"]
        device = self.device
        src_tokens = net["src_tokens"].to(device)  # (B, S) left-padded
        src_lengths = net["src_lengths"].to(device)  # (B,)
        try:
            hyps = beam_search(
                self.search_model, src_tokens, src_lengths, **opts.search_kwargs(), timer=timer
            )
        except RuntimeError as e:  # torch.OutOfMemoryError is a RuntimeError
            if not is_oom(e):
                raise
            raise out_of_memory(src_tokens) from e
        except ValueError as e:  # the search refuses settings it cannot honour, naming them
            raise GenerationError(f"generation settings (gen.*): {e}") from e
        phase = timer.phase if timer is not None else None
        if phase is None:
            return self._records(batch, src_tokens, src_lengths, hyps)
        with phase("detok"):
            return self._records(batch, src_tokens, src_lengths, hyps)

    def _records(
        self,
        batch: Mapping[str, Any],
        src_tokens: torch.Tensor,
        src_lengths: torch.Tensor,
        hyps: list[list[dict[str, Any]]],
    ) -> list[dict[str, Any]]:
        # every tensor the records need comes to the host in one transfer per dtype for the
        # whole batch: a copy per hypothesis would make the host wait for the device each time
        wanted = [torch.as_tensor(batch["id"]), src_lengths, src_tokens]  # (B,), (B,), (B, S)
        for h in (h for nbest in hyps for h in nbest):
            wanted.append(h["tokens"])  # (L,)
            wanted.append(h["positional_scores"].float())  # (L,)
            if h.get("attention") is not None:
                wanted.append(h["attention"].float())  # (src_len, L)
            if isinstance(h["score"], torch.Tensor):
                wanted.append(h["score"])  # ()
        host = iter(_to_host(wanted))  # CPU tensors, in the order of `wanted`
        ids, lengths, src_rows = next(host).tolist(), next(host).tolist(), next(host).tolist()
        out = []
        for i, (sent_id, nbest) in enumerate(zip(ids, hyps)):
            src = src_rows[i][len(src_rows[i]) - lengths[i] :]  # padding removed, EOS kept
            record_hyps = []
            for h in nbest:
                tokens = next(host)
                positional = next(host)
                attention = None if h.get("attention") is None else next(host)
                score = next(host) if isinstance(h["score"], torch.Tensor) else h["score"]
                token_list = tokens.tolist()
                record_hyps.append(
                    {
                        "text": self.decode(token_list),
                        "symbols": [self.tgt_dict[t] for t in token_list],
                        "tokens": tokens,
                        "score": float(score),
                        "positional_scores": positional,
                        "attention": attention,
                        "alignment": [] if attention is None else attention.argmax(0).tolist(),
                    }
                )
            out.append(
                {
                    "id": int(sent_id),
                    "src_symbols": [self.src_dict[t] for t in src],
                    "hypotheses": record_hyps,
                }
            )
        return out

    def translate_records(
        self,
        lines: Sequence[str],
        max_tokens: int | None = DEFAULT_MAX_TOKENS,
        batch_size: int | None = None,
        timer: SearchTimer | None = None,
        **options: Any,
    ) -> list[dict[str, Any]]:
        """Translation records of raw lines, in input order (batched by length, like generate).

        Args:
            lines: raw text, one sentence each.
            max_tokens: source tokens per batch (padding counted); None: no limit.
            batch_size: sentences per batch; None: no limit (one of the two is needed).
            timer: optional phase timer (see `convseq.search.PhaseTimer`).
            **options: `GenConfig` fields overriding ``self.options`` (beam=5, nbest=3, ...).
        """
        opts = self.options.updated(**options)
        encoded, _ = self.encode_lines(lines, lambda cut: numbered("sentence", cut))
        if not encoded:
            return []
        return self.translate_encoded(encoded, max_tokens, batch_size, opts, timer)

    def translate_encoded(
        self,
        encoded: Sequence[np.ndarray],
        max_tokens: int | None,
        batch_size: int | None,
        options: GenConfig | None = None,
        timer: SearchTimer | None = None,
    ) -> list[dict[str, Any]]:
        """Records of already encoded sources (ids ending in EOS), in input order."""
        dataset = LanguagePairDataset(list(encoded), None, pad=self.src_dict.pad())
        longest = int(dataset.src_sizes.max())
        if max_tokens is None and batch_size is None:
            batch_size = len(encoded)
        budget = None if max_tokens is None else max(int(max_tokens), longest)
        records = []
        for indices in source_batches(dataset.src_sizes, budget, batch_size, longest, "input"):
            batch = dataset.collater(dataset.__getitems__(indices))
            records.extend(self.translate_batch(batch, options, timer))
        return in_input_order(records)

    def translate(
        self,
        sentences: str | Sequence[str],
        max_tokens: int | None = DEFAULT_MAX_TOKENS,
        batch_size: int | None = None,
        **options: Any,
    ) -> str | list[str] | list[list[str]]:
        """Translate raw sentences; each becomes its best translation (``nbest > 1``: a list).

        A single string in gives a single result out.
        """
        single = isinstance(sentences, str)
        lines = [sentences] if single else list(sentences)
        records = self.translate_records(lines, max_tokens, batch_size, **options)
        nbest = self.options.updated(**options).nbest
        if nbest == 1:
            texts: list = [r["hypotheses"][0]["text"] for r in records]
        else:
            texts = [[h["text"] for h in r["hypotheses"]] for r in records]
        return texts[0] if single else texts


def numbered(noun: str, numbers: Sequence[int], most: int = 10) -> str:
    """``"line 4"``, ``"lines 4, 9"``: numbers of one kind, the first `most` of them."""
    shown = ", ".join(map(str, numbers[:most])) + (", ..." if len(numbers) > most else "")
    return f"{noun}{'s' if len(numbers) > 1 else ''} {shown}"


def _to_host(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """CPU copies of ``tensors``, in order, with one device-to-host copy per device and dtype.

    The tensors of one device and dtype are flattened into one, copied at once and split on
    the host. Each result owns its memory, so that a record pickled or saved on its own carries
    its values only, not the whole batch's.
    """
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.device, t.dtype), []).append(i)
    out: list[torch.Tensor | None] = [None] * len(tensors)
    for (device, _), members in groups.items():
        parts = [tensors[i] for i in members]
        if device.type == "cpu":  # no transfer to save: one copy each, no concatenation
            for i, t in zip(members, parts):
                out[i] = t.clone()
            continue
        flat = torch.cat([t.reshape(-1) for t in parts]).cpu()  # (sum of numel,) one copy
        for i, t, piece in zip(members, parts, flat.split([t.numel() for t in parts])):
            out[i] = piece.view(t.shape).clone()  # its own storage
    return out  # type: ignore[return-value]


def translator_of(module: Any) -> Translator:
    """The (cached) Translator of a `ConvSeqModule`: its model, dictionaries and segmentation."""
    cached = getattr(module, "_convseq_translator", None)
    if cached is not None and cached.models[0] is module.model:
        return cached
    src_seg, tgt_seg = segmenters(getattr(module, "text_processing", None))
    translator = Translator([module.model], module.src_dict, module.tgt_dict, src_seg, tgt_seg)
    module._convseq_translator = translator
    return translator
