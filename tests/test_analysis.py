"""Tests for convit_edu.locality: nonlocality (Eq. 8) on known maps and on models, gates, the locality
recorder, attention maps and masking at test time (SM F)."""

import json
import math

import pytest
import torch
from torch.optim.swa_utils import AveragedModel

from convit_edu.attention_maps import attention_maps
from convit_edu.config import TrainConfig
from convit_edu.evaluation import format_masking, masking_table
from convit_edu.evaluation import evaluate
from convit_edu.locality import (LocalityRecorder, gates, model_nonlocality, nonlocality, patch_distances,
                                 read_locality)
from convit_edu.training import train
from convit_edu.zoo import create_model

SIZE = dict(img_size=16, patch_size=4, embed_dim=16, num_heads=4, depth=3, num_classes=3)


def convit(seed: int = 0, **overrides):
    torch.manual_seed(seed)
    return create_model("convit_tiny", **{**SIZE, "local_up_to_layer": 2, **overrides}).eval()


def deit(seed: int = 0):
    torch.manual_seed(seed)
    return create_model("deit_tiny", **SIZE).eval()


def images(batch: int = 4, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, 3, 16, 16, generator=torch.Generator().manual_seed(seed))


def one_hot_maps(grid: tuple[int, int], key_of) -> torch.Tensor:
    """(L, L) attention where query q attends only to key key_of(row, col) -> (row', col')."""
    rows, cols = grid
    attn = torch.zeros(rows * cols, rows * cols)
    for q in range(rows * cols):
        r, c = key_of(*divmod(q, cols))
        attn[q, r * cols + c] = 1.0
    return attn


# ------------------------------------------------------------------------------------------ Eq. 8


def test_patch_distances_are_euclidean_offsets_in_patches():
    d = patch_distances((2, 3))  # token t = row * 3 + col
    assert d.shape == (6, 6)
    assert d[0, 5].item() == pytest.approx(math.hypot(1, 2))  # (0, 0) -> (1, 2)
    assert torch.equal(d, d.T) and torch.all(d.diagonal() == 0)


def test_attention_on_own_patch_has_nonlocality_zero():
    assert torch.equal(nonlocality(torch.eye(12)[None].repeat(3, 1, 1), (3, 4)), torch.zeros(3))


def test_attention_at_a_fixed_offset_has_nonlocality_equal_to_its_length():
    grid = (5, 5)
    knight = one_hot_maps(grid, lambda r, c: ((r + 1) % 5, (c + 2) % 5) if r < 4 and c < 3 else (r, c))
    # 12 of the 25 queries (rows 0-3, cols 0-2) look sqrt(5) away, the others at themselves
    expected = 12 * math.sqrt(5) / 25
    assert nonlocality(knight[None], grid).item() == pytest.approx(expected, rel=1e-6)
    step = one_hot_maps(grid, lambda r, c: (r, c + 1) if c < 4 else (r, c - 1))
    assert nonlocality(step[None], grid).item() == pytest.approx(1.0)


def test_uniform_attention_gives_the_mean_distance_between_patches():
    grid = (1, 3)  # distances 0,1,2 / 1,0,1 / 2,1,0: mean 8/9
    uniform = torch.full((1, 3, 3), 1 / 3)
    assert nonlocality(uniform, grid).item() == pytest.approx(8 / 9)


def test_nonlocality_is_per_head_and_averaged_over_the_batch():
    grid = (1, 2)
    self_only, other = torch.eye(2), torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    batch = torch.stack([torch.stack([self_only, other]), torch.stack([other, other])])  # (B=2, H=2, 2, 2)
    torch.testing.assert_close(nonlocality(batch, grid), torch.tensor([0.5, 1.0]))


def test_class_token_attention_is_dropped_and_the_rest_renormalised():
    grid = (1, 2)
    attn = torch.tensor([[1.0, 0.0, 0.0], [0.9, 0.0, 0.1], [0.5, 0.5, 0.0]])  # token 0: class token
    # patch 0 gives its patch attention to patch 1, patch 1 to patch 0: distance 1 each
    assert nonlocality(attn[None], grid, num_prefix_tokens=1).item() == pytest.approx(1.0)


def test_nonlocality_rejects_maps_that_do_not_fit_the_grid():
    with pytest.raises(ValueError, match="does not fit num_prefix_tokens 1 \\+ a 2x2 grid"):
        nonlocality(torch.eye(4)[None], (2, 2), num_prefix_tokens=1)
    with pytest.raises(ValueError, match="must be \\(B, H, T, T\\)"):
        nonlocality(torch.ones(4, 4), (2, 2))


# ---------------------------------------------------------------------------------- on models


@pytest.mark.parametrize("make", [convit, deit])
def test_model_nonlocality_uses_each_blocks_true_input(make):
    model, x = make(), images()
    got = model_nonlocality(model, x)
    record = model.forward_features(x, return_attention=True)
    expected = torch.stack([nonlocality(a, record.grid_size, p)
                            for a, p in zip(record.attentions, record.num_prefix_tokens)])
    assert got.shape == (3, 4)
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("make", [convit, deit])
def test_embeddings_input_agrees_on_the_first_block_only(make):
    model, x = make(), images()
    with torch.no_grad():  # sharpen the attention: at init (std 0.02) every map is nearly uniform on any input
        for name, p in model.named_parameters():
            if name.endswith(("attn.qkv.weight", "attn.qk.weight")):
                p.mul_(30)
    true_inputs = model_nonlocality(model, x)
    embeddings = model_nonlocality(model, x, inputs="embeddings")
    torch.testing.assert_close(true_inputs[0], embeddings[0])
    assert not torch.allclose(true_inputs[1:], embeddings[1:])


def test_model_nonlocality_keeps_training_mode_and_rejects_unknown_inputs():
    model = convit().train()
    model_nonlocality(model, images())
    assert model.training
    with pytest.raises(ValueError, match="unknown inputs 'patches': choose one of block, embeddings"):
        model_nonlocality(model, images(), inputs="patches")


def test_strong_local_init_makes_gpsa_layers_local():
    model = convit(locality_strength=10.0)
    for layer in model.local_layers:
        layer.gate_override = 1.0  # purely positional
    d = model_nonlocality(model, images())
    # 2x2 kernel centres at (±1/2, ±1/2): each head splits its attention over its 4 nearest offsets (0, 1, 1,
    # sqrt 2 away) where they exist; far below the mean distance of two patches of the 4x4 grid
    assert (d[:2] < 1.0).all()
    assert (d[:2] > 0.5).all()
    assert patch_distances((4, 4)).mean() > 1.5


# ---------------------------------------------------------------------------------------- gates


def test_gates_read_sigma_lambda_per_head_from_model_state_dict_and_file(tmp_path):
    model = convit()
    with torch.no_grad():
        model.local_layers[1].gating_param.copy_(torch.tensor([0.0, 1.0, -2.0, 3.0]))
    expected = torch.sigmoid(torch.stack([torch.ones(4), torch.tensor([0.0, 1.0, -2.0, 3.0])]))
    torch.testing.assert_close(gates(model), expected)
    torch.testing.assert_close(gates(model.state_dict()), expected)
    path = tmp_path / "ckpt.pt"
    torch.save({"model": {f"module.{k}": v for k, v in model.state_dict().items()}}, path)
    torch.testing.assert_close(gates(path), expected)
    torch.testing.assert_close(gates(AveragedModel(model).state_dict()), expected)  # EMA weights
    model.local_layers[0].gate_override = 0.0  # masked at test time: the gate the forward uses
    torch.testing.assert_close(gates(model), torch.stack([torch.zeros(4), expected[1]]))


def test_gates_are_in_block_order_beyond_ten_blocks():
    sd = {f"blocks.{i}.attn.gating_param": torch.full((2,), float(i)) for i in (10, 2, 1, 0)}
    assert gates(sd)[:, 0].tolist() == pytest.approx(torch.sigmoid(torch.tensor([0.0, 1, 2, 10])).tolist())


def test_gates_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="no gating_param"):
        gates(deit())
    with pytest.raises(FileNotFoundError, match="no checkpoint file"):
        gates(tmp_path / "missing.pt")


# ---------------------------------------------------------------------------------- the recorder


def test_locality_recorder_records_before_training_every_n_steps_and_at_the_end(tmp_path):
    cfg = TrainConfig(model="convit_tiny", img_size=16, model_args={"patch_size": 4, "embed_dim": 16, "num_heads": 4,
                                                                    "depth": 2, "local_up_to_layer": 1},
                      data="fake", data_args={"num_train": 40, "num_val": 8, "num_classes": 3, "image_size": 16},
                      aug=None, epochs=1, batch_size=8, num_workers=0, precision="fp32", progress="none",
                      warmup_epochs=0, output=str(tmp_path / "run"))
    from convit_edu.datasets import build_datasets

    datasets = build_datasets("fake", train_transform=_to_tensor, val_transform=_to_tensor, num_train=40, num_val=8,
                              num_classes=3, image_size=16)
    recorder = LocalityRecorder(images(2), every=2, path=tmp_path / "loc.json")
    train(cfg, datasets=datasets, callbacks=[recorder])
    assert [r["step"] for r in recorder.records] == [0, 2, 4, 5]
    assert recorder.records[-1]["epoch"] == 1.0
    assert len(recorder.records[0]["gates"]) == 1 and len(recorder.records[0]["nonlocality"]) == 2
    assert read_locality(tmp_path / "loc.json") == json.loads(json.dumps(recorder.records))
    assert recorder.records[0]["gates"] != recorder.records[-1]["gates"]  # the gates did train


def test_a_resumed_recorder_keeps_the_points_its_checkpoint_reached(tmp_path):
    def run(epochs: int, resume=None) -> LocalityRecorder:
        cfg = TrainConfig(model="convit_tiny", img_size=16, data="fake", aug=None, epochs=epochs, batch_size=8,
                          model_args={"patch_size": 4, "embed_dim": 16, "num_heads": 4, "depth": 2,
                                      "local_up_to_layer": 1},
                          num_workers=0, precision="fp32", progress="none", warmup_epochs=0, resume=resume,
                          output=str(tmp_path / "run"))
        from convit_edu.datasets import build_datasets

        datasets = build_datasets("fake", train_transform=_to_tensor, val_transform=_to_tensor, num_train=40,
                                  num_val=8, num_classes=3, image_size=16)
        recorder = LocalityRecorder(images(2), every=2, path=tmp_path / "loc.json")
        train(cfg, datasets=datasets, callbacks=[recorder])
        return recorder

    first = run(epochs=1)
    assert [r["step"] for r in first.records] == [0, 2, 4, 5]
    (tmp_path / "loc.json").write_text(json.dumps(first.records + [{"step": 99}]))  # a point past the checkpoint
    second = run(epochs=2, resume="auto")
    assert [r["step"] for r in second.records] == [0, 2, 4, 5, 6, 8, 10]
    assert second.records[:4] == json.loads(json.dumps(first.records))
    assert read_locality(tmp_path / "loc.json") == json.loads(json.dumps(second.records))


def _to_tensor(image):
    import torchvision.transforms.v2 as v2

    return v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])(image)


def test_locality_recorder_rejects_a_bad_period():
    with pytest.raises(ValueError, match="every must be at least 1, got 0"):
        LocalityRecorder(images(1), every=0)


# ------------------------------------------------------------------------------ attention maps


def test_attention_maps_are_the_query_rows_averaged_over_images():
    model, x = convit(), images()
    maps = attention_maps(model, x, layers=[0, 2], query=(1, 2))
    record = model.forward_features(x, return_attention=True)
    assert maps.shape == (2, 4, 4, 4)
    torch.testing.assert_close(maps[0], record.attentions[0][:, :, 6].mean(0).reshape(4, 4, 4))
    torch.testing.assert_close(maps[1], record.attentions[2][:, :, 1 + 6, 1:].mean(0).reshape(4, 4, 4))
    torch.testing.assert_close(maps[0].sum((-1, -2)), torch.ones(4))  # GPSA: patches only
    assert (maps[1].sum((-1, -2)) < 1).all()  # SA block: the class token's share is left out


def test_attention_maps_reject_bad_queries_and_layers():
    with pytest.raises(ValueError, match="outside the 4x4 patch grid"):
        attention_maps(convit(), images(1), layers=[0], query=(4, 0))
    with pytest.raises(ValueError, match=r"layers \[3\] do not exist"):
        attention_maps(convit(), images(1), layers=[3])


# ----------------------------------------------------------------------------------- masking


class TinySet(torch.utils.data.Dataset):
    def __init__(self, n: int = 12):
        self.x, self.y = images(n, seed=3), torch.arange(n) % 3

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def test_masking_table_rows_and_unmasked_accuracy():
    model, data = convit(), TinySet()
    table = masking_table(model, data, layer_counts=[1, 2], batch_size=12)
    assert list(table) == ["no mask", "mask pos embed", "mask content, first 1", "mask position, first 1",
                           "mask content, first 2", "mask position, first 2"]
    assert table["no mask"] == evaluate(model, data, batch_size=12)["top1"]
    assert all(layer.gate_override is None for layer in model.local_layers) and not model.mask_pos_embed


def test_masking_position_everywhere_equals_a_model_with_gates_at_zero():
    model, data = convit(), TinySet()
    table = masking_table(model, data, layer_counts=[2], batch_size=12)
    with torch.no_grad():
        for layer in model.local_layers:
            layer.gating_param.fill_(-1e4)  # sigma = 0: content only
    assert table["mask position, first 2"] == evaluate(model, data, batch_size=12)["top1"]


def test_format_masking_lines_up_models_with_different_rows():
    text = format_masking({"DeiT": {"no mask": 50.0, "mask pos embed": 20.0},
                           "ConViT": {"no mask": 60.0, "mask pos embed": 55.0, "mask content, first 1": 10.0}})
    lines = text.splitlines()
    assert lines[1].split()[-2:] == ["50.0", "60.0"] and lines[3].split()[-2:] == ["-", "10.0"]
