"""A fairseq-preprocess data-bin read as it is (data.format=fairseq): the same ids, batches and
references as convseq's data-bin of the same corpus; every damaged file refused in one line that
names it. The fairseq folder is written by tests/data/fairseq_layout.py from the format's
specification (no fairseq install)."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from convseq.data.databin import DataBin
from convseq.data.datamodule import TranslationDataModule
from convseq.data.fairseq_databin import FairseqDataBin
from convseq.data.preprocess import open_databin, prepare_databin
from convseq.data.subword import segmenters, undo_segmentation
from convseq.errors import DataError
from tests.data.fairseq_layout import fairseq_copy, write_split

BATCHING = {"max_tokens": 300, "required_batch_size_multiple": 8}


def fairseq_cfg(path: Path, **extra) -> dict:
    """The data config `data=fairseq data.path=PATH` composes to (the keys that matter)."""
    return {"format": "fairseq", "name": "fairseq", "dir": "", "path": str(path),
            "src_lang": None, "tgt_lang": None, **extra}  # fmt: skip


@pytest.fixture(scope="module")
def pair(tiny_data, tmp_path_factory) -> tuple[DataBin, Path]:
    """convseq's tiny data-bin and the same data in fairseq's layout."""
    databin = DataBin(tiny_data["databin"])
    return databin, fairseq_copy(databin, tmp_path_factory.mktemp("fairseq") / "data-bin")


@pytest.fixture
def damaged(pair, tmp_path) -> Path:
    """A copy of the fairseq folder that a test may damage."""
    return Path(shutil.copytree(pair[1], tmp_path / "data-bin"))


def test_the_ids_are_convseqs_and_the_bin_is_memory_mapped(pair):
    databin, folder = pair
    fs = open_databin(fairseq_cfg(folder), "unused-cache")
    assert isinstance(fs, FairseqDataBin) and (fs.src_lang, fs.tgt_lang) == ("src", "tgt")
    assert fs.src_dict == databin.src_dict and fs.tgt_dict == databin.tgt_dict
    for split in ("train", "valid", "test"):
        for mine, theirs in zip(databin.split(split), fs.split(split)):
            assert np.array_equal(mine.sizes, theirs.sizes)
            assert all(np.array_equal(mine[i], theirs[i]) for i in range(len(mine)))
            assert theirs[0][-1] == fs.tgt_dict.eos()  # EOS included, as convseq stores it
    tokens = fs.split("train")[0].tokens
    assert isinstance(tokens, np.memmap) and tokens.dtype == np.uint16  # not read into memory
    assert Path(tokens.filename) == folder / "train.src-tgt.src.bin"
    assert fs.lines("valid").tolist() == list(range(len(fs.split("valid")[0])))


def test_the_batches_are_those_of_convseqs_data_bin(pair, tiny_data):
    databin, folder = pair
    loaders = []
    convseq = {"name": "toy", "dir": str(tiny_data["corpus"]), "src_lang": "src", "tgt_lang": "tgt"}
    for data, db in ((convseq, databin), (fairseq_cfg(folder), None)):
        dm = TranslationDataModule(data, BATCHING, str(tiny_data["cache"]), seed=3, databin=db)
        dm.setup("fit")
        loaders.append(dm)
    for split in ("train", "valid"):
        for epoch in (0, 1):
            batches = []
            for dm in loaders:
                dm.batch_sampler(split).set_epoch(epoch)
                loader = dm.train_dataloader() if split == "train" else dm.val_dataloader()
                batches.append(list(loader))
            assert len(batches[0]) == len(batches[1]) > 1
            for a, b in zip(*batches):
                assert a["id"].tolist() == b["id"].tolist()
                for key in ("src_tokens", "src_lengths", "prev_output_tokens"):
                    assert torch.equal(a["net_input"][key], b["net_input"][key])
                assert torch.equal(a["target"], b["target"])


def test_references_are_the_target_pieces_and_unknown_words_read_unk(pair):
    databin, folder = pair
    fs = FairseqDataBin(folder)
    raw, rebuilt = databin.text("valid"), fs.text("valid")
    assert len(raw) == len(rebuilt)
    unk = [i for i, line in enumerate(rebuilt) if "<unk>" in line]
    assert unk and all(rebuilt[i] == raw[i] for i in range(len(raw)) if i not in unk)
    assert fs.scored_splits() == ["valid", "test"]


def test_the_data_module_records_the_absolute_folder_and_the_pair_it_read(pair, tmp_path):
    _, folder = pair
    fs = FairseqDataBin(folder)
    dm = TranslationDataModule(fairseq_cfg(folder), BATCHING, str(tmp_path), databin=fs)
    data = dm.hparams["data"]
    assert (data["src_lang"], data["tgt_lang"], data["path"]) == ("src", "tgt", str(folder))


def test_a_pair_given_reads_the_other_direction_from_the_same_files(pair):
    _, folder = pair
    forward = FairseqDataBin(folder)
    backward = FairseqDataBin(folder, "tgt", "src")
    assert backward.src_dict == forward.tgt_dict
    assert np.array_equal(backward.split("valid")[0].sizes, forward.split("valid")[1].sizes)


def test_remove_bpe_joins_pieces_as_fairseq_does_and_travels_in_the_checkpoint(pair):
    assert undo_segmentation("he@@ llo wor@@ ld", "subword_nmt") == "hello world"
    assert undo_segmentation("he@@ llo wor@@ ld", "@@ ") == "hello world"
    assert undo_segmentation("\u2581he llo \u2581world", "sentencepiece") == "hello world"
    assert undo_segmentation("he@@ llo", None) == "he@@ llo"
    fs = FairseqDataBin(pair[1], remove_bpe="subword_nmt")
    entry = fs.text_processing()
    assert entry["remove_bpe"] == "subword_nmt" and entry["src_spm"] is None
    _, tgt = segmenters(entry)  # what a checkpoint's Translator detokenises hypotheses with
    assert tgt.detokenize(["he@@", "llo", "world"]) == "hello world"
    assert "remove_bpe" not in DataBin.text_processing(pair[0])  # convseq's entry unchanged
    with pytest.raises(DataError, match="data.remove_bpe='bpe': use one of"):
        open_databin(fairseq_cfg(pair[1], remove_bpe="bpe"), "unused")


def test_prepare_databin_checks_the_folder_and_prints_a_summary(pair, capsys):
    assert prepare_databin(fairseq_cfg(pair[1]), "unused") == pair[1]
    out = capsys.readouterr().out
    assert f"fairseq data-bin src->tgt: {pair[1]}" in out and "valid" in out


# ---------------------------------------------------------------------------- refusals


def one_line_error(cfg: dict, split: str = "valid") -> str:
    """The message of opening the data-bin and reading `split`: one line, returned."""
    with pytest.raises(DataError) as e:
        open_databin(cfg, "unused").split(split)
    message = str(e.value)
    assert "\n" not in message
    return message


def test_a_wrong_magic_is_refused_naming_the_index(damaged):
    idx = damaged / "valid.src-tgt.tgt.idx"
    idx.write_bytes(b"NOTANIDX\x00" + idx.read_bytes()[9:])
    message = one_line_error(fairseq_cfg(damaged))
    assert message.startswith(f"{idx}: not a fairseq mmap index")
    assert "--dataset-impl mmap" in message


def test_a_truncated_bin_is_refused_naming_it(damaged):
    bin_ = damaged / "valid.src-tgt.tgt.bin"
    bin_.write_bytes(bin_.read_bytes()[:-2])
    assert one_line_error(fairseq_cfg(damaged)).startswith(f"{bin_}: holds ")
    assert "truncated" in one_line_error(fairseq_cfg(damaged))


def test_sizes_that_disagree_with_the_pointers_are_refused(damaged):
    idx = damaged / "valid.src-tgt.src.idx"
    raw = bytearray(idx.read_bytes())
    first = struct.unpack_from("<i", raw, 26)[0]
    struct.pack_into("<i", raw, 26, first + 1)  # sentence 0 one token longer than its pointers say
    idx.write_bytes(bytes(raw))
    message = one_line_error(fairseq_cfg(damaged))
    assert message.startswith(f"{idx}: pointer of sentence 1 is byte")


def test_an_index_shorter_than_its_header_says_is_refused(damaged):
    idx = damaged / "valid.src-tgt.src.idx"
    idx.write_bytes(idx.read_bytes()[:-8])
    assert "header announces 40 sentences" in one_line_error(fairseq_cfg(damaged))


def test_a_dictionary_smaller_than_the_largest_id_is_refused(damaged, pair):
    d = damaged / "dict.tgt.txt"
    d.write_text("".join(d.read_text().splitlines(keepends=True)[:100]))
    message = one_line_error(fairseq_cfg(damaged))
    assert message.startswith(f"{damaged / 'valid.src-tgt.tgt.bin'}: holds token id")
    assert "dict.tgt.txt has 104 symbols" in message


def test_two_language_pairs_are_refused_by_name_and_one_can_be_chosen(damaged):
    write_split(damaged / "train.de-en.de", [np.array([5, 2])], 10)
    with pytest.raises(DataError, match=r"several language pairs \(de-en, src-tgt\)"):
        open_databin(fairseq_cfg(damaged), "unused")
    chosen = open_databin(fairseq_cfg(damaged, src_lang="src", tgt_lang="tgt"), "unused")
    assert len(chosen.split("train")[0]) == 300


def test_fairseqs_other_formats_are_refused_with_the_command_to_rerun(damaged):
    raw = damaged / "valid.src-tgt.src"
    for f in damaged.glob("valid.src-tgt.src.*"):
        f.unlink()
    raw.write_text("a b\n")  # --dataset-impl raw copies the text
    message = one_line_error(fairseq_cfg(damaged))
    assert message.startswith(f"{raw}: a fairseq 'raw' data-bin")
    assert "re-run fairseq-preprocess --dataset-impl mmap" in message
    raw.unlink()
    idx = damaged / "valid.src-tgt.src.idx"
    idx.write_bytes(b"TNTIDX\x00\x00" + b"\x00" * 40)  # lazy / cached
    (damaged / "valid.src-tgt.src.bin").write_bytes(b"")
    message = one_line_error(fairseq_cfg(damaged))
    assert message.startswith(f"{idx}: fairseq's 'lazy'/'cached' format")


def test_a_sharded_split_is_refused_naming_the_shard(damaged):
    write_split(damaged / "train1.src-tgt.src", [np.array([5, 2])], 464)
    message = one_line_error(fairseq_cfg(damaged), "train")
    assert message.startswith(f"{damaged / 'train1.src-tgt.src.idx'}: split 'train' is sharded")


def test_a_missing_folder_split_or_path_is_named(tmp_path, pair):
    with pytest.raises(DataError, match="give it with data.path=DIR"):
        open_databin({**fairseq_cfg(tmp_path), "path": None}, "unused")
    with pytest.raises(DataError, match=f"{tmp_path / 'nope'}: data.path: no such folder"):
        open_databin(fairseq_cfg(tmp_path / "nope"), "unused")
    with pytest.raises(DataError, match="not a folder written by fairseq-preprocess"):
        open_databin(fairseq_cfg(tmp_path), "unused")
    fs = FairseqDataBin(pair[1], splits={"test": "test7"})
    with pytest.raises(DataError, match=r"split 'test': neither test7.src-tgt.src.bin/.idx"):
        fs.split("test")
