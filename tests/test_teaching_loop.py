"""Tests of convit_edu.teaching_loop, the core path's minimal training loop: its schedule and parameter groups (which the
production loop uses too), loss_and_accuracy scores predictions we control, and fit learns a tiny problem."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.data import DataLoader, TensorDataset

from convit_edu import optimisation
from convit_edu.config import TrainConfig
from convit_edu.teaching_loop import fit, loss_and_accuracy, param_groups
from convit_edu.schedule import deit_lr
from convit_edu.zoo import create_model

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = dict(img_size=16, patch_size=4, embed_dim=16, num_heads=4, depth=2, num_classes=3)


def test_deit_lr_at_hand_computed_landmarks():
    schedule = dict(total_steps=100, warmup_steps=10, peak_lr=1e-3, min_lr=1e-5, warmup_lr=1e-6)
    assert deit_lr(0, **schedule) == 1e-6
    assert math.isclose(deit_lr(10, **schedule), 1e-3)
    assert math.isclose(deit_lr(55, **schedule), (1e-3 + 1e-5) / 2)
    assert math.isclose(deit_lr(100, **schedule), 1e-5) and math.isclose(deit_lr(500, **schedule), 1e-5)


@pytest.mark.parametrize("name, extra", [("convit_tiny", {"local_up_to_layer": 1}), ("deit_tiny", {}),
                                         ("deit_tiny", {"distilled": True})])
def test_the_production_optimizer_uses_these_groups_and_leaves_frozen_parameters_out(name, extra):
    model = create_model(name, **TINY, **extra)
    model.blocks[0].mlp.fc1.weight.requires_grad_(False)  # frozen parameters join no group
    optimizer, _ = optimisation.build_optimizer(TrainConfig(weight_decay=0.3), model, 512, 10, torch.device("cpu"))
    mine = param_groups(model, 0.3)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [g["weight_decay"] for g in mine] == [0.3, 0.0]
    assert [[id(p) for p in g["params"]] for g in optimizer.param_groups] == [[id(p) for p in g["params"]] for g in mine]
    assert all(p is not model.blocks[0].mlp.fc1.weight for g in mine for p in g["params"])


def test_gate_lr_scale_gives_the_trainable_gates_alone_that_multiple_of_the_rate_at_every_step():
    model = create_model("convit_tiny", **TINY, local_up_to_layer=1)
    cfg = TrainConfig(lr=1e-3, epochs=2, warmup_epochs=1, gate_lr_scale=40)
    optimizer, schedule = optimisation.build_optimizer(cfg, model, 512, 5, torch.device("cpu"))
    *others, gates = optimizer.param_groups
    assert [id(p) for p in gates["params"]] == [id(model.blocks[0].attn.gating_param)] and gates["weight_decay"] == 0
    plain = param_groups(model, cfg.weight_decay)  # every other parameter keeps its group
    assert [len(g["params"]) for g in others] == [len(plain[0]["params"]), len(plain[1]["params"]) - 1]
    for t in range(7):
        schedule.set_lr(optimizer, t)
        assert gates["lr"] == 40 * schedule.lr(t) and all(g["lr"] == schedule.lr(t) for g in others)
        optimizer.step()


@pytest.mark.parametrize("name, extra", [("deit_tiny", {}), ("convit_tiny", {"local_up_to_layer": 1,
                                                                              "freeze_gating": True})])
def test_gate_lr_scale_is_refused_by_name_where_no_gate_learns(name, extra):
    model = create_model(name, **TINY, **extra)
    with pytest.raises(ValueError, match="gate_lr_scale 40 .*gating_param"):
        optimisation.build_optimizer(TrainConfig(gate_lr_scale=40), model, 512, 5, torch.device("cpu"))
    with pytest.raises(ValueError, match="gate_lr_scale"):
        TrainConfig(gate_lr_scale=0)


def test_param_groups_decay_matrices_but_not_gates_norms_biases_or_embeddings():
    model = create_model("convit_tiny", **TINY, local_up_to_layer=1)
    decayed, kept = (set(map(id, g["params"])) for g in param_groups(model, 0.05))
    named = dict(model.named_parameters())
    assert {id(named[n]) for n in ("patch_embed.proj.weight", "blocks.0.attn.qk.weight", "head.weight")} <= decayed
    not_decayed = ("pos_embed", "cls_token", "blocks.0.attn.gating_param", "blocks.0.norm1.weight", "head.bias")
    assert {id(named[n]) for n in not_decayed} <= kept
    assert decayed.isdisjoint(kept) and len(decayed | kept) == len(named)


def test_param_groups_of_a_model_without_no_weight_decay_split_by_dimension():
    model = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3))
    decayed, kept = param_groups(model, 0.1)
    assert [p.shape for p in decayed["params"]] == [(3, 4)] and len(kept["params"]) == 3


def test_loss_and_accuracy_scores_predictions_we_control_and_restores_the_mode():
    model = nn.Linear(3, 3)  # the identity: the inputs are the logits
    with torch.no_grad():
        model.weight.copy_(torch.eye(3))
        model.bias.zero_()
    logits = torch.tensor([[3.0, 0, 0], [0, 3.0, 0], [0, 0, 3.0], [3.0, 0, 0], [0, 3.0, 0]])
    labels = torch.tensor([0, 1, 2, 1, 2])  # the first three right, the last two wrong
    model.train()
    result = loss_and_accuracy(model, DataLoader(TensorDataset(logits, labels), batch_size=2))  # batches of 2, 2 and 1
    assert result["top1"] == 60.0
    assert math.isclose(result["loss"], F.cross_entropy(logits, labels).item(), rel_tol=1e-6)
    assert model.training
    model.eval()
    loss_and_accuracy(model, [(logits, labels)])
    assert not model.training


def blobs(n: int, seed: int) -> TensorDataset:
    """Images of 3 classes told apart by their mean colour: a problem a tiny ViT learns in a few steps."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 3
    images = torch.randn(n, 3, 16, 16, generator=g) * 0.5
    images[torch.arange(n), labels] += 1.5
    return TensorDataset(images, labels)


@pytest.mark.parametrize("name", ["convit_tiny", "deit_tiny"])
def test_fit_lowers_the_loss_and_returns_the_documented_history(name):
    torch.manual_seed(0)
    model = create_model(name, **TINY, **({"local_up_to_layer": 1} if name == "convit_tiny" else {}))
    train_loader = DataLoader(blobs(96, 0), batch_size=16, shuffle=True, drop_last=True)
    val_loader = DataLoader(blobs(48, 1), batch_size=48)
    before = loss_and_accuracy(model, val_loader)
    history = fit(model, train_loader, val_loader, 4, lr=0.1, warmup_epochs=1, min_lr=1e-5)
    assert [row["epoch"] for row in history] == [1, 2, 3, 4]
    assert all(set(row) == {"epoch", "train_loss", "val_loss", "val_top1", "lr", "gates"} for row in history)
    assert history[-1]["val_loss"] < 0.7 * before["loss"] and history[-1]["val_top1"] > 90
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert math.isclose(history[-1]["lr"], 1e-5)
    assert math.isclose(history[0]["lr"], 0.1 * 16 / 512)  # the peak, after one warm-up epoch, scaled by 16/512
    gates = [len(row["gates"]) for row in history]
    assert gates == ([1] * 4 if name == "convit_tiny" else [0] * 4)


def test_fit_sets_the_schedules_rate_before_every_step():
    model = create_model("deit_tiny", **TINY)
    seen = []
    hook = register_optimizer_step_pre_hook(lambda opt, args, kwargs: seen.append([g["lr"] for g in opt.param_groups]))
    loader = DataLoader(blobs(40, 0), batch_size=8)  # 5 steps per epoch
    try:
        fit(model, loader, loader, 2, lr=0.01, warmup_epochs=1, min_lr=1e-5, warmup_lr=1e-6)
    finally:
        hook.remove()
    want = [deit_lr(t, 10, 5, 0.01 * 8 / 512, 1e-5, 1e-6) for t in range(10)]
    assert seen == [[lr, lr] for lr in want]


def test_fit_refuses_a_loader_without_a_batch_and_a_bad_epoch_count():
    model = create_model("deit_tiny", **TINY)
    empty = DataLoader(blobs(10, 0), batch_size=16, drop_last=True)
    with pytest.raises(ValueError, match="yields no batch"):
        fit(model, empty, empty, 1)
    with pytest.raises(ValueError, match="epochs must be at least 1"):
        fit(model, DataLoader(blobs(16, 0), batch_size=8), empty, 0)
