"""Tests for convit_edu.models: the zoo, Table 1 counts, timm/official checkpoints, resolutions, ablation switches."""

import dataclasses
import functools

import pytest
import torch
from torch.optim.swa_utils import AveragedModel
from torch.utils.flop_counter import FlopCounterMode

from convit_edu import gated_attention, gpsa
from convit_edu.pretrained import guess_architecture, load_weights, read_state_dict
from convit_edu.conv_init import head_centres, v_pos
from convit_edu.layers import Block, DropPath
from convit_edu.masking import mask_at_test_time
from convit_edu.models import ForwardRecord, ModelConfig, VisionTransformer
from convit_edu.patches import resize_pos_embed
from convit_edu.zoo import MODEL_ZOO, count_macs, count_params, create_model, list_models

timm = pytest.importorskip("timm")

REFERENCE_PARAMS = {
    "convit_tiny": 5_710_512, "convit_small": 27_777_322, "convit_base": 86_540_040,
    "deit_tiny": 5_717_416, "deit_small": 22_050_664, "deit_base": 86_567_656,
}
TIMM_NAMES = {
    "convit_tiny": "convit_tiny", "convit_small": "convit_small",
    "deit_tiny": "deit_tiny_patch16_224", "deit_small": "deit_small_patch16_224",
}


def seeded(name: str, seed: int = 0, **overrides) -> VisionTransformer:
    torch.manual_seed(seed)
    return create_model(name, **overrides)


@functools.cache
def timm_weights(timm_name: str) -> tuple[torch.nn.Module, dict]:
    """A timm model with random weights (no download) in eval mode, and its state dict; shared, do not modify."""
    torch.manual_seed(0)
    reference = timm.create_model(timm_name, pretrained=False).eval()
    with torch.no_grad():  # make every parameter matter, gates and zero-initialized biases included
        for p in reference.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return reference, reference.state_dict()


def images(*size: int, batch: int = 1, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, 3, *size, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------------- the zoo


def test_zoo_lists_the_twelve_models_of_table_1():
    sizes = ["tiny", "small", "base", "tiny_plus", "small_plus", "base_plus"]
    assert sorted(list_models()) == sorted(f"{arch}_{size}" for arch in ("convit", "deit") for size in sizes)


@pytest.mark.parametrize(
    "name, heads, embed_dim, head_dim",
    [("convit_tiny", 4, 192, 48), ("convit_small", 9, 432, 48), ("convit_base", 16, 768, 48),
     ("convit_tiny_plus", 4, 256, 64), ("convit_small_plus", 9, 576, 64), ("convit_base_plus", 16, 1024, 64),
     ("deit_tiny", 3, 192, 64), ("deit_small", 6, 384, 64), ("deit_base", 12, 768, 64),
     ("deit_tiny_plus", 4, 256, 64), ("deit_small_plus", 9, 576, 64), ("deit_base_plus", 16, 1024, 64)],
)
def test_zoo_heads_and_widths_follow_table_1(name, heads, embed_dim, head_dim):
    c = MODEL_ZOO[name]
    assert (c.num_heads, c.embed_dim, c.head_dim, c.depth) == (heads, embed_dim, head_dim, 12)
    if name.startswith("convit"):
        assert (c.local_up_to_layer, c.locality_strength, c.qkv_bias, c.class_token_pos_embed) == (10, 1.0, False, False)
    else:
        assert (c.local_up_to_layer, c.qkv_bias, c.class_token_pos_embed) == (0, True, True)


def test_create_model_applies_overrides_and_keeps_the_zoo_unchanged():
    model = create_model("convit_tiny", num_classes=10, drop_path_rate=0.1)
    assert isinstance(model, VisionTransformer) and model.config.num_classes == 10
    assert model.head.out_features == 10 and MODEL_ZOO["convit_tiny"].num_classes == 1000
    rates = [block.drop_path.p for block in model.blocks]
    assert rates[0] == 0.0 and rates[-1] == pytest.approx(0.1)
    assert rates == pytest.approx([0.1 * i / 11 for i in range(12)])  # linear in depth


def test_unknown_model_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown model 'convit_huge'.*convit_tiny.*deit_base_plus"):
        create_model("convit_huge")


def test_unknown_override_names_the_field():
    with pytest.raises(TypeError, match="embed_dimension"):
        create_model("convit_tiny", embed_dimension=100)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(img_size=225), "img_size 225 .* not divisible by patch_size 16"),
        (dict(img_size=(224, 150)), "img_size 150 .* not divisible by patch_size 16"),
        (dict(embed_dim=200, num_heads=3), "embed_dim 200 is not divisible by num_heads 3"),
        (dict(local_up_to_layer=13), "local_up_to_layer 13 must be in \\[0, depth\\) = \\[0, 12\\)"),
        (dict(local_up_to_layer=12), "local_up_to_layer 12 must be in"),
        (dict(local_attention="sa"), "unknown local_attention 'sa': choose one of gpsa, gpsa_reference, psa"),
        (dict(class_token_pos_embed=True), "needs local_up_to_layer=0, got local_up_to_layer=10"),
        (dict(freeze_gating=True, local_attention="psa"), "freeze_gating needs gated layers"),
        (dict(freeze_gpsa=True, local_up_to_layer=0), "freeze_gpsa needs GPSA layers"),
        (dict(locality_strength=0.0), "locality_strength \\(α\\) must be > 0, got 0.0"),
        (dict(locality_strength=float("nan")), "locality_strength \\(α\\) must be > 0, got nan"),
        (dict(drop_path_rate=1.0), "drop_path_rate must be in \\[0, 1\\), got 1.0"),
        (dict(patch_size=0), "patch_size must be at least 1, got 0"),
        (dict(img_size=(224, 224, 3)), "img_size must be an int or \\(height, width\\), got \\(224, 224, 3\\)"),
        (dict(mlp_ratio=0.0), "mlp_ratio must be positive, got 0.0"),
        (dict(attn_drop_rate=-0.1), "attn_drop_rate must be in \\[0, 1\\), got -0.1"),
    ],
)
def test_bad_config_values_are_refused_naming_the_value(overrides, message):
    with pytest.raises(ValueError, match=message):
        create_model("convit_tiny", **overrides)


def test_locality_strength_is_checked_only_where_eq5_uses_it_and_the_same_way_everywhere():
    model = create_model("convit_tiny", img_size=32, use_local_init=False, locality_strength=0.0)
    assert model.local_layers[0].locality_strength == 0.0  # unused without the convolutional init
    with pytest.raises(ValueError) as in_config:
        ModelConfig(locality_strength=-1.0)
    with pytest.raises(ValueError) as in_layer:
        gpsa.GPSA(48, 4, locality_strength=-1.0)
    assert str(in_config.value) == str(in_layer.value) == "locality_strength (α) must be > 0, got -1.0"


def test_bad_images_are_refused_naming_the_value():
    model = create_model("convit_tiny")
    with pytest.raises(ValueError, match="image size 225x224 is not divisible by patch_size 16"):
        model(torch.randn(1, 3, 225, 224))
    with pytest.raises(ValueError, match="in_chans=3 channels, got 1"):
        model(torch.randn(1, 1, 224, 224))
    with pytest.raises(ValueError, match="expected images of shape"):
        model(torch.randn(3, 224, 224))
    with pytest.raises(TypeError, match="float64: pass x.to\\(torch.float32\\)"):
        model(torch.randn(1, 3, 224, 224, dtype=torch.float64))


def test_bad_layer_arguments_are_refused_naming_the_value():
    with pytest.raises(TypeError, match="embed_dim must be an integer, got 192.0"):
        ModelConfig(embed_dim=192.0)
    with pytest.raises(ValueError, match="drop path probability must be in \\[0, 1\\), got 1.0"):
        DropPath(1.0)
    with pytest.raises(ValueError, match="unknown attention 'sa': choose one of mhsa, gpsa, gpsa_reference, psa"):
        Block(48, 4, attention="sa")


def test_config_from_json_lists_becomes_a_tuple():
    config = ModelConfig(img_size=[224, 160])
    assert config.img_size == (224, 160) and config.grid_size == (14, 10)
    assert ModelConfig(**dataclasses.asdict(config)) == config


# ------------------------------------------------------------------------------------------- counts


@pytest.mark.parametrize("name", list(REFERENCE_PARAMS))
def test_parameter_counts_equal_the_official_models(name):
    with torch.device("meta"):  # shapes only; the convolutional init writes values, which meta tensors lack
        built = sum(p.numel() for p in create_model(name, use_local_init=False).parameters())
    assert count_params(MODEL_ZOO[name]) == built == REFERENCE_PARAMS[name]


@pytest.mark.parametrize(
    "name, overrides",
    [("convit_tiny_plus", {}), ("deit_small_plus", {}), ("convit_tiny", dict(distilled=True)),
     ("deit_tiny", dict(distilled=True, num_classes=100)), ("convit_tiny", dict(local_attention="psa")),
     ("convit_tiny", dict(img_size=32, patch_size=4, in_chans=1, local_up_to_layer=3, mlp_ratio=2.0))],
)
def test_analytic_parameter_count_equals_the_built_model(name, overrides):
    with torch.device("meta"):
        model = create_model(name, use_local_init=False, **overrides)
    assert count_params(model.config) == sum(p.numel() for p in model.parameters())


def test_one_gpsa_layer_of_convit_tiny_has_20_more_parameters_than_mhsa_without_bias():
    model = create_model("convit_tiny")
    gpsa, mhsa = (sum(p.numel() for p in model.blocks[i].attn.parameters()) for i in (0, 11))
    assert (gpsa, mhsa) == (147_668, 147_648)


def test_macs_of_convit_small_without_and_with_attention():
    macs = count_macs(MODEL_ZOO["convit_small"])
    assert round(macs.total(with_attention=False) / 1e9, 2) == 5.36
    assert round(macs.total() / 1e9, 2) == 5.76


def test_macs_grow_with_resolution_attention_faster_than_the_rest():
    at_224, at_448 = count_macs(MODEL_ZOO["deit_tiny"]), count_macs(MODEL_ZOO["deit_tiny"], img_size=448)
    assert 3.9 < at_448.linear / at_224.linear < 4.1 and 15 < at_448.attention / at_224.attention < 16.1


def test_flop_counter_sees_the_linear_layers_but_not_fused_attention():
    model = seeded("deit_tiny").eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(images(224, 224))
    assert counter.get_total_flops() == 2 * count_macs(model.config).linear


# ------------------------------------------------------------------------------------------- timm / official checkpoints


@pytest.mark.parametrize("name", ["convit_tiny", "deit_tiny", "convit_small"])
def test_timm_weights_give_timm_logits(name):
    reference, state_dict = timm_weights(TIMM_NAMES[name])
    ours = load_weights(create_model(name), state_dict).eval()
    x = images(224, 224, batch=2 if name.endswith("tiny") else 1)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), reference(x), atol=1e-5, rtol=0)


def test_timm_distilled_deit_gives_timm_logits_and_trains_with_two_heads():
    reference, state_dict = timm_weights("deit_tiny_distilled_patch16_224")
    ours = load_weights(create_model("deit_tiny", distilled=True), state_dict)
    x = images(224, 224, batch=2)
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(x), reference(x), atol=1e-5, rtol=0)
        class_logits, dist_logits = ours.train()(x)
    torch.testing.assert_close((class_logits + dist_logits) / 2, reference(x), atol=1e-5, rtol=0)


def test_read_state_dict_unwraps_training_checkpoints_ddp_and_ema_weights(tmp_path):
    model = seeded("convit_tiny", img_size=32, num_classes=10)
    own = model.state_dict()
    ema = AveragedModel(model).state_dict()
    assert "n_averaged" in ema and all(k.startswith("module.") for k in ema if k != "n_averaged")
    torch.save({"model": own, "ema": ema, "epoch": 3}, tmp_path / "checkpoint.pt")
    sources = [own, {"model": own}, {f"module.{k}": v for k, v in own.items()}, ema, tmp_path / "checkpoint.pt"]
    for source in sources:
        weights = read_state_dict(source)
        assert list(weights) == list(own) and all(torch.equal(weights[k], own[k]) for k in own)
    fresh = load_weights(seeded("convit_tiny", seed=1, img_size=32, num_classes=10), ema)
    assert torch.equal(fresh.blocks[0].attn.qk.weight, model.blocks[0].attn.qk.weight)


def test_official_checkpoint_files_load_wrapped_and_prefixed(tmp_path):
    reference, state_dict = timm_weights("convit_tiny")
    path = tmp_path / "convit_tiny.pth"
    torch.save({"model": {f"module.{k}": v for k, v in state_dict.items()}, "epoch": torch.tensor(299)}, path)
    ours = load_weights(create_model("convit_tiny"), path).eval()
    x = images(224, 224)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), reference(x), atol=1e-5, rtol=0)


def test_checkpoint_of_another_architecture_names_key_shapes_and_model():
    _, state_dict = timm_weights("convit_small")
    with pytest.raises(ValueError) as error:
        load_weights(create_model("convit_tiny"), state_dict)
    message = str(error.value)
    assert "'blocks.0.attn.qk.weight': checkpoint shape (864, 432), model shape (384, 192)" in message
    assert "looks like: convit_small (embed_dim 432, depth 12, 10 GPSA layers, num_heads 9" in message
    assert "the model is:              convit_tiny" in message


def test_deit_checkpoint_into_a_convit_reports_missing_and_unexpected_keys():
    _, state_dict = timm_weights("deit_tiny_patch16_224")
    with pytest.raises(ValueError, match=r"(?s)key 'pos_embed'.*missing from the checkpoint.*looks like: deit_tiny"):
        load_weights(create_model("convit_tiny"), state_dict)


def test_a_non_vit_checkpoint_says_so():
    resnet = {"conv1.weight": torch.zeros(64, 3, 7, 7), "fc.weight": torch.zeros(1000, 2048)}
    with pytest.raises(ValueError, match="looks like: not a ConViT/DeiT"):
        load_weights(create_model("deit_tiny"), resnet)


def test_other_number_of_classes_needs_ignore_head():
    _, state_dict = timm_weights("convit_tiny")
    with pytest.raises(ValueError, match="(?s)key 'head.weight'.*ignore_head=True"):
        load_weights(create_model("convit_tiny", num_classes=100), state_dict)
    model = seeded("convit_tiny", num_classes=100)
    head = model.head.weight.clone()
    load_weights(model, state_dict, ignore_head=True)
    assert torch.equal(model.head.weight, head)
    assert torch.equal(model.blocks[3].attn.qk.weight, state_dict["blocks.3.attn.qk.weight"])


@pytest.mark.parametrize("name", ["convit_tiny", "deit_tiny"])
def test_checkpoint_at_another_resolution_has_its_pos_embed_interpolated(name):
    _, state_dict = timm_weights(TIMM_NAMES[name])
    native = load_weights(create_model(name), state_dict).eval()
    at_256 = load_weights(create_model(name, img_size=256), state_dict).eval()
    prefix = 1 if name.startswith("deit") else 0
    assert at_256.pos_embed.shape == (1, prefix + 16 * 16, 192)
    assert torch.equal(at_256.pos_embed[:, :prefix], state_dict["pos_embed"][:, :prefix])  # class slot untouched
    x = images(256, 256)
    with torch.no_grad():  # the 224 model interpolates on the fly: same embedding, same logits
        torch.testing.assert_close(at_256(x), native(x))


def test_guess_architecture_names_zoo_models_from_their_weights():
    for name in ("convit_tiny", "deit_small", "convit_base_plus"):
        with torch.device("meta"):
            state_dict = create_model(name, use_local_init=False).state_dict()
        assert guess_architecture(state_dict).startswith(f"{name} (")


# ------------------------------------------------------------------------------------------- resolutions


@pytest.mark.parametrize("name", ["convit_tiny", "deit_tiny"])
@pytest.mark.parametrize("size", [(160, 160), (224, 160)])
def test_model_runs_on_other_sizes_and_aspect_ratios(name, size):
    model = seeded(name).eval()
    with torch.no_grad():
        assert model(images(*size)).shape == (1, 1000)
        record = model.forward_features(images(*size), return_attention=True)
    rows, cols = size[0] // 16, size[1] // 16
    assert record.grid_size == (rows, cols)
    assert all(a.shape[-2:] == (rows * cols, rows * cols) for a in record.attentions[: len(model.local_layers)])


def test_training_at_another_size_builds_pos_embed_for_it():
    model = seeded("convit_tiny", img_size=(160, 224))
    assert model.pos_embed.shape == (1, 10 * 14, 192)
    model(images(160, 224)).sum().backward()
    assert model.pos_embed.grad is not None


def test_forward_at_another_size_interpolates_pos_embed_bicubically():
    model = seeded("convit_tiny").eval()
    expected = torch.nn.functional.interpolate(
        model.pos_embed.reshape(1, 14, 14, 192).permute(0, 3, 1, 2), size=(10, 8), mode="bicubic", align_corners=False
    ).permute(0, 2, 3, 1).reshape(1, 80, 192)
    torch.testing.assert_close(model._pos_embed_for((10, 8)), expected)
    assert model._pos_embed_for((14, 14)) is model.pos_embed


def test_resize_pos_embed_rejects_a_grid_that_does_not_fit():
    with pytest.raises(ValueError, match="does not hold 1 prefix slots \\+ a 14x14 grid"):
        resize_pos_embed(torch.zeros(1, 196, 8), (14, 14), (10, 10), num_prefix_tokens=1)


@pytest.mark.parametrize("name", ["convit_tiny", "deit_tiny"])
def test_cifar_sized_inputs_work(name):
    small = seeded(name, img_size=32, patch_size=4, num_classes=100).eval()
    with torch.no_grad():
        assert small(images(32, 32, batch=2)).shape == (2, 100)
    assert small.pos_embed.shape[1] == 64 + (1 if name.startswith("deit") else 0)  # an 8x8 grid


@pytest.mark.parametrize("local_attention", ["gpsa_reference", "psa", "gpsa"])
def test_a_convit_holds_rel_indices_for_its_grid_from_construction_and_saves_none(local_attention):
    model = seeded("convit_tiny", img_size=(64, 96), patch_size=16, depth=3, local_up_to_layer=2,
                   local_attention=local_attention)
    for layer in model.local_layers:
        assert layer.rel_indices.shape == (4 * 6, 4 * 6, 3)
    assert not any(key.endswith("rel_indices") for key in model.state_dict())


def test_compiled_convit_trains_two_steps_with_one_compilation():
    """No buffer is built by a forward, so the first step's graph serves the second (no recompile)."""
    model = seeded("convit_tiny", img_size=32, patch_size=8, embed_dim=48, depth=3, local_up_to_layer=2,
                   num_classes=10)
    graphs = []

    def counting_backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=counting_backend)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = images(32, 32, batch=4), torch.arange(4)
    for _ in range(2):
        loss = torch.nn.functional.cross_entropy(compiled(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert len(graphs) == 1


# ------------------------------------------------------------------------------------------- structure


def test_class_token_joins_after_the_last_gpsa_block():
    model = seeded("convit_tiny", local_up_to_layer=4).eval()
    with torch.no_grad():
        record = model.forward_features(images(64, 48), return_block_inputs=True)
    assert [t.shape[1] for t in record.block_inputs] == [12] * 4 + [13] * 8
    assert record.num_prefix_tokens == [0] * 4 + [1] * 8
    assert torch.equal(record.block_inputs[4][:, 0], model.cls_token[0].expand(1, -1))  # no positional embedding


def test_deit_class_token_has_its_own_positional_slot_from_the_start():
    model = seeded("deit_tiny").eval()
    with torch.no_grad():
        record = model.forward_features(images(224, 224), return_block_inputs=True)
    assert model.pos_embed.shape == (1, 197, 192) and record.num_prefix_tokens == [1] * 12
    torch.testing.assert_close(record.block_inputs[0][:, 0], (model.cls_token + model.pos_embed[:, :1])[0])


def test_forward_record_holds_true_block_inputs_and_attention_from_one_pass():
    model = seeded("convit_tiny", distilled=True).eval()
    x = images(96, 64)
    with torch.no_grad():
        record = model.forward_features(x, return_attention=True, return_block_inputs=True)
        plain = model.forward_features(x)
        assert isinstance(record, ForwardRecord) and record.grid_size == (6, 4)
        torch.testing.assert_close(record.features, plain)
        for i, block in enumerate(model.blocks[:-1]):
            if i + 1 != model.config.local_up_to_layer:  # the class and distillation tokens join there
                torch.testing.assert_close(block(record.block_inputs[i], record.grid_size), record.block_inputs[i + 1])
    shapes = [tuple(a.shape) for a in record.attentions]
    assert shapes == [(1, 4, 24, 24)] * 10 + [(1, 4, 26, 26)] * 2
    for attn in record.attentions:
        torch.testing.assert_close(attn.sum(-1), torch.ones(attn.shape[:-1]))


def test_no_weight_decay_names_pos_embed_and_tokens():
    assert create_model("convit_tiny").no_weight_decay() == {"pos_embed", "cls_token"}
    model = create_model("deit_tiny", distilled=True)
    assert model.no_weight_decay() == {"pos_embed", "cls_token", "dist_token"}
    assert model.no_weight_decay() <= {name for name, _ in model.named_parameters()}


def test_gpsa_layers_are_discoverable_by_their_gating_param():
    model = create_model("convit_tiny")
    gated = [name for name, module in model.named_modules() if hasattr(module, "gating_param")]
    assert gated == [f"blocks.{i}.attn" for i in range(10)]
    assert model.gated_layers == [model.blocks[i].attn for i in range(10)]


def test_gates_are_sigma_lambda_per_gpsa_layer_and_head_as_the_forward_uses_them():
    model = seeded("convit_tiny", img_size=32, local_up_to_layer=3)
    with torch.no_grad():
        model.blocks[1].attn.gating_param.copy_(torch.tensor([-2.0, 0.0, 2.0, 4.0]))
    gates = model.gates()
    assert gates.shape == (3, 4) and not gates.requires_grad
    torch.testing.assert_close(gates[1], torch.sigmoid(torch.tensor([-2.0, 0.0, 2.0, 4.0])))
    torch.testing.assert_close(gates[0], torch.full((4,), torch.sigmoid(torch.tensor(1.0)).item()))
    with mask_at_test_time(model, gate=0.0, num_layers=2):
        assert torch.equal(model.gates()[:2], torch.zeros(2, 4)) and torch.equal(model.gates()[2], gates[2])
    for no_gates in (create_model("deit_tiny", img_size=32), create_model("convit_tiny", local_attention="psa")):
        assert no_gates.gates().shape == (0, no_gates.config.num_heads)


def test_a_fresh_convit_holds_the_eq5_weights_applied_once_per_layer(monkeypatch):
    calls = []

    def counting_local_init(pos_proj, v, locality_strength):
        calls.append((pos_proj, locality_strength))
        return local_init(pos_proj, v, locality_strength)

    local_init = gated_attention.local_init
    monkeypatch.setattr(gated_attention, "local_init", counting_local_init)
    model = seeded("convit_tiny", img_size=32, locality_strength=2.0)
    assert [pos_proj for pos_proj, _ in calls] == [layer.pos_proj for layer in model.local_layers]
    assert {alpha for _, alpha in calls} == {2.0}
    centres = head_centres(4)
    rows = 2.0 * torch.cat([2 * centres, -torch.ones(4, 1)], dim=1)  # α·[2Δx, 2Δy, −1]
    for layer in model.local_layers:
        assert torch.equal(layer.pos_proj.weight, rows) and torch.equal(layer.pos_proj.bias, torch.zeros(4))
        assert torch.equal(layer.v.weight, torch.eye(192)) and layer.v.bias is None  # ConViT: no qkv bias
    calls.clear()
    seeded("convit_tiny", img_size=32, use_local_init=False)
    assert calls == []


def test_initialization_is_deit_normal_then_convolutional():
    model = seeded("convit_small")
    expected = v_pos(head_centres(9), 1.0)
    for layer in model.local_layers:
        torch.testing.assert_close(layer.pos_proj.weight, expected)
        assert torch.equal(layer.v.weight, torch.eye(432)) and torch.equal(layer.gating_param, torch.ones(9))
    qkv = model.blocks[11].attn.qkv.weight
    assert 0.019 < qkv.std().item() < 0.021 and abs(qkv.mean().item()) < 1e-3
    assert torch.count_nonzero(model.head.bias) == 0


# ------------------------------------------------------------------------------------------- ablation switches


def test_freeze_gating_fixes_every_lambda_at_zero():
    model = seeded("convit_tiny", freeze_gating=True)
    for layer in model.local_layers:
        assert not layer.gating_param.requires_grad and torch.equal(layer.gating_param, torch.zeros(4))
    model(images(64, 64)).sum().backward()
    assert all(layer.gating_param.grad is None for layer in model.local_layers)
    assert model.local_layers[0].qk.weight.grad is not None


def test_no_local_init_keeps_the_random_initialization():
    model = seeded("convit_tiny", use_local_init=False)
    layer = model.local_layers[0]
    assert not torch.equal(layer.v.weight, torch.eye(192))
    assert not torch.allclose(layer.pos_proj.weight, v_pos(head_centres(4), 1.0))
    assert layer.v.weight.std().item() == pytest.approx(0.02, rel=0.1)


def test_locality_strength_scales_the_positional_init():
    model = seeded("convit_tiny", locality_strength=3.0)
    torch.testing.assert_close(model.local_layers[0].pos_proj.weight, v_pos(head_centres(4), 3.0))


def test_freeze_gpsa_freezes_the_attention_of_the_gpsa_layers_only():
    model = seeded("convit_tiny", freeze_gpsa=True)
    model(images(64, 64)).sum().backward()
    assert all(p.grad is None and not p.requires_grad for layer in model.local_layers for p in layer.parameters())
    assert model.blocks[0].mlp.fc1.weight.grad is not None and model.blocks[10].attn.qkv.weight.grad is not None


@pytest.mark.parametrize("layers", [0, 3])
def test_number_of_gpsa_layers(layers):
    model = create_model("convit_tiny", local_up_to_layer=layers)
    kinds = [type(block.attn).__name__ for block in model.blocks]
    assert kinds == ["GPSA"] * layers + ["MHSA"] * (12 - layers)
    assert model.pos_embed.shape == (1, 196, 192)  # no class slot: it is a ConViT with 0 GPSA layers, DeiT-like


def test_psa_instead_of_gpsa_has_no_gates():
    model = create_model("convit_tiny", local_attention="psa")
    assert [type(layer).__name__ for layer in model.local_layers] == ["PSA"] * 10
    assert not any("gating_param" in name for name, _ in model.named_parameters())
    with pytest.raises(ValueError, match="gate needs gated"):
        with mask_at_test_time(model, gate=1.0):
            pass


def test_reference_gpsa_path_gives_the_fast_path_logits():
    fast = seeded("convit_tiny").eval()
    reference = create_model("convit_tiny", local_attention="gpsa_reference").eval()
    reference.load_state_dict(fast.state_dict())
    assert type(reference.local_layers[0]).__name__ == "GPSAReference"
    x = images(224, 224)
    with torch.no_grad():
        torch.testing.assert_close(reference(x), fast(x), atol=1e-5, rtol=1e-5)


def test_masking_the_positional_embedding_at_test_time():
    model = seeded("deit_tiny").eval()
    x = images(64, 64)
    without = seeded("deit_tiny").eval()
    with torch.no_grad():
        without.pos_embed.zero_()
        base = model(x)
        with mask_at_test_time(model, mask_pos_embed=True):
            torch.testing.assert_close(model(x), without(x))
        torch.testing.assert_close(model(x), base)
    assert model.mask_pos_embed is False


@pytest.mark.parametrize("gate, layers", [(1.0, 3), (0.0, 5), (1.0, None)])
def test_forcing_the_gate_in_the_first_layers_at_test_time(gate, layers):
    model = seeded("convit_tiny").eval()
    forced = seeded("convit_tiny").eval()
    count = 10 if layers is None else layers
    with torch.no_grad():
        for layer in forced.local_layers[:count]:
            layer.gating_param.fill_(100.0 if gate == 1.0 else -100.0)  # σ rounds to exactly 1 or 0 in float32
        x = images(64, 64)
        base = model(x)
        with mask_at_test_time(model, gate=gate, num_layers=layers):
            assert [layer.gate_override for layer in model.local_layers] == [gate] * count + [None] * (10 - count)
            torch.testing.assert_close(model(x), forced(x), atol=1e-5, rtol=1e-5)
        assert all(layer.gate_override is None for layer in model.local_layers)
        torch.testing.assert_close(model(x), base)


@pytest.mark.parametrize(
    "kwargs, message",
    [(dict(gate=1.5), "must be in \\[0, 1\\], got 1.5"), (dict(gate=1.0, num_layers=11), "num_layers 11 must be in \\[1, 10\\]"),
     (dict(num_layers=3), "num_layers=3 needs a gate value")],
)
def test_mask_at_test_time_refuses_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        with mask_at_test_time(create_model("convit_tiny"), **kwargs):
            pass


def test_mask_at_test_time_restores_the_model_after_an_error():
    model = create_model("convit_tiny")
    with pytest.raises(RuntimeError):
        with mask_at_test_time(model, mask_pos_embed=True, gate=0.0, num_layers=2):
            raise RuntimeError("evaluation failed")
    assert model.mask_pos_embed is False and all(layer.gate_override is None for layer in model.local_layers)
