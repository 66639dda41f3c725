"""Unknown words at generation: symbols the training vocabulary never saw become `<unk>`, every
line still gets a translation, and ``gen.unk_penalty`` is fairseq's (subtracted from the unknown
word's log-probability at every step, nothing renormalised).

Covered paths: the notebook API (`Translator`, `ConvSeqModule.translate`), `task=interactive`
(in process, the real `run_interactive`), `task=generate` on a data-bin whose test source holds
unknown words, and a sentencepiece model that meets characters it was never trained on.
"""

from __future__ import annotations

import io
import json
import math
import shutil

import pytest
import torch

from convseq.cli.dispatch import dispatch
from convseq.data.databin import DataBin
from convseq.data.dictionary import Dictionary
from convseq.data.subword import text_processing, train_sentencepiece
from convseq.inference.errors import GenerationError
from convseq.inference.translator import Translator
from convseq.search import beam_search, greedy, reference_beam_search
from convseq.tasks.interactive import run_interactive
from convseq.training.module import ConvSeqModule
from tests.generation_utils import generate_config, tiny_checkpoint

UNK, EOS = 3, 2  # fairseq's numbering: <s> 0, <pad> 1, </s> 2, <unk> 3


@pytest.fixture
def tiny_ckpt(tiny_data, tmp_path_factory):
    return tiny_checkpoint(tiny_data, tmp_path_factory.getbasetemp())


def source_lines(tiny_data) -> list[str]:
    return (tiny_data["corpus"] / "test.src").read_text(encoding="utf-8").splitlines()


def unknown_lines(known: str) -> dict[str, str]:
    """Inputs with words the tiny vocabulary never saw (``known``: a sentence it knows)."""
    words = known.split()
    return {
        "an unseen word": " ".join([words[0], "zorblax", *words[1:]]),
        "emoji": "🙂 " + known + " 🚀🚀",
        "other scripts": "日本語 Ελληνικά العربية ไทย",
        "a known word with an unseen letter": " ".join([words[0] + "é", *words[1:]]),
        "a very long word": "x" * 5000,
        "an invisible character": "\u200b",  # not whitespace to str.split: one unknown token
        "unknown words only": "qwxz vbnm",
    }


def expected_ids(line: str, symbols: list[str]) -> list[int]:
    """Whitespace tokens looked up by hand in the dictionary's symbol list; EOS appended."""
    index = {s: i for i, s in enumerate(symbols)}
    return [index.get(w, UNK) for w in line.split()] + [EOS]


def search_one(translator: Translator, ids: list[int], **options) -> list[dict]:
    src = torch.tensor([ids])  # (1, S)
    return beam_search(translator.models[0], src, torch.tensor([len(ids)]), **options)[0]


# ---------------------------------------------------------------------------- the notebook API


def test_unknown_words_become_unk_and_every_line_is_translated(tiny_data, tiny_ckpt, one_thread):
    translator = Translator.from_checkpoints(tiny_ckpt)
    symbols = translator.src_dict.symbols
    known = source_lines(tiny_data)[0]
    assert all(w in symbols for w in known.split())
    cases = unknown_lines(known)
    lines = list(cases.values())

    for name, line in cases.items():
        ids, truncated = translator.encode(line)
        want = expected_ids(line, symbols)
        assert ids.tolist() == want and not truncated, name
        assert UNK in want, name  # each case really holds an unknown symbol

    records = translator.translate_records(lines, beam=3, nbest=2, max_len_b=12)
    assert [r["id"] for r in records] == list(range(len(lines)))
    for line, record in zip(lines, records, strict=True):
        unk_positions = [i for i, t in enumerate(expected_ids(line, symbols)) if t == UNK]
        assert [i for i, s in enumerate(record["src_symbols"]) if s == "<unk>"] == unk_positions
        assert len(record["hypotheses"]) == 2
        # the output is the search over the <unk> ids, detokenised as usual
        alone = search_one(translator, expected_ids(line, symbols), beam=3, nbest=2, max_len_b=12)
        for hyp, ref in zip(record["hypotheses"], alone, strict=True):
            assert hyp["tokens"].tolist() == ref["tokens"].tolist()
            assert hyp["tokens"][-1] == EOS and len(hyp["tokens"]) <= 13
            assert hyp["text"] == translator.decode(hyp["tokens"].tolist())
            assert hyp["attention"].shape == (len(record["src_symbols"]), len(hyp["tokens"]))

    # to the model every unknown word is the same symbol: these three are one input
    words = known.split()
    same = [" ".join([words[0], w, *words[1:]]) for w in ("zorblax", "日本語", "<unk>")]
    out = translator.translate(same, beam=3, max_len_b=12)
    assert out[0] == out[1] == out[2]

    # the module API (what a notebook calls) gives the same texts
    module = ConvSeqModule.load_from_checkpoint(str(tiny_ckpt))
    assert module.translate(lines, beam=3, max_len_b=12) == [
        r["hypotheses"][0]["text"]
        for r in translator.translate_records(lines, beam=3, max_len_b=12)
    ]


def test_a_line_empty_after_normalisation_is_translated_from_its_eos(tiny_ckpt, one_thread):
    translator = Translator.from_checkpoints(tiny_ckpt)
    for line in ("", "\u3000", " \t\u2028\u00a0 "):  # Python's whitespace, Unicode's too
        ids, _ = translator.encode(line)
        assert ids.tolist() == [EOS]
    out = translator.translate_records(["\u3000", "the"], beam=2, max_len_b=6)
    assert out[0]["src_symbols"] == ["</s>"]
    assert out[0]["hypotheses"][0]["tokens"].tolist() == (
        search_one(translator, [EOS], beam=2, max_len_b=6)[0]["tokens"].tolist()
    )


# ---------------------------------------------------------------------------- gen.unk_penalty


def unk_loving(tiny_ckpt, bias: float = 4.0) -> Translator:
    """The tiny model with its <unk> logit raised: without a penalty, it writes <unk> often."""
    translator = Translator.from_checkpoints(tiny_ckpt)
    with torch.no_grad():
        translator.models[0].decoder.fc3.bias[UNK] += bias
    return translator


def teacher_forced_lprobs(
    model: torch.nn.Module, src: list[int], tokens: list[int]
) -> torch.Tensor:
    """(L,) the model's log-prob of each output token, from one full forward pass."""
    prev = torch.tensor([[EOS, *tokens[:-1]]])  # (1, L) EOS first
    model.eval()
    with torch.no_grad():
        logits, _ = model(torch.tensor([src]), torch.tensor([len(src)]), prev)  # (1, L, V)
        lprobs = torch.log_softmax(logits.float(), dim=-1)[0]  # (L, V)
    return lprobs.gather(1, torch.tensor(tokens)[:, None])[:, 0]  # (L,)


def test_unk_penalty_is_subtracted_from_the_unknown_words_log_prob(
    tiny_data, tiny_ckpt, one_thread
):
    translator = unk_loving(tiny_ckpt)
    lines = source_lines(tiny_data)[:4]
    opts = {"beam": 4, "nbest": 4, "max_len_b": 10}

    def unks(penalty: float) -> tuple[int, list[dict]]:
        records = translator.translate_records(lines, unk_penalty=penalty, **opts)
        hyps = [h for r in records for h in r["hypotheses"]]
        return sum(h["tokens"].tolist().count(UNK) for h in hyps), records

    counts = {p: unks(p)[0] for p in (0.0, 1.5, 3.0, 1e4, math.inf)}
    # a positive penalty gives fewer <unk>s; a large one, or inf, none at all
    assert counts[0.0] > counts[1.5] > 0
    assert counts[3.0] <= counts[1.5] and counts[1e4] == counts[math.inf] == 0
    forbidden = [[h["tokens"].tolist() for h in r["hypotheses"]] for r in unks(math.inf)[1]]
    assert [[h["tokens"].tolist() for h in r["hypotheses"]] for r in unks(1e4)[1]] == forbidden

    # each token's score is the model's log-prob, minus the penalty where it is <unk>
    penalty = 1.5
    records = unks(penalty)[1]
    model = translator.models[0]
    checked_unks = 0
    for record in records:
        src = [translator.src_dict.index(s) for s in record["src_symbols"]]
        for hyp in record["hypotheses"]:
            tokens = hyp["tokens"].tolist()
            is_unk = torch.tensor([t == UNK for t in tokens], dtype=torch.float32)  # (L,)
            want = teacher_forced_lprobs(model, src, tokens) - penalty * is_unk
            assert torch.allclose(hyp["positional_scores"], want, atol=1e-4), tokens
            assert hyp["score"] == pytest.approx(float(want.sum()) / len(tokens), abs=1e-4)
            checked_unks += int(is_unk.sum())
    assert checked_unks > 0

    # the reference search and greedy decoding apply the same rule
    ids = src  # the last sentence
    src_t, len_t = torch.tensor([ids]), torch.tensor([len(ids)])
    fast = beam_search(model, src_t, len_t, beam=4, nbest=4, max_len_b=10, unk_penalty=penalty)
    ref = reference_beam_search(
        model, src_t, len_t, beam=4, nbest=4, max_len_b=10, unk_penalty=penalty
    )
    assert [h["tokens"].tolist() for h in fast[0]] == [h["tokens"].tolist() for h in ref[0]]
    assert [h["score"] for h in fast[0]] == pytest.approx([h["score"] for h in ref[0]], abs=1e-4)
    one = beam_search(model, src_t, len_t, beam=1, max_len_b=10, unk_penalty=penalty)[0][0]
    argmax = greedy(model, src_t, len_t, max_len_b=10, unk_penalty=penalty)[0][0]
    assert one["tokens"].tolist() == argmax["tokens"].tolist()


def test_a_very_negative_unk_penalty_writes_unk_until_the_length_limit(tiny_ckpt, one_thread):
    translator = Translator.from_checkpoints(tiny_ckpt)  # the plain model, no bias
    records = translator.translate_records(
        ["the", "zorblax 🙂"], beam=3, nbest=3, max_len_b=7, unk_penalty=-1e4
    )
    for record in records:
        best = record["hypotheses"][0]
        # <unk> (raised by 1e4) beats everything until EOS is forced at the limit
        assert best["tokens"].tolist() == [UNK] * 7 + [EOS]
        assert math.isfinite(best["score"]) and best["score"] > 7 * 1e4 / 8 - 100
        assert best["text"] == " ".join(["<unk>"] * 7)
        for hyp in record["hypotheses"][1:]:  # the runners-up swap at most one <unk>
            tokens = hyp["tokens"].tolist()
            assert tokens[-1] == EOS and sum(t != UNK for t in tokens[:-1]) <= 1
            assert math.isfinite(hyp["score"]) and hyp["score"] <= best["score"]


def test_a_nan_or_minus_inf_unk_penalty_is_refused_by_name(tiny_data, tiny_ckpt, tmp_path, capsys):
    translator = Translator.from_checkpoints(tiny_ckpt)
    model = translator.models[0]
    src, lengths = torch.tensor([[5, 6, EOS]]), torch.tensor([3])
    for bad in (math.nan, -math.inf):
        for search in (beam_search, reference_beam_search, greedy):
            with pytest.raises(ValueError, match=r"unk_penalty: must be a finite number"):
                search(model, src, lengths, unk_penalty=bad)
        with pytest.raises(GenerationError, match=r"generation settings \(gen\.\*\): unk_penalty"):
            translator.translate(["the"], unk_penalty=bad)
    # through run.py's dispatch: one clear line, exit status 2
    with pytest.raises(SystemExit) as exit_info:
        dispatch(generate_config(tiny_data, tmp_path, f"ckpt={tiny_ckpt}", "gen.unk_penalty=nan"))
    assert exit_info.value.code == 2
    assert "unk_penalty: must be a finite number" in capsys.readouterr().err


# ---------------------------------------------------------------------------- task=interactive


def test_interactive_translates_lines_of_unknown_words(tiny_data, tiny_ckpt, tmp_path, one_thread):
    known = source_lines(tiny_data)[1]
    lines = [known, *unknown_lines(known).values(), "\u3000", known]
    expected = Translator.from_checkpoints(tiny_ckpt).translate(lines, max_len_b=12)
    stdin = io.BytesIO("".join(line + "\n" for line in lines).encode("utf-8"))
    stdout, stderr = io.StringIO(), io.StringIO()
    cfg = generate_config(tiny_data, tmp_path, "task=interactive", f"ckpt={tiny_ckpt}")
    read, translated = run_interactive(cfg, stdin=stdin, stdout=stdout, stderr=stderr)

    answers = stdout.getvalue().split("\n")
    assert answers[-1] == "" and len(answers) - 1 == len(lines) == read
    blank = len(lines) - 2  # the ideographic space: empty once stripped
    assert answers[:-1] == [("" if i == blank else e) for i, e in enumerate(expected)]
    assert translated == len(lines) - 1 and all(answers[:blank] + answers[blank + 1 : -1])
    messages = [m for m in stderr.getvalue().splitlines() if m.startswith("convseq: line")]
    assert messages == [f"convseq: line {blank + 1}: empty, nothing to translate"]


# ---------------------------------------------------------------------------- task=generate


def test_generate_on_a_data_bin_whose_test_source_has_unknown_words(
    tiny_data, tiny_ckpt, tmp_path, one_thread
):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("train.src", "train.tgt", "valid.src", "valid.tgt", "test.tgt"):
        shutil.copy(tiny_data["corpus"] / name, corpus / name)
    sources = source_lines(tiny_data)
    replaced = [*unknown_lines(sources[0]).values(), "\u3000"]
    sources[: len(replaced)] = replaced
    (corpus / "test.src").write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    tiny = {"corpus": corpus, "cache": tmp_path / "cache"}

    out = tmp_path / "gen"
    result = dispatch(generate_config(tiny, out, f"ckpt={tiny_ckpt}", "gen.beam=3"))

    translator = Translator.from_checkpoints(tiny_ckpt)
    databin = DataBin(next((tmp_path / "cache" / "databin").iterdir()))
    # the data-bin's dictionaries are the model's, so its binarised split was translated
    assert databin.src_dict == translator.src_dict
    symbols = translator.src_dict.symbols
    n_unk = sum(expected_ids(s, symbols).count(UNK) for s in sources)
    assert n_unk >= len(replaced) - 1
    meta = json.loads((databin.path / "meta.json").read_text())
    assert meta["splits"]["test"]["src"]["unk"] == n_unk

    hyps = (out / "generate-test.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert len(hyps) == len(sources) == result["sentences"]
    assert hyps == translator.translate(sources, beam=3, max_len_b=12)  # the raw-text path
    s_lines = [
        ln.split("\t", 1)[1]
        for ln in (out / "generate-test.nbest.txt").read_text(encoding="utf-8").splitlines()
        if ln.startswith("S-")
    ]
    for line, shown in zip(sources, s_lines, strict=True):
        assert shown.split() == [symbols[i] for i in expected_ids(line, symbols)[:-1]]
    assert s_lines[2].split() == ["<unk>"] * 4 and s_lines[len(replaced) - 1] == ""


# ---------------------------------------------------------------------------- sentencepiece


def test_sentencepiece_unseen_characters_become_unk_pieces(tmp_path, one_thread):
    sentences = [f"the quick brown fox number {i} jumps over lazy dogs" for i in range(200)]
    spm = train_sentencepiece(sentences, tmp_path / "spm.model", "bpe", vocab_size=60)
    vocab = Dictionary()
    for piece in sorted({p for s in sentences for p in spm.segment(s)}):
        vocab.add_symbol(piece)
    model_cfg = {
        "encoder_embed_dim": 16,
        "decoder_embed_dim": 16,
        "decoder_out_embed_dim": 16,
        "encoder_layers": [[16, 3]],
        "decoder_layers": [[16, 3]],
    }
    torch.manual_seed(0)
    module = ConvSeqModule(model_cfg, vocab.to_list(), vocab.to_list())
    module.text_processing = text_processing("en", "xx", spm, spm)
    translator = module.translator()

    lines = {
        "emoji": "the 🙂 fox",
        "other script": "日本語 fox",
        "a word of seen pieces": "brownfox lazydogs",
        "a long word of unseen characters": "ж" * 3000,
        "empty after normalisation": "\u200b\u200b",  # sentencepiece drops zero-width spaces
    }
    for name, line in lines.items():
        pieces = spm.segment(line)
        ids, truncated = translator.encode(line)
        want = [vocab.symbols.index(p) if p in vocab.symbols else UNK for p in pieces] + [EOS]
        assert ids.tolist() == want and not truncated, name
    assert UNK in translator.encode(lines["emoji"])[0] and UNK in translator.encode("日本語")[0]
    assert UNK not in translator.encode(lines["a word of seen pieces"])[0]
    assert translator.encode(lines["empty after normalisation"])[0].tolist() == [EOS]

    records = translator.translate_records(list(lines.values()), beam=2, max_len_b=6)
    assert len(records) == len(lines) and all(r["hypotheses"] for r in records)
    # an <unk> written by the model is detokenised by sentencepiece like any other piece
    boosted = translator.translate_records(["the 🙂 fox"], beam=2, max_len_b=3, unk_penalty=-1e4)
    hyp = boosted[0]["hypotheses"][0]
    assert hyp["symbols"] == ["<unk>"] * 3 + ["</s>"]
    assert hyp["text"] == spm.detokenize(["<unk>"] * 3) and "\u2581" not in hyp["text"]
