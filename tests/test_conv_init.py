"""Eq. 5, the convolutional initialisation, and Cordonnier et al.'s PSA = convolution construction."""

import math
import warnings

import pytest
import torch
from torch import nn

from convit_edu.conv_attention import ConvAsPSA
from convit_edu.conv_init import head_centres, local_init, v_pos
from convit_edu.gpsa import GPSA
from convit_edu.positional import rel_indices


def positional_attention(pos_proj: nn.Linear, height: int, width: int) -> torch.Tensor:
    """Softmax over keys of the positional scores, (heads, L queries, L keys)."""
    return pos_proj(rel_indices(height, width)).softmax(dim=1).permute(2, 0, 1).detach()


def test_head_centres_follow_the_official_convention():
    # h = h1 + k·h2 sits at Δ = (h2 − c, h1 − c): for 9 heads, k = 3, c = 1
    expected = [(h // 3 - 1, h % 3 - 1) for h in range(9)]
    assert head_centres(9).tolist() == [list(map(float, e)) for e in expected]
    # even k: half-integer centres around the query
    assert head_centres(4).tolist() == [[-0.5, -0.5], [-0.5, 0.5], [0.5, -0.5], [0.5, 0.5]]


@pytest.mark.parametrize("num_heads", [4, 9, 16])
@pytest.mark.parametrize("alpha", [1.0, 3.0])
def test_each_head_attention_peaks_at_query_plus_its_centre(num_heads, alpha):
    pos_proj = nn.Linear(3, num_heads)
    local_init(pos_proj, nn.Linear(8, 8), alpha)
    height, width = 9, 11
    attn = positional_attention(pos_proj, height, width)
    rows, cols = 4, 5
    query = rows * width + cols
    for h, (dx, dy) in enumerate(head_centres(num_heads).tolist()):
        a = attn[h, query].reshape(height, width)
        if dx == int(dx):  # odd k: one pixel is the maximum
            peak = int(a.argmax())
            assert (peak // width - rows, peak % width - cols) == (dy, dx)
        else:  # even k: the centre is half-way between pixels; the attention's centre of mass is there
            ys, xs = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
            centre = ((a * xs).sum() - cols, (a * ys).sum() - rows)
            assert math.isclose(centre[0], dx, abs_tol=1e-3) and math.isclose(centre[1], dy, abs_tol=1e-3)


def test_local_init_sets_v_pos_rows_and_identity_values():
    pos_proj, v = nn.Linear(3, 9), nn.Linear(12, 12)
    local_init(pos_proj, v, 2.0)
    centres = head_centres(9)
    expected = 2.0 * torch.cat([2 * centres, -torch.ones(9, 1)], dim=1)
    torch.testing.assert_close(pos_proj.weight, expected)
    torch.testing.assert_close(pos_proj.weight, v_pos(centres, 2.0))
    torch.testing.assert_close(v.weight, torch.eye(12))
    assert torch.all(v.bias == 0)


def test_non_square_head_count_initialises_only_k_squared_heads_and_warns_once():
    torch.manual_seed(0)
    pos_proj = nn.Linear(3, 6)
    before = pos_proj.weight.detach().clone()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        local_init(pos_proj, nn.Linear(4, 4), 1.0)
        layers = [GPSA(48, 6) for _ in range(10)]
    messages = [str(w.message) for w in caught if "not a perfect square" in str(w.message)]
    assert len(layers) == 10 and len(messages) == 1  # eleven layers initialised, one warning
    assert "only 4 heads" in messages[0]
    torch.testing.assert_close(pos_proj.weight[4:], before[4:])  # the two extra heads keep their init
    torch.testing.assert_close(pos_proj.weight[:4], v_pos(head_centres(4), 1.0))


@pytest.mark.parametrize("kernel_size, padding", [(3, 1), (2, 0), (3, 0)])
def test_psa_with_k_squared_heads_reproduces_a_random_convolution(kernel_size, padding):
    torch.manual_seed(kernel_size)
    conv = nn.Conv2d(3, 5, kernel_size=kernel_size, padding=padding)
    x = torch.randn(2, 3, 7, 9)
    with torch.no_grad():
        expected = conv(x)
        got = ConvAsPSA(conv, locality_strength=20.0)(x)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_convolution_error_falls_as_alpha_grows():
    torch.manual_seed(0)
    conv = nn.Conv2d(2, 3, kernel_size=3, padding=1)
    x = torch.randn(1, 2, 6, 6)
    with torch.no_grad():
        errors = [(ConvAsPSA(conv, a)(x) - conv(x)).abs().max().item() for a in (1.0, 4.0, 8.0, 12.0)]
    assert errors == sorted(errors, reverse=True) and errors[-1] < 1e-3 < errors[0]


@pytest.mark.parametrize("alpha", [0.0, -1.0, float("nan")])
def test_non_positive_locality_strength_is_refused(alpha):
    with pytest.raises(ValueError, match="locality_strength"):
        local_init(nn.Linear(3, 4), nn.Linear(4, 4), alpha)
    with pytest.raises(ValueError, match="locality_strength"):
        ConvAsPSA(nn.Conv2d(1, 1, 3), alpha)
    with pytest.raises(ValueError, match="locality_strength"):
        v_pos(head_centres(4), alpha)


def test_conv_as_psa_refuses_convolutions_it_cannot_express():
    with pytest.raises(ValueError, match="conv.stride"):
        ConvAsPSA(nn.Conv2d(1, 1, 3, stride=2), 10.0)
    with pytest.raises(ValueError, match="conv.groups"):
        ConvAsPSA(nn.Conv2d(2, 2, 3, groups=2), 10.0)
