# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     notebook_metadata_filter: -jupytext.text_representation.jupytext_version
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # The zoo's models, changed: other resolutions, ablation switches, masking at test time
#
# Chapter 10 (`10_zoo`) named Table 1's models and counted them, at the 224 px they were built for. Here we change
# them: run a model on images of another size or aspect ratio, or build it for one; switch one ingredient off at a time
# for the paper's ablations (Table 3, App. A); and mask parts of a trained model at test time (SM F, Tables 5-6).

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp masking
# Masking parts of a trained model at test time (SM F): the absolute positional embedding, or the content or the
# positional attention of the GPSA layers.

# %%
#| export
from collections.abc import Iterator
from contextlib import contextmanager

from convit_edu.models import VisionTransformer

# %%
import torch

from convit_edu.checks import check_answer, expect_error
from convit_edu.zoo import create_model

torch.set_printoptions(precision=4, sci_mode=False)
_ = torch.manual_seed(0)

# %% [markdown]
# The model this chapter changes: chapter 10's ConViT-Ti, at initialization.

# %%
torch.manual_seed(0)
convit_ti = create_model("convit_tiny").eval()
print(f"ConViT-Ti: {sum(p.numel() for p in convit_ti.parameters()):,} parameters, built for "
      f"{convit_ti.config.img_size} px images in {convit_ti.config.patch_size}-px patches")

# %% [markdown]
# ## Other resolutions and aspect ratios
#
# A model built for 224 px runs on any image whose sides are multiples of the patch size: `PatchEmbed` returns the
# grid, GPSA layers compute their positional attention on it (H×W, not only square), and `pos_embed` is interpolated.
# To *train* at another size, build the model for it (`img_size=160`): `pos_embed` then has a slot per patch of that
# grid and nothing is interpolated. CIFAR-100 works either way: upsampled to 224, or at 32 px with patch size 4 (an
# 8×8 grid).

# %%
torch.manual_seed(0)
with torch.no_grad():
    for size in [(160, 160), (288, 288), (224, 160)]:
        image = torch.randn(1, 3, *size)
        out = convit_ti(image)
        grids = {tuple(a.shape[-2:]) for a in convit_ti.forward_features(image, return_attention=True).attentions[:10]}
        print(f"image {size[0]}x{size[1]}: logits {tuple(out.shape)}, attention matrices of the GPSA layers {grids}")
        rows, cols = size[0] // 16, size[1] // 16
        assert out.shape == (1, 1000) and grids == {(rows * cols, rows * cols)}
    cifar = create_model("convit_tiny", img_size=32, patch_size=4, num_classes=100).eval()
    out = cifar(torch.randn(2, 3, 32, 32))
print("CIFAR ConViT-Ti, 32 px, patch 4:", tuple(out.shape), "pos_embed", tuple(cifar.pos_embed.shape))
assert out.shape == (2, 100) and cifar.pos_embed.shape == (1, 64, 192)
print(expect_error(lambda: convit_ti(torch.randn(1, 3, 225, 224))))

# %% [markdown]
# ## Switches for the ablations
#
# The paper's ablations change one ingredient at a time: a config field, or `mask_at_test_time` for SM F's tests:
#
# | experiment | switch |
# |---|---|
# | Table 3 [b]: no gating (λ frozen at 0) | `freeze_gating=True` |
# | Table 3 [c]: no convolutional initialization | `use_local_init=False` |
# | Fig. 12 "frozen": freeze the GPSA layers | `freeze_gpsa=True` |
# | Fig. 8, Table 3 [e]: number of GPSA layers (0 = DeiT-like) | `local_up_to_layer=k` |
# | App. A: PSA (Eq. 4) instead of GPSA | `local_attention="psa"` |
# | Table 5: mask the absolute positional embedding at test time | `mask_at_test_time(model, mask_pos_embed=True)` |
# | Table 6: σ(λ) = 1 (no content) or 0 (no position), layers 1..k | `mask_at_test_time(model, gate=g, num_layers=k)` |

# %%
#| export
@contextmanager
def mask_at_test_time(model: VisionTransformer, *, mask_pos_embed: bool = False, gate: float | None = None,
                      num_layers: int | None = None) -> Iterator[VisionTransformer]:
    """Evaluate ``model`` with parts masked off (SM F), restoring it on exit.

    ``mask_pos_embed`` drops the absolute positional embedding (Table 5). ``gate`` replaces σ(λ_h) of every
    head of the first ``num_layers`` GPSA layers (all of them if None) by a constant: 1.0 masks the content
    attention, 0.0 the positional attention (Table 6)."""
    layers = model.gated_layers
    if gate is None and num_layers is not None:
        raise ValueError(f"num_layers={num_layers} needs a gate value (1.0 masks content, 0.0 position)")
    chosen = []
    if gate is not None:
        if not 0.0 <= gate <= 1.0:
            raise ValueError(f"gate replaces σ(λ) and must be in [0, 1], got {gate}")
        if not layers:
            raise ValueError(f"gate needs gated (GPSA) layers; this model has local_up_to_layer="
                             f"{model.config.local_up_to_layer}, local_attention={model.config.local_attention!r}")
        count = len(layers) if num_layers is None else num_layers
        if not 1 <= count <= len(layers):
            raise ValueError(f"num_layers {count} must be in [1, {len(layers)}] (the model's GPSA layers)")
        chosen = layers[:count]
    saved = model.mask_pos_embed, [layer.gate_override for layer in chosen]
    try:
        model.mask_pos_embed = mask_pos_embed
        for layer in chosen:
            layer.gate_override = gate
        yield model
    finally:
        model.mask_pos_embed = saved[0]
        for layer, value in zip(chosen, saved[1]):
            layer.gate_override = value


# %% [markdown]
# Every switch, checked on ConViT-Ti: freezing the gates at λ = 0 leaves 10·4 fewer trainable parameters; without the
# convolutional initialization `v` is no longer the identity; a frozen GPSA layer receives no gradient; 0 GPSA layers
# gives MHSA everywhere and a class token from the first block; PSA has no gates. Forcing σ(λ) = 1 with
# `mask_at_test_time` is the same as a gate parameter so large that σ(λ) rounds to 1; masking the positional embedding
# is the same as a zero `pos_embed`, moves the output far beyond float noise, and the model is restored on exit.

# %%
import copy


def trainable(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


torch.manual_seed(0)
frozen_gates = create_model("convit_tiny", freeze_gating=True)
assert torch.equal(frozen_gates.gates(), torch.full((10, 4), 0.5))
assert trainable(convit_ti) - trainable(frozen_gates) == 10 * 4
no_init = create_model("convit_tiny", use_local_init=False)
assert not torch.equal(no_init.blocks[0].attn.v.weight, torch.eye(192))
assert torch.equal(convit_ti.blocks[0].attn.v.weight, torch.eye(192))
frozen = create_model("convit_tiny", freeze_gpsa=True)
frozen(torch.randn(1, 3, 64, 64)).sum().backward()
assert all(p.grad is None for a in frozen.local_layers for p in a.parameters())
assert frozen.blocks[0].mlp.fc1.weight.grad is not None and frozen.blocks[11].attn.qkv.weight.grad is not None
no_gpsa = create_model("convit_tiny", local_up_to_layer=0)
record = no_gpsa.forward_features(torch.randn(1, 3, 64, 64), return_block_inputs=True)
assert record.num_prefix_tokens == [1] * 12 and no_gpsa.pos_embed.shape == (1, 196, 192)
psa = create_model("convit_tiny", local_attention="psa")
assert not any(hasattr(a, "gating_param") for a in psa.local_layers) and psa.gates().shape == (0, 4)
print("trainable parameters: ConViT-Ti", f"{trainable(convit_ti):,}", "| frozen gates", f"{trainable(frozen_gates):,}",
      "| frozen GPSA", f"{trainable(frozen):,}", "| PSA", f"{trainable(psa):,}")
images = torch.randn(2, 3, 96, 96)
positional_only, no_pos_embed = copy.deepcopy(convit_ti), copy.deepcopy(convit_ti)  # the same weights, to change
with torch.no_grad():
    for layer in positional_only.local_layers[:3]:
        layer.gating_param.fill_(100.0)  # σ(100) = 1 in float32
    no_pos_embed.pos_embed.zero_()
    base = convit_ti(images)
    with mask_at_test_time(convit_ti, gate=1.0, num_layers=3):
        torch.testing.assert_close(convit_ti(images), positional_only(images), atol=1e-5, rtol=1e-5)
        assert (convit_ti.gates()[:3] == 1).all() and (convit_ti.gates()[3:] < 1).all()
    with mask_at_test_time(convit_ti, mask_pos_embed=True):
        masked = convit_ti(images)
    torch.testing.assert_close(masked, no_pos_embed(images), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(convit_ti(images), base)
assert (masked - base).abs().max() > 1e-3  # 100x the tolerance of the comparisons above
print("masked positional embedding = a zero pos_embed; the logits move by more than 1e-3; model restored")

# %% [markdown]
# ## Exercises
#
# How they work (chapter 00_input_checks): replace the placeholder `...` in the answer cell and run the check under it.
#
# **1. Positions for another size.** A ConViT-Ti and a DeiT-Ti are built for 224 × 160 images (height × width,
# `img_size=(224, 160)`, 16-px patches). Without building them, set `pos_slots` to the number of slots (rows) of each
# one's `pos_embed`: `{"convit_tiny": ..., "deit_tiny": ...}`.

# %%
pos_slots = ...  # your answer: pos_slots = {"convit_tiny": ..., "deit_tiny": ...}

# %%
from convit_edu.checks import demonstrate, grade, reveal


def check_pos_slots(answer: dict) -> None:
    check_answer(isinstance(answer, dict) and set(answer) == {"convit_tiny", "deit_tiny"},
                 f"a dict with the keys 'convit_tiny' and 'deit_tiny', got {answer!r}")
    patches = (224 // 16) * (160 // 16)
    for name, answered in answer.items():
        with torch.device("meta"):  # shapes only
            want = create_model(name, img_size=(224, 160), use_local_init=False).pos_embed.shape[1]
        check_answer(answered in (patches, patches + 1), f"{name}: {answered!r} slots: one per patch of the image's "
                     "grid, 224 / 16 rows and 160 / 16 columns, plus a class token's slot if it has one")
        check_answer(answered == want, f"{name}: " + (
            "the DeiT's class token joins at the input, with a slot of its own (class_token_pos_embed)"
            if name == "deit_tiny" else "the ConViT's class token joins after the GPSA layers, with no slot"))


grade("pos_slots", pos_slots, check_pos_slots)
demonstrate(check_pos_slots, {"a list, not a dict": [140, 141],
                              "a square 224-px image": {"convit_tiny": 196, "deit_tiny": 197},
                              "no class slot for the DeiT": {"convit_tiny": 140, "deit_tiny": 140},
                              "a class slot for the ConViT too": {"convit_tiny": 141, "deit_tiny": 141}})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(pos_slots):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    pos_slots = {"convit_tiny": 14 * 10, "deit_tiny": 14 * 10 + 1}  # a 14 x 10 grid; DeiT's class slot
    grade("pos_slots", pos_slots, check_pos_slots)

# %% [markdown]
# **2. Position masked by hand.** The switches' cell masked the content attention of three GPSA layers by hand, with a
# gating parameter so large that σ(λ) rounds to 1. Write `mask_position(model, k)`: a copy of `model` whose first `k`
# GPSA layers attend by content alone (Table 6's σ(λ) = 0), by setting their gating parameters, leaving `model` as it
# is. The check compares its logits with those of `mask_at_test_time(model, gate=0.0, num_layers=k)`.

# %%
mask_position = ...  # your answer: def mask_position(model, k): ...

# %%
def check_mask_position(fn) -> None:
    torch.manual_seed(0)
    model = create_model("convit_tiny", img_size=32, patch_size=8, depth=4, local_up_to_layer=3).eval()
    images, before = torch.randn(2, 3, 32, 32), copy.deepcopy(model.state_dict())
    with torch.no_grad():
        for k in (1, 2):
            changed = fn(model, k)
            check_answer(all(torch.equal(v, model.state_dict()[n]) for n, v in before.items()), "the model itself "
                         "changed: change a copy (copy.deepcopy(model)) and return it")
            check_answer(torch.equal(changed.gates()[k:], model.gates()[k:]), f"k = {k}: only the first k GPSA "
                         "layers are masked; the others keep their gates")
            with mask_at_test_time(model, gate=0.0, num_layers=k):
                want = model(images)
            check_answer(torch.allclose(changed(images), want, atol=1e-5), f"k = {k}: σ(λ) must be 0 there, λ far "
                         "below 0 (-100): σ(0) = ½ still mixes in the positions, and σ(100) = 1 masks the content")


def gates_set(value: float, layers: slice | None = None, copied: bool = True):
    """Gating parameters set to `value` in the first k GPSA layers (all of them with `layers`): the slips shown."""
    def mask(model, k):
        changed = copy.deepcopy(model) if copied else model
        with torch.no_grad():
            for layer in changed.gated_layers[layers or slice(k)]:
                layer.gating_param.fill_(value)
        return changed
    return mask


grade("mask_position", mask_position, check_mask_position)
demonstrate(check_mask_position, {"the model itself changed": gates_set(-100.0, copied=False),
                                  "every GPSA layer": gates_set(-100.0, layers=slice(None)), "λ = 0": gates_set(0.0),
                                  "the content masked instead": gates_set(100.0)})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(mask_position):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    def mask_position(model: torch.nn.Module, k: int) -> torch.nn.Module:
        changed = copy.deepcopy(model)
        with torch.no_grad():
            for layer in changed.gated_layers[:k]:
                layer.gating_param.fill_(-100.0)  # σ(-100) = 0 in float32, to within 1e-43
        return changed

    grade("mask_position", mask_position, check_mask_position)
