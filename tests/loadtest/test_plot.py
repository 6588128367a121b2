"""The sweep plot keeps every point's concurrency label inside its panel, the highest throughput's included."""
from __future__ import annotations

import pytest

from seqserve.loadtest.plot import sweep_figure

pytest.importorskip("matplotlib")


@pytest.mark.parametrize("points", [
    [(1, 400, 20, 30), (2, 700, 25, 40), (4, 900, 40, 80)],  # the knee: the last point is the top right corner
    [(1, 900, 20, 30), (2, 700, 25, 40), (4, 400, 40, 80), (8, 380, 90, 160), (16, 370, 200, 400)],  # overload
    [(1, 500, 20, 30)],
])
def test_every_label_is_inside_its_panel(points):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    rows = [{"users": u, "generated_tokens_per_s": t, "requests_per_s": t / 10, "p50_ms": p50, "p99_ms": p99}
            for u, t, p50, p99 in points]
    fig = sweep_figure(rows, "seqserve capacity: 127.0.0.1:50051, 10 s per step")
    canvas = FigureCanvasAgg(fig)
    canvas.draw()  # the extents below are the rendered ones, as savefig draws them
    renderer = canvas.get_renderer()
    labels = 0
    for ax in fig.axes:
        panel = ax.get_window_extent(renderer)
        for text in ax.texts:
            box = text.get_window_extent(renderer)
            assert panel.x0 <= box.x0 and box.x1 <= panel.x1 and panel.y0 <= box.y0 and box.y1 <= panel.y1, \
                (text.get_text(), box, panel)
            labels += 1
    assert labels == 2 * len(rows)


def test_the_legend_lies_outside_both_panels():
    """A legend inside a panel covered the "1 user" label and its p99 point when that point was high on the left."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    rows = [{"users": u, "generated_tokens_per_s": t, "requests_per_s": t / 10, "p50_ms": p50, "p99_ms": p99}
            for u, t, p50, p99 in [(1, 300, 250, 330), (2, 700, 25, 40), (4, 900, 40, 80)]]
    fig = sweep_figure(rows, "seqserve capacity")
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    legends = fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    assert [t.get_text() for t in legends[0].get_texts()] == ["p50", "p99"] and len(legends) == 1
    box = legends[0].get_window_extent(renderer)
    for ax in fig.axes:
        panel = ax.get_window_extent(renderer)
        assert box.y1 <= panel.y0 or box.y0 >= panel.y1 or box.x1 <= panel.x0 or box.x0 >= panel.x1, (box, panel)
