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


def test_position_similarity_is_the_cosine_of_each_patchs_embedding_without_the_class_token_slot():
    import torch

    from convit_edu.attention_maps import position_similarity
    from convit_edu.zoo import create_model

    for name in ("deit_tiny", "convit_tiny"):  # the DeiT's pos_embed has its class token's slot first
        model = create_model(name, img_size=16, patch_size=4, embed_dim=16, num_heads=4, depth=2, num_classes=3,
                             **({"local_up_to_layer": 1} if name == "convit_tiny" else {}))
        slots = model.pos_embed.shape[1] - 16
        with torch.no_grad():
            model.pos_embed.zero_()
            model.pos_embed[0, slots:, :16] = torch.eye(16)  # every patch its own direction
            model.pos_embed[0, slots + 5, :] += model.pos_embed[0, slots + 6, :]  # patch (1, 1) leans to (1, 2)
        sim = position_similarity(model)
        assert sim.shape == (4, 4, 4, 4) and torch.allclose(sim[0, 0], torch.eye(16)[0].view(4, 4))
        assert abs(sim[1, 1, 1, 2].item() - 2**-0.5) < 1e-6 and abs(sim[1, 2, 1, 1].item() - 2**-0.5) < 1e-6
