"""The capstone's figures."""
import pytest
from matplotlib.figure import Figure

from ptinternals.viz.gpt import plot_loss_curve, plot_tokens_per_second


def test_loss_curve_and_throughput_figures():
    history = {"iter": list(range(50)), "loss": [4.0 - i * 0.04 for i in range(50)], "eval_iter": [0, 25, 50],
               "train_loss": [4.2, 3.0, 2.1], "val_loss": [4.2, 3.1, 2.2]}
    fig = plot_loss_curve(history, tokens_per_iter=2048, baselines={"bigram": 2.48})
    assert isinstance(fig, Figure) and fig.axes[0].get_xlabel() == "iteration"
    assert isinstance(plot_tokens_per_second({"eager": 1e5, "kernels": 1.2e5}), Figure)
    with pytest.raises(ValueError, match="missing"):
        plot_loss_curve({"iter": []})
    with pytest.raises(TypeError):
        plot_loss_curve([1, 2])
    with pytest.raises(ValueError, match="tokens_per_iter"):
        plot_loss_curve(history, tokens_per_iter=0)
    with pytest.raises(ValueError, match="non-empty"):
        plot_tokens_per_second({})
