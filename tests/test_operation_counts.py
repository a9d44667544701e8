"""The operation counter (chapter 07_operation_counts, a CPU's proxy of a GPU's kernel launches, DESIGN §9) and the
two targets it checks: a fast GPSA layer issues at most twice the operations of DeiT-Ti's MHSA layer, forward and
backward, and a ConViT-Ti training step at most 1.5 times DeiT-Ti's. They count; they do not time."""

import pytest
import torch
from torch import nn

from convit_edu.attention import MHSA
from convit_edu.benchmarks import count_operations, layer_operations, step_operations
from convit_edu.gpsa import GPSA


def names(counter, phase):
    return {name for p, name in counter.counts if p == phase}


def test_the_counter_sorts_operations_by_phase_and_leaves_views_out():
    weight = nn.Parameter(torch.randn(3, 4))
    optimizer = torch.optim.SGD([weight], lr=0.1)

    def step():
        loss = (weight * 2).t().unsqueeze(0).sum()  # t and unsqueeze: views
        loss.backward()
        optimizer.step()

    ops = count_operations(step)
    assert names(ops, "forward") == {"mul.Tensor", "sum.default", "ones_like.default"}  # ones_like: backward's seed
    assert ops.counts["forward", "mul.Tensor"] == 1
    assert ops.total("backward") > 0 and ops.total("optimizer") > 0
    assert ops.total() == ops.total("forward", "backward", "optimizer") == sum(ops.counts.values())
    with pytest.raises(ValueError, match=r"unknown phase \['loss'\]: the phases are \('forward', 'backward'"):
        ops.total("loss")


def test_layer_operations_counts_one_forward_and_backward_under_bf16_autocast_without_the_gradient_seed():
    ops = layer_operations(nn.Linear(8, 4), torch.randn(2, 8))
    assert ops.counts["forward", "_to_copy.default"] == 3  # x, weight and bias cast to bf16, each once
    assert names(ops, "forward") == {"_to_copy.default", "addmm.default"}
    assert {"mm.default", "sum.dim_IntList"} <= names(ops, "backward") and ops.total("optimizer") == 0


def test_operation_counts_depend_on_neither_the_batch_nor_the_grid():
    layer = GPSA(192, 4)
    assert layer_operations(layer, torch.randn(2, 16, 192)).counts == layer_operations(
        layer, torch.randn(3, 25, 192)).counts


def test_a_fast_gpsa_layer_issues_at_most_twice_the_operations_of_the_mhsa_layer_of_deit_ti():
    x = torch.randn(2, 16, 192)
    gpsa, mhsa = layer_operations(GPSA(192, 4), x), layer_operations(MHSA(192, 3, qkv_bias=True), x)
    assert gpsa.total() <= 2 * mhsa.total(), (gpsa.total(), mhsa.total())


def test_a_convit_ti_training_step_issues_at_most_one_and_a_half_times_the_operations_of_deit_ti():
    """The whole step as `train_step` takes it (forward, loss, backward, AdamW and its schedule), and its forward
    and backward alone: on a GPU AdamW is fused, on a CPU it loops over the parameters."""
    convit, deit = (step_operations(name, batch=2, img_size=32) for name in ("convit_tiny", "deit_tiny"))
    assert convit.total() <= 1.5 * deit.total()
    assert convit.total("forward", "backward") <= 1.5 * deit.total("forward", "backward")
