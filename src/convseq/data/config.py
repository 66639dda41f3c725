"""Configuration schemas of the `data` and `batching` groups (see conf/data, conf/batching)."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING


@dataclass
class SubwordConfig:
    """Optional sentencepiece segmentation, trained on train only and applied to every split."""

    type: str = "none"  # none (whitespace tokens) | bpe | unigram
    vocab_size: int = 8000  # sentencepiece vocabulary size (per model)
    joint: bool = True  # one model for both languages (true) or one per language (false)
    character_coverage: float = 1.0  # sentencepiece's character_coverage
    # Train sentencepiece on a seeded random sample of this many sentences when it has more
    # (0 = all; a joint model counts both sides). 1,000,000 keeps training to a few minutes and
    # memory to a few GB: on 2 cores, a unigram model took 14 s and 1.5 GB on 1M Multi30k-length
    # sentences and 33 s and 2.8 GB on 2M (BPE: 3 s and 0.3 GB at 1M); longer sentences cost more.
    # A corpus below the sample size is trained on all of it, exactly as with 0.
    input_sentence_size: int = 1_000_000


@dataclass
class VocabConfig:
    """Dictionary construction (fairseq-preprocess's --joined-dictionary, --threshold, --nwords)."""

    joined: bool = False  # one dictionary for source and target
    threshold: int = 0  # drop symbols seen fewer times than this in train (0 = keep all)
    nwords: int = -1  # keep at most this many symbols, specials included (-1 = all)
    padding_factor: int = 8  # pad the vocabulary to a multiple of this (madeupwordNNNN rows)


@dataclass
class DataConfig:
    """A parallel corpus: one text file per split and language, `{dir}/{split}.{lang}`; or,
    with `format: fairseq`, a folder written by fairseq-preprocess (`path`), read as it is."""

    name: str = MISSING  # short name, part of the data-bin key
    # The folder with the text files: read, never written. null: the generator's own folder in
    # the cache (`<paths.cache_dir>/corpora/<generator>-seed<generator_seed>`), written first;
    # a folder named here is read as it is and the generator does not run (data/corpus_dir.py).
    dir: str | None = MISSING
    # File suffix of each side. null only with format=fairseq: the pair is then read from the
    # data-bin's file names, as fairseq does (give both to pick one direction).
    src_lang: str | None = MISSING
    tgt_lang: str | None = MISSING
    # convseq: preprocess the text files of `dir` into convseq's own data-bin (in the cache).
    # fairseq: read the data-bin fairseq-preprocess wrote into `path` (--dataset-impl mmap);
    # the split names (train_split, ...) name its files, e.g. valid -> valid.de-en.de.bin.
    format: str = "convseq"
    path: str | None = None  # format=fairseq: the fairseq-preprocess --destdir folder
    # format=fairseq: how the data-bin's subword pieces become text again, for BLEU references
    # and hypotheses (fairseq's --remove-bpe): none (pieces joined by spaces) | subword_nmt
    # (drop the "@@ " joiner; "@@ " is the same) | sentencepiece ("▁" marks a word start).
    remove_bpe: str | None = None
    train_split: str = "train"
    valid_split: str = "valid"
    test_split: str = "test"
    # Extra evaluation sets (fairseq's --testpref a,b,c): data-bin split name -> input prefix, e.g.
    # {test2017: test1} reads {dir}/test1.{src_lang,tgt_lang} into the split "test2017". Each is
    # checked, segmented and binarised like the test split (its text kept for scoring), and the
    # end of training translates and scores every one of them.
    test_sets: dict[str, str] = field(default_factory=dict)
    # "toy": with `dir` unset, write the embedded synthetic corpus into the cache and read it
    generator: str | None = None
    generator_seed: int = 1  # seed of the generator (same seed -> same bytes)
    subword: SubwordConfig = field(default_factory=SubwordConfig)
    vocab: VocabConfig = field(default_factory=VocabConfig)
    # fairseq dictionaries to keep (fairseq-preprocess's --srcdict / --tgtdict): paths of
    # dict.<lang>.txt files ("<symbol> <count>" lines), relative to the current folder. Used as
    # written: vocab.threshold, nwords and padding_factor do not apply, and a word missing from
    # it becomes <unk>. With vocab.joined=true one file serves both sides (give src_dict, or both
    # the same file). null = build the side's dictionary from train. Part of the data-bin key.
    src_dict: str | None = None
    tgt_dict: str | None = None
    # Longest sentence kept, in tokens after segmentation, EOS included (fairseq's usable 1022).
    max_positions: int = 1022
    # Train pairs that are empty after stripping or longer than max_positions: skip (and count) or error.
    train_invalid: str = "skip"  # skip | error
    # Valid/test lines longer than max_positions: error (default) or skip and count. Empty lines
    # in valid/test are always kept (translated as empty): a smaller test set would inflate BLEU.
    eval_overlong: str = "error"  # error | skip
    # Train pairs whose source or target (stripped) fully matches this regex are dropped and counted.
    drop_train_regex: str | None = None
    num_workers: int = 0  # DataLoader worker processes (0 = load in the main process)
    # Processes that segment and binarise the text (fairseq-preprocess's --workers); the data-bin
    # is the same bytes whatever the number, so it is not part of its key.
    workers: int = 1


@dataclass
class BatchingConfig:
    """How sentences are packed into batches (fairseq's --max-tokens / --batch-size).

    conf/batching/<name>.yaml holds each option's sizes; a corpus or a recipe that packs to other
    sizes names them with `batch_sizes=NAME` (conf/batch_sizes/default.yaml says how), and
    `batching.max_tokens` / `batching.max_sentences` on the command line win over both.
    """

    name: str = "tokens"  # tokens | sentences (for display and sweep reports)
    # Token budget: batch size x longest sentence (max of source and target, EOS included) <= this.
    max_tokens: int | None = 4000
    max_sentences: int | None = None  # at most this many sentences per batch
    # Fixed-sentence batching only: choose max_sentences so that the mean batch size matches
    # what this token budget gives on the training set (null = use max_sentences as written).
    match_max_tokens: int | None = None
    required_batch_size_multiple: int = (
        8  # batch sizes are multiples of this when the budget allows
    )
    max_tokens_valid: int | None = None  # null = max_tokens
    max_sentences_valid: int | None = None  # null = max_sentences
    shuffle: bool = True  # reshuffle the frozen train batches every epoch (seed + epoch)
    # Length order before packing: "fairseq" (source length, then target length: its exact
    # batches) or "snake" (target order reversed on every other source length: fewer padded
    # target tokens, e.g. 95.7% real tokens instead of 93.9% on multi30k at 4000 tokens).
    order: str = "fairseq"
