"""Bad input to the models of chapters 07-08 is refused early, naming the value and what would be right.

The chapters keep one example each; the other cases they used to show live here."""

import pytest
import torch

from convit_edu.layers import Block, DropPath, PatchEmbed
from convit_edu.models import ModelConfig
from convit_edu.zoo import create_model


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(img_size=225), "img_size 225 \\(image height\\) is not divisible by patch_size 16"),
        (dict(img_size=(224, 150)), "img_size 150 \\(image width\\) is not divisible by patch_size 16"),
        (dict(img_size=(224, 224, 3)), "img_size must be an int or \\(height, width\\), got \\(224, 224, 3\\)"),
        (dict(embed_dim=200, num_heads=3), "embed_dim 200 is not divisible by num_heads 3.*=144 for head_dim 48"),
        (dict(local_up_to_layer=13), "local_up_to_layer 13 must be in \\[0, depth\\) = \\[0, 12\\)"),
        (dict(mlp_ratio=0.0), "mlp_ratio must be positive, got 0.0"),
        (dict(attn_drop_rate=-0.1), "attn_drop_rate must be in \\[0, 1\\), got -0.1"),
    ],
)
def test_model_config_refuses_bad_fields_naming_the_value(fields, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**fields)


def test_model_config_refuses_a_non_integer_width():
    with pytest.raises(TypeError, match="embed_dim must be an integer, got 192.0"):
        ModelConfig(embed_dim=192.0)


def test_an_unknown_zoo_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown model 'convit_huge': choose one of convit_tiny, .*deit_base_plus"):
        create_model("convit_huge")


@pytest.mark.parametrize(
    "images, error, message",
    [
        (torch.randn(1, 3, 225, 224), ValueError, "image size 225x224 is not divisible by patch_size 16: resize"),
        (torch.randn(1, 1, 224, 224), ValueError, "expected images with in_chans=3 channels, got 1"),
        (torch.randn(3, 224, 224), ValueError, "expected images of shape \\(batch, channels, height, width\\)"),
        (torch.randn(1, 3, 224, 224, dtype=torch.float64), TypeError, "float64: pass x.to\\(torch.float32\\)"),
    ],
)
def test_patch_embedding_refuses_bad_images_naming_the_shape_or_dtype(images, error, message):
    with pytest.raises(error, match=message):
        PatchEmbed(patch_size=16, in_chans=3, embed_dim=8)(images)


def test_drop_path_refuses_a_probability_outside_zero_to_one():
    with pytest.raises(ValueError, match="drop path probability must be in \\[0, 1\\), got 1.0"):
        DropPath(1.0)


def test_a_block_refuses_an_unknown_attention_listing_the_choices():
    with pytest.raises(ValueError, match="unknown attention 'sa': choose one of mhsa, gpsa, gpsa_reference, psa"):
        Block(48, 4, attention="sa")
