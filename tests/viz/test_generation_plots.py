"""Generation plots: attention heatmaps (gen.plot_attention=N) and the time breakdown chart
(gen.profile=true), from the data behind them to the PNG files a generate run writes."""

from __future__ import annotations

import contextlib
import io
import re
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

import convseq.viz.time_breakdown as profile_plot
from convseq.data.databin import DataBin
from convseq.errors import ConvseqError
from convseq.inference.errors import GenerationError
from convseq.inference.options import GenConfig
from convseq.inference.profiler import GenerationProfiler
from convseq.inference.translator import Translator
from convseq.search import beam_search
from convseq.tasks.generate import run_generate
from convseq.viz.attention import AttentionMap, attention_map, draw_attention, write_attention_plots
from tests.conftest import compose_config
from tests.generation_utils import generate_config, tiny_checkpoint

N_PLOTS = 3
SEARCH = {"beam": 5, "max_len_b": 12}  # generate_config's FAST_GEN, default beam


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's header; fails unless the file starts like a PNG."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", path
    return struct.unpack(">II", head[16:24])


def assert_real_png(path: Path, min_width: int, min_height: int) -> None:
    """A decodable PNG of at least this size that is not one flat colour."""
    from matplotlib.image import imread

    width, height = png_size(path)
    assert width >= min_width and height >= min_height, (path, width, height)
    assert path.stat().st_size > 5_000
    pixels = imread(path)  # (H, W, 4) floats: the whole file decodes
    assert pixels.shape[:2] == (height, width)
    assert pixels[..., :3].std() > 0.05  # something was drawn


@pytest.fixture(scope="module")
def tiny_ckpt(tiny_data, tmp_path_factory) -> Path:
    return tiny_checkpoint(tiny_data, tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def generated(tiny_data, tiny_ckpt, tmp_path_factory) -> dict:
    """One task=generate run with both plots; the profile chart's Figure is kept for reading."""
    out = tmp_path_factory.mktemp("generation_plots")
    figures = []
    draw = profile_plot.draw_time_breakdown

    def keep(*args, **kwargs):
        fig = draw(*args, **kwargs)
        figures.append(fig)
        return fig

    stdout = io.StringIO()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(stdout):
            mp.setattr(profile_plot, "draw_time_breakdown", keep)
            cfg = generate_config(
                tiny_data,
                out,
                f"ckpt={tiny_ckpt}",
                f"gen.plot_attention={N_PLOTS}",
                "gen.profile=true",
            )
            result = run_generate(cfg)
    finally:
        torch.set_num_threads(threads)
    return {"out": out, "result": result, "stdout": stdout.getvalue(), "figures": figures}


@pytest.fixture(scope="module")
def first_records(tiny_data, tiny_ckpt) -> list[dict]:
    """Translation records of the first sentences of the test split, as generate makes them."""
    translator = Translator.from_checkpoints(tiny_ckpt)
    src, _ = DataBin(tiny_data["databin"]).split("test")
    encoded = [np.asarray(src[i]) for i in range(N_PLOTS + 1)]
    return translator.translate_encoded(encoded, None, None, GenConfig(**SEARCH))


def nbest_lines(path: Path, tag: str) -> dict[int, str]:
    """The ``TAG-i`` lines of an n-best file (first of each sentence), by sentence."""
    found: dict[int, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        m = re.match(rf"{tag}-(\d+)\t(.*)$", line)
        if m and int(m.group(1)) not in found:
            found[int(m.group(1))] = m.group(2)
    return found


# ---------------------------------------------------------------------------- the data


def test_attention_map_is_the_search_attention_of_the_best_hypothesis(
    tiny_data, tiny_ckpt, first_records
):
    translator = Translator.from_checkpoints(tiny_ckpt)
    src, _ = DataBin(tiny_data["databin"]).split("test")
    for i, record in enumerate(first_records[:N_PLOTS]):
        amap = attention_map(record)
        ids = torch.as_tensor(np.asarray(src[i]), dtype=torch.long)  # (S,) ending in EOS
        best = beam_search(translator.models[0], ids[None], torch.tensor([len(ids)]), **SEARCH)
        attention = best[0][0]["attention"]  # (src_len, L)
        tokens = best[0][0]["tokens"].tolist()
        assert amap.index == i
        assert amap.weights.shape == (len(tokens), len(ids))  # (target + EOS, source + EOS)
        np.testing.assert_allclose(amap.weights, attention.numpy().T, rtol=0, atol=1e-6)
        assert amap.source == [translator.src_dict[t] for t in ids.tolist()]
        assert amap.target == [translator.tgt_dict[t] for t in tokens]
        assert amap.source[-1] == amap.target[-1] == translator.tgt_dict[translator.tgt_dict.eos()]
        # each output token's attention is a distribution over the source
        np.testing.assert_allclose(amap.weights.sum(1), 1.0, atol=1e-4)


def test_attention_map_refuses_a_record_without_attention(first_records):
    record = dict(first_records[0])
    record["hypotheses"] = [dict(record["hypotheses"][0], attention=None)]
    with pytest.raises(ConvseqError, match="gen.need_attn=true"):
        attention_map(record)
    bad = dict(first_records[0])
    hyp = record["hypotheses"][0]
    bad["hypotheses"] = [dict(hyp, attention=first_records[0]["hypotheses"][0]["attention"][1:])]
    with pytest.raises(ConvseqError, match="attention of shape"):
        attention_map(bad)


# ---------------------------------------------------------------------------- the drawing


def test_heatmap_draws_the_matrix_with_the_pieces_as_tick_labels():
    weights = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.05, 0.05, 0.9], [0.2, 0.2, 0.6]])
    source = ["$5", "▁Haus", "</s>"]  # "$" must stay text, not start mathtext
    target = ["ein", "▁hau@@", "se", "</s>"]
    fig = draw_attention(AttentionMap(7, weights, source, target))
    ax, cbar = fig.axes  # the heatmap and its colour bar
    np.testing.assert_array_equal(ax.images[0].get_array(), weights)
    assert [t.get_text() for t in ax.get_xticklabels()] == source
    assert [t.get_text() for t in ax.get_yticklabels()] == target
    assert all(t.get_rotation() == 60 for t in ax.get_xticklabels())
    assert "sentence 7" in ax.get_title()
    assert "attention" in cbar.get_ylabel()
    fig.canvas.draw()  # renders (a "$" piece would fail here if it were parsed as math)


def test_write_attention_plots_writes_one_png_per_record_up_to_n(first_records, tmp_path):
    paths = write_attention_plots(first_records, tmp_path / "a", "valid", 2)
    assert [p.name for p in paths] == ["attention-valid-0.png", "attention-valid-1.png"]
    everything = write_attention_plots(first_records, tmp_path / "b", "valid", 100)
    assert len(everything) == len(first_records)
    assert write_attention_plots(first_records, tmp_path / "c", "valid", 0) == []
    assert not (tmp_path / "c").exists()


# ---------------------------------------------------------------------------- task=generate


def test_generate_writes_heatmaps_of_the_first_sentences_matching_the_nbest_file(
    generated, first_records
):
    out = generated["out"]
    pngs = [out / f"attention-test-{i}.png" for i in range(N_PLOTS)]
    assert generated["result"]["attention_plots"] == [str(p) for p in pngs]
    assert not (out / f"attention-test-{N_PLOTS}.png").exists()
    assert f"attention heatmap(s) written to {out}/attention-test-*.png" in generated["stdout"]
    nbest = out / "generate-test.nbest.txt"
    sources, hyps, aligns = (nbest_lines(nbest, tag) for tag in ("S", "H", "A"))
    for i, png in enumerate(pngs):
        amap = attention_map(first_records[i])
        # the heatmap's rows are the generate run's hypothesis: its pieces and A- alignment
        assert amap.source[:-1] == sources[i].split()
        assert amap.target[:-1] == hyps[i].split("\t")[1].split()
        assert amap.weights.argmax(1).tolist() == [int(a) for a in aligns[i].split()]
        rows, cols = amap.weights.shape
        assert_real_png(png, int(100 * (0.32 * cols + 2.5)) - 1, int(100 * 3.5) - 1)


def test_plot_attention_with_need_attn_off_fails_naming_both_keys(tiny_data, tiny_ckpt, tmp_path):
    cfg = generate_config(
        tiny_data, tmp_path, f"ckpt={tiny_ckpt}", "gen.plot_attention=2", "gen.need_attn=false"
    )
    with pytest.raises(GenerationError, match=r"gen\.plot_attention=2.*gen\.need_attn=true"):
        run_generate(cfg)
    cfg = generate_config(tiny_data, tmp_path, f"ckpt={tiny_ckpt}", "gen.plot_attention=-1")
    with pytest.raises(GenerationError, match=r"gen\.plot_attention=-1"):
        run_generate(cfg)
    assert not list(tmp_path.glob("generate-*"))  # refused before translating anything


def test_plot_attention_is_in_the_schema_and_off_by_default():
    assert compose_config([]).gen.plot_attention == 0
    assert compose_config(["gen.plot_attention=4"]).gen.plot_attention == 4
    with pytest.raises(Exception, match="plot_attention"):
        compose_config(["gen.plot_attention=many"])


# ---------------------------------------------------------------------------- time breakdown


def table_rows(table: str) -> list[tuple[str, float, float]]:
    """(label, seconds, %) of each row of a printed breakdown table (wall time excluded)."""
    rows = []
    for line in table.splitlines()[2:]:
        m = re.match(r"^(.*?)\s+(-?\d+\.\d{3})\s+(-?\d+\.\d)$", line)
        assert m, line
        rows.append((m.group(1).strip(), float(m.group(2)), float(m.group(3))))
    assert rows[-1][0] == "wall time"
    return rows[:-1]


def chart_rows(fig) -> list[tuple[str, float, str]]:
    """(label, bar length, bar label) of each bar of a breakdown chart, top to bottom."""
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    bars = sorted(ax.patches, key=lambda p: p.get_y())  # y grows downwards (inverted axis)
    texts = [t.get_text() for t in ax.texts]  # bar_label's texts, in bar order
    return [(lab, bar.get_width(), txt) for lab, bar, txt in zip(labels, bars, texts, strict=True)]


def test_profile_chart_bars_are_the_printed_table(generated):
    out, stdout = generated["out"], generated["stdout"]
    png = out / "generate-test.profile.png"
    assert f"time breakdown chart written to {png}" in stdout
    assert generated["result"]["profile_chart"] == str(png)
    assert_real_png(png, 900, 400)
    (fig,) = generated["figures"]
    colours = [bar.get_facecolor() for bar in sorted(fig.axes[0].patches, key=lambda p: p.get_y())]
    assert len(set(colours)) == 2 and colours[0] != colours[3]  # decoder sub-rows stand apart
    lines = stdout[stdout.index("Where the time goes (generate)") :].splitlines()
    end = next(i for i, line in enumerate(lines) if line.startswith("wall time"))
    table = "\n".join(lines[: end + 1])
    want, got = table_rows(table), chart_rows(fig)
    assert [w[0] for w in want] == [g[0] for g in got]
    assert len(got) >= 15  # every part, the decoder's five sub-rows, "not attributed"
    for (label, secs, pct), (_, width, text) in zip(want, got):
        assert width == pytest.approx(max(secs, 0.0), abs=6e-4), label  # the table rounds to ms
        assert text == f"{pct:.1f}%", label
    wall = generated["result"]["profile"]["wall_seconds"]
    assert f"{wall:.3f} s" in fig.axes[0].get_title()


def test_profile_chart_of_known_figures():
    profiler = GenerationProfiler([])
    profiler.timer.seconds.update({"data": 0.5, "encoder": 1.0, "decoder": 2.0, "scoring": 0.25})
    profiler.wall = 4.0
    rows = profiler.rows()
    fig = profile_plot.draw_time_breakdown(rows, profiler.wall)
    got = {label: (width, text) for label, width, text in chart_rows(fig)}
    assert got["encoder"] == (1.0, "25.0%")
    assert got["decoder (incl. log-softmax)"] == (2.0, "50.0%")
    assert got["scoring (sacreBLEU)"] == (0.25, "6.2%")
    assert got["not attributed"] == (pytest.approx(0.25), "6.2%")
    table = table_rows(profiler.table())
    assert [(label, round(width, 3)) for label, width, _ in chart_rows(fig)] == [
        (label, secs) for label, secs, _ in table
    ]
