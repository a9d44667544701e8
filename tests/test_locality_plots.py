"""Tests for convit_edu.locality's Figs. 5 and 6: drawn against epochs (the default) or optimiser steps."""

import pytest

from convit_edu.locality import plot_gate_history, plot_nonlocality_history

RECORDS = [{"step": s, "epoch": s / 10, "gates": [[0.7, 0.6], [0.5, 0.4]], "nonlocality": [[1.0, 2.0]] * 3}
           for s in (0, 10, 20)]


@pytest.mark.parametrize("x, label, values", [("epoch", "epochs", [0, 1, 2]), ("step", "optimiser steps", [0, 10, 20])])
def test_locality_plots_draw_against_epochs_or_steps(x, label, values):
    for fig in (plot_nonlocality_history({"ConViT": RECORDS}, x=x), plot_gate_history(RECORDS, x=x)):
        ax = fig.axes[0]
        assert ax.get_xlabel() == label
        assert list(ax.lines[0].get_xdata()) == values


def test_locality_plots_default_to_epochs_and_reject_another_axis():
    assert plot_gate_history(RECORDS).axes[0].get_xlabel() == "epochs"
    with pytest.raises(ValueError, match="x"):
        plot_nonlocality_history({"ConViT": RECORDS}, x="time")
    with pytest.raises(ValueError, match="x"):
        plot_gate_history(RECORDS, x="time")
