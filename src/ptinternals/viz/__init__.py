"""Figures for the notebooks and the static book: matplotlib only (renders offline as PNG).

One module per kind of picture: ``storage`` (which storage cells a view touches), ``graph``
(autograd graphs), ``dispatch`` (dispatch paths), ``memory`` (allocator timelines and segment maps),
``floats`` (bit layouts), ``ring`` (collectives), ``roofline`` (kernels), ``training`` (loss curves),
``modules`` (module trees and hook timelines).
Every drawing function returns a ``matplotlib.figure.Figure`` and never calls ``plt.show()``.

Importing this package in IPython registers a PNG formatter for ``Figure``, so a figure returned as a
cell's last value displays (in JupyterLab and in the built book) without importing pyplot.
"""


def _register_png_formatter() -> None:
    try:
        from IPython import get_ipython
    except ImportError:
        return
    ip = get_ipython()
    if ip is None:
        return
    from matplotlib.figure import Figure

    def to_png(fig: Figure) -> bytes:
        from io import BytesIO

        buf = BytesIO()
        fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
        return buf.getvalue()

    ip.display_formatter.formatters["image/png"].for_type(Figure, to_png)


_register_png_formatter()
