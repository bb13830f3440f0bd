"""viz/dispatch.py: figures build offline and reject bad input."""
import io

import pytest
from matplotlib.figure import Figure

from ptinternals.dispatch import explain_dispatch, tensor_key_set
from ptinternals.viz.dispatch import draw_dispatch_path, draw_key_set, key_category


def test_dispatch_path_figure():
    steps = explain_dispatch("aten::mm", "cpu", "cpu", autocast="cpu", modes=["python"])
    fig = draw_dispatch_path(steps, "aten.mm under autocast and a mode")
    assert isinstance(fig, Figure)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert [t for t in texts if t in {s.key for s in steps}] == [s.key for s in steps]
    fig.savefig(io.BytesIO(), format="png")
    assert isinstance(draw_dispatch_path(["AutogradCPU", "CPU"]), Figure)


def test_key_set_figure():
    fig = draw_key_set(tensor_key_set("cpu", python=True))
    assert "PythonTLSSnapshot" in fig.axes[0].get_title()
    fig.savefig(io.BytesIO(), format="png")
    assert isinstance(draw_key_set("DispatchKeySet(CPU, AutogradCPU)"), Figure)


def test_categories_and_errors():
    keys = ("Python", "AutocastCUDA", "AutogradMeta", "Functionalize", "BackendSelect", "Meta")
    assert [key_category(k) for k in keys] == ["python", "autocast", "autograd", "functionalize", "select",
                                               "backend"]
    with pytest.raises(ValueError, match="empty"):
        draw_dispatch_path([])
    with pytest.raises(TypeError, match=r"steps\[0\]"):
        draw_dispatch_path([3])
    with pytest.raises(TypeError, match="key must be"):
        key_category(None)
