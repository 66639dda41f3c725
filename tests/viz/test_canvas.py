"""The figure helpers every convseq figure shares: the Agg figure, the lr curve, the finish."""

from __future__ import annotations

from convseq.viz.canvas import finish_figure, new_figure, plot_lr


def test_new_figure_is_an_agg_figure_of_the_asked_size():
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = new_figure(6, 2.5)
    assert isinstance(fig.canvas, FigureCanvasAgg)
    assert tuple(fig.get_size_inches()) == (6, 2.5) and fig.dpi == 100


def test_plot_lr_draws_the_positive_points_only():
    ax = new_figure(4, 3).subplots()
    assert plot_lr(ax, [1, 2, 3, 4], [0.25, 0.0, 0.025, -1.0], color="red")
    (line,) = ax.lines
    assert list(line.get_xdata()) == [1, 3] and list(line.get_ydata()) == [0.25, 0.025]
    assert line.get_color() == "red" and line.get_marker() == "o"
    assert not plot_lr(ax, [1, 2], [0.0, -0.5])  # nothing a log axis can show


def test_finish_figure_adds_the_legend_and_title_when_asked():
    fig = new_figure(4, 3)
    ax = fig.subplots()
    ax.plot([0, 1], [1, 2], label="run a")
    assert finish_figure(fig, ax, "a title") is fig
    assert ax.get_legend() is not None and fig._suptitle.get_text() == "a title"
    bare = new_figure(4, 3)
    bare_ax = bare.subplots()
    finish_figure(bare, None, "")
    assert bare_ax.get_legend() is None and bare._suptitle is None
