"""Writing a data-bin in fairseq-preprocess's layout from the format's specification, for tests.

Nothing here comes from convseq's reader: the bytes are spelled out from the mmap format as
fairseq 0.12 writes it (`--dataset-impl mmap`), so the reader is checked against the format
itself. Per split and side, `<split>.<src>-<tgt>.<lang>.idx`:

    b"MMIDIDX\\x00\\x00"   9 bytes of magic
    uint64 1              version
    uint8 code            dtype of the .bin (8 = uint16 below 65,500 symbols, 9 = uint32)
    uint64 n              sentences
    int32 sizes[n]        tokens per sentence, EOS included
    int64 pointers[n]     byte offset of each sentence in the .bin

and `<split>.<src>-<tgt>.<lang>.bin`, the ids of every sentence in that dtype, one after another.
"""

from __future__ import annotations

import shutil
import struct
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from convseq.data.databin import DataBin


def write_split(prefix: Path | str, sentences: Sequence[np.ndarray], vocab_size: int) -> None:
    """`prefix.idx` and `prefix.bin` of `sentences` (id arrays that end with EOS)."""
    dtype, code = (np.uint16, 8) if vocab_size < 65500 else (np.uint32, 9)
    sizes = np.array([len(s) for s in sentences], dtype="<i4")
    pointers = np.zeros(len(sizes), dtype="<i8")
    pointers[1:] = np.cumsum(sizes[:-1].astype(np.int64)) * np.dtype(dtype).itemsize
    with open(f"{prefix}.bin", "wb") as f:
        for s in sentences:
            f.write(np.asarray(s, dtype=np.dtype(dtype).newbyteorder("<")).tobytes())
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", code))
        f.write(struct.pack("<Q", len(sizes)))
        f.write(sizes.tobytes())
        f.write(pointers.tobytes())


def fairseq_copy(databin: DataBin, out: Path, splits: Sequence[str] = ("train", "valid", "test")):
    """The same data as convseq's `databin`, written as fairseq-preprocess would write it."""
    out.mkdir(parents=True, exist_ok=True)
    s, t = databin.src_lang, databin.tgt_lang
    for lang in (s, t):
        shutil.copy(databin.path / f"dict.{lang}.txt", out / f"dict.{lang}.txt")
    for split in splits:
        for side, lang in (("src", s), ("tgt", t)):
            arr = databin.split(split)[0 if side == "src" else 1]
            sentences = [arr[i] for i in range(len(arr))]
            write_split(out / f"{split}.{s}-{t}.{lang}", sentences, len(databin.dictionary(side)))
    return out
