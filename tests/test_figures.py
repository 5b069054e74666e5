"""seqdiff.figures: the one matplotlib set-up (Agg, one style) and the atomic save."""

from __future__ import annotations

import io

from seqdiff.evaluation.generate import save_figure_atomically
from seqdiff.figures import BACKEND, pyplot, save_figure


def _figure(plt):
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([0, 1, 2], [2.0, 1.0, 1.5], marker="o", label="x")
    ax.legend()
    fig.tight_layout()
    return fig


def test_pyplot_is_agg_and_save_figure_writes_the_same_png_and_closes(tmp_path):
    plt = pyplot()
    import matplotlib

    assert matplotlib.get_backend().lower() == BACKEND.lower()
    fig = _figure(plt)
    direct = io.BytesIO()
    fig.savefig(direct, dpi=110, format="png")  # what the reports did before: fig.savefig(path, dpi=110)
    out = save_figure(fig, tmp_path / "sub" / "a.png")
    assert out.read_bytes() == direct.getvalue()  # the figure's content is unchanged
    assert not plt.fignum_exists(fig.number)  # closed
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["a.png"]  # no .tmp left


def test_the_old_name_still_saves(tmp_path):
    fig = _figure(pyplot())
    save_figure_atomically(fig, tmp_path / "b.png")
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
