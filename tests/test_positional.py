"""Claims of chapter 02 (nbs/02_positional_attention.py) about convit_edu.positional."""

import pytest
import torch

from convit_edu.positional import grid_coordinates, positional_self_attention, rel_indices


def test_rel_indices_on_a_3x3_grid_written_out_by_hand():
    rel = rel_indices(3, 3)
    assert rel.shape == (9, 9, 3) and rel.dtype == torch.float32
    # tokens row-major: t = row*3 + col; entry [q, k] = (dx, dy, dx^2 + dy^2) with delta = key - query
    centre = [  # query 4 = (row 1, col 1), keys 0..8
        (-1, -1, 2), (0, -1, 1), (1, -1, 2),
        (-1, 0, 1), (0, 0, 0), (1, 0, 1),
        (-1, 1, 2), (0, 1, 1), (1, 1, 2),
    ]
    top_left = [  # query 0 = (row 0, col 0)
        (0, 0, 0), (1, 0, 1), (2, 0, 4),
        (0, 1, 1), (1, 1, 2), (2, 1, 5),
        (0, 2, 4), (1, 2, 5), (2, 2, 8),
    ]
    bottom_right_to_top_middle = (-1, -2, 5)  # query 8 = (2, 2), key 1 = (0, 1)
    assert rel[4].tolist() == [list(map(float, t)) for t in centre]
    assert rel[0].tolist() == [list(map(float, t)) for t in top_left]
    assert rel[8, 1].tolist() == list(map(float, bottom_right_to_top_middle))


def test_non_square_grid_uses_columns_for_dx_and_rows_for_dy():
    H, W = 2, 4
    rel = rel_indices(H, W)
    assert rel.shape == (8, 8, 3)
    # query 1 = (row 0, col 1); key 6 = (row 1, col 2): one right, one down
    assert rel[1, 6].tolist() == [1.0, 1.0, 2.0]
    # query 0 to key 3 = last column of the first row: dx = W - 1
    assert rel[0, 3].tolist() == [3.0, 0.0, 9.0]
    # query 0 to key 4 = first column of the second row
    assert rel[0, 4].tolist() == [0.0, 1.0, 1.0]
    for H, W in [(5, 7), (7, 5), (1, 6), (6, 1)]:
        rel = rel_indices(H, W)
        assert rel.shape == (H * W, H * W, 3)
        assert rel[..., 0].abs().max() == W - 1 and rel[..., 1].abs().max() == H - 1


@pytest.mark.parametrize("H, W", [(3, 3), (5, 7), (14, 14)])
def test_delta_is_antisymmetric_and_squared_distance_symmetric(H, W):
    rel = rel_indices(H, W)
    torch.testing.assert_close(rel[..., :2].transpose(0, 1), -rel[..., :2], rtol=0, atol=0)
    torch.testing.assert_close(rel[..., 2].T, rel[..., 2], rtol=0, atol=0)
    assert (rel.diagonal(dim1=0, dim2=1) == 0).all()


@pytest.mark.parametrize("H, W", [(4, 4), (3, 8)])
def test_third_channel_is_the_squared_distance(H, W):
    rel = rel_indices(H, W)
    torch.testing.assert_close(rel[..., 2], rel[..., 0] ** 2 + rel[..., 1] ** 2, rtol=0, atol=0)
    xy = grid_coordinates(H, W)
    torch.testing.assert_close(rel[..., 2], torch.cdist(xy, xy) ** 2, rtol=0, atol=1e-4)


def test_rel_indices_is_key_minus_query_of_row_major_coordinates():
    H, W = 3, 5
    xy = grid_coordinates(H, W)
    t = torch.arange(H * W)
    assert torch.equal(xy, torch.stack([t % W, t // W], dim=-1).float())
    rel = rel_indices(H, W)
    for q in range(H * W):
        for k in range(H * W):
            assert rel[q, k, :2].tolist() == (xy[k] - xy[q]).tolist()


def test_rel_indices_device_and_dtype():
    rel = rel_indices(2, 3, device="cpu", dtype=torch.float64)
    assert rel.dtype == torch.float64 and rel.device.type == "cpu"
    torch.testing.assert_close(rel.float(), rel_indices(2, 3))


@pytest.mark.parametrize("H, W, name, value", [(0, 3, "height", 0), (3, 0, "width", 0), (-2, 4, "height", -2)])
def test_empty_grid_is_a_value_error_naming_the_size(H, W, name, value):
    with pytest.raises(ValueError, match=f"grid {name} must be at least 1, got {value}"):
        rel_indices(H, W)


def test_non_integer_grid_size_is_a_type_error():
    with pytest.raises(TypeError, match="width must be an integer, got 2.5"):
        rel_indices(3, 2.5)


def test_psa_sums_content_and_position_before_one_softmax():
    torch.manual_seed(0)
    B, Nh, H, W, Dh = 2, 3, 3, 4, 8
    q, k, v = torch.randn(3, B, Nh, H * W, Dh).unbind(0)
    rel = rel_indices(H, W)
    v_pos = torch.randn(Nh, 3)
    out, attn = positional_self_attention(q, k, v, rel, v_pos)
    for b in range(B):
        for h in range(Nh):
            scores = q[b, h] @ k[b, h].T / Dh**0.5 + rel @ v_pos[h]
            expected = torch.softmax(scores, dim=-1)
            torch.testing.assert_close(attn[b, h], expected)
            torch.testing.assert_close(out[b, h], expected @ v[b, h])
    torch.testing.assert_close(attn.sum(-1), torch.ones(B, Nh, H * W))


def test_psa_without_position_is_plain_attention():
    q, k, v = torch.randn(3, 2, 2, 6, 4).unbind(0)
    out, _ = positional_self_attention(q, k, v, rel_indices(2, 3), torch.zeros(2, 3))
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, k, v))


def test_psa_with_local_v_pos_and_no_content_attends_around_the_offset():
    H, W, alpha = 5, 7, 2.0
    centre = torch.tensor([1.0, -1.0])  # one right, one up
    v_pos = alpha * torch.cat([2 * centre, torch.tensor([-1.0])])[None]
    zeros = torch.zeros(1, 1, H * W, 4)
    _, attn = positional_self_attention(zeros, zeros, zeros, rel_indices(H, W), v_pos)
    rel = rel_indices(H, W)
    torch.testing.assert_close(attn[0, 0], torch.softmax(-alpha * ((rel[..., :2] - centre) ** 2).sum(-1), -1))
    q = 2 * W + 3  # row 2, col 3 -> peak at row 1, col 4
    assert attn[0, 0, q].argmax() == 1 * W + 4


def test_psa_shape_errors_name_the_shapes():
    q = torch.zeros(1, 2, 6, 4)
    with pytest.raises(ValueError, match=r"L=6 tokens, got \(9, 9, 3\)"):
        positional_self_attention(q, q, q, rel_indices(3, 3), torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"\(2, 3\), got \(4, 3\)"):
        positional_self_attention(q, q, q, rel_indices(2, 3), torch.zeros(4, 3))
    with pytest.raises(ValueError, match="share one shape"):
        positional_self_attention(q, q[:, :1], q, rel_indices(2, 3), torch.zeros(2, 3))
