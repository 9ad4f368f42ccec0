"""One colour per scheme, everywhere in the course (plots and widgets), and
the tick labels' numbers as the edition writes them."""

from matplotlib.figure import Figure
from matplotlib.ticker import ScalarFormatter

from course_lib.core.edition import current, marks

COLORS = {
    "global_token": "#1b7837",     # the course's rule: W * S_r / N (green)
    "mean_of_means": "#c51b7d",    # the negative control (magenta)
    "reference": "#4d4d4d",        # single-process reference (grey)
    "tolerance": "#9ecae1",        # allclose envelope (light blue)
    "stop": "#2166ac",             # stopped run (blue)
    "continuous": "#4d4d4d",       # continuous control run (grey)
    "resume": "#f4a582",           # resumed run (orange)
    "untrained": "#b2182b",        # untrained model (red)
    "floor": "#000000",            # entropy floor (black)
}
RANK_COLORS = ["#2166ac", "#b2182b", "#5aae61", "#8073ac",
               "#e08214", "#35978f", "#bf812d", "#762a83"]
LABELS = {
    "global_token": "global token mean (W·S_r/N)",
    "mean_of_means": "mean of means",
    "reference": "single-process reference",
}


def rank_color(rank: int) -> str:
    return RANK_COLORS[rank % len(RANK_COLORS)]



class _EditionTicks(ScalarFormatter):
    """Matplotlib's own tick labels, with the edition's decimal mark."""

    def __call__(self, x, pos=None):
        return marks(super().__call__(x, pos))


def in_edition(fig: Figure) -> Figure:
    """``fig`` with its linear axes' numbers in the edition's marks (0,5 in
    French); log axes write powers of ten, and named ticks keep their names."""
    if current() != "fr":
        return fig
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            if type(axis.get_major_formatter()) is ScalarFormatter:
                axis.set_major_formatter(_EditionTicks())
    return fig
