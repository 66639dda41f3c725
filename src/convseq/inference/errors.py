"""What generation raises: settings it cannot honour (`GenerationError`), a device out of
memory (`GenerationOOM`, with `is_oom` to recognise one and `out_of_memory` to build it), and
data that does not match the checkpoint (`DataMismatchError`)."""

from __future__ import annotations

import torch

from convseq.errors import ConvseqError, DataError


class GenerationError(ConvseqError):
    """Search settings that cannot be honoured (e.g. min_len above a sentence's max length)."""


class GenerationOOM(ConvseqError):
    """The device ran out of memory on a generation batch; the message says what to lower."""


def is_oom(error: BaseException) -> bool:
    """Whether an exception is the device (or host) running out of memory."""
    oom_type = getattr(torch, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(error, oom_type):
        return True
    return isinstance(error, RuntimeError) and "out of memory" in str(error).lower()


def out_of_memory(src_tokens: torch.Tensor) -> GenerationOOM:
    """The error for an out-of-memory batch, saying what to lower."""
    if src_tokens.is_cuda:
        torch.cuda.empty_cache()
    bsz, width = src_tokens.shape
    return GenerationOOM(
        f"out of memory while translating a batch of {bsz} sentences ({bsz} x {width} = "
        f"{bsz * width} source tokens, padding included): lower gen.max_tokens (or set "
        "gen.batch_size, or a smaller gen.beam) and run again"
    )


class DataMismatchError(DataError):
    """The data given to translate is not the data the checkpoint was trained on (language
    pair, segmentation or dictionaries), or a checkpoint's own data cannot be found."""
