"""Where a training step's time goes (chapter 44_gpu_time), checked on a CPU: the trace reading (a made-up trace whose
numbers are counted by hand, a real CPU profile), the FLOP count and MFU against a hand count, the datasheet peaks,
and the graphed step's bookkeeping with the CPU's stand-in for a CUDA graph."""

import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

from convit_edu.benchmarks import train_step
from convit_edu.gpu_check_correctness import CheckContext, CheckSizes, collect_environment
from convit_edu.gpu_check_time import (STEPS_MARK, _measured, bf16_peak, graphed_train_step, profile_activity,
                                 step_timings, trace_activity, training_flops)

CPU = torch.device("cpu")


def event(cat: str, name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}


def mark(ts: float = 0, dur: float = 1000) -> dict:
    return event("user_annotation", STEPS_MARK, ts, dur)


def test_the_busy_share_counts_overlapping_gpu_work_once_and_only_inside_the_mark():
    trace = {"traceEvents": [
        mark(1000, 1000),
        event("kernel", "a", 900, 200),  # 1000-1100 inside
        event("kernel", "b", 1050, 40),  # inside a's time: nothing more
        event("gpu_memset", "fill", 1500, 100),  # 100
        event("gpu_memcpy", "copy", 1950, 500),  # 1950-2000 inside
        event("kernel", "late", 2100, 50),  # after the mark: not counted at all
        {"ph": "i", "cat": "kernel", "name": "instant", "ts": 1200},  # not a complete event
    ]}
    found = trace_activity(trace, steps=1)
    assert found["busy_share"] == pytest.approx((100 + 100 + 50) / 1000) and found["gpu_ms"] == pytest.approx(0.25)
    assert (found["kernels"], found["memsets"], found["memcpys"]) == (2, 1, 1)
    assert found["top_kernels"] == [("a", 0.2), ("b", 0.04)] and found["wall_ms"] == 1.0


def test_launch_calls_are_the_hosts_queueing_calls_and_graph_launches_are_counted_apart():
    trace = {"traceEvents": [mark(), *(event("cuda_runtime", "cudaLaunchKernel", t, 1) for t in range(6)),
                             event("cuda_driver", "cuLaunchKernelEx", 10, 1),
                             *(event("cuda_runtime", "cudaGraphLaunch", 20 + t, 1) for t in range(2)),
                             event("cuda_runtime", "cudaMemsetAsync", 30, 1),
                             event("cuda_runtime", "cudaStreamSynchronize", 40, 900),
                             event("cuda_runtime", "cudaEventRecord", 50, 1),
                             event("cpu_op", "aten::add", 60, 5), event("cpu_op", "aten::mul", 70, 5)]}
    found = trace_activity(trace, steps=2)
    assert found["launches"] == 5 and found["graph_launches"] == 1 and found["host_ops"] == 1
    assert found["kernels"] == 0 and found["busy_share"] is None and found["gpu_ms"] is None


@pytest.mark.parametrize("marks", [0, 2])
def test_a_trace_without_exactly_one_steps_mark_is_refused(marks):
    with pytest.raises(ValueError, match=f"holds {marks} 'convit_edu.steps' marks, not one"):
        trace_activity({"traceEvents": [mark() for _ in range(marks)]}, steps=1)


def test_a_cpu_profile_holds_the_hosts_operators_and_no_device_work():
    torch.manual_seed(0)
    step = train_step(nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 4)), 2, 8, 4, "fp32")
    found = profile_activity(step, steps=2, device=CPU)
    assert found["host_ops"] > 10 and found["kernels"] == found["launches"] == 0 and found["busy_share"] is None


def test_step_timings_time_every_step_and_the_host_issue_is_part_of_the_pipelined_time():
    calls = []
    found = step_timings(lambda: calls.append(1), steps=3, device=CPU)
    assert len(calls) == 1 + 3 + 3  # a warm-up, the synchronised steps, the pipelined ones
    assert 0 < found["host_s"] <= found["pipelined_s"] and found["synchronised_s"] > 0


def test_flops_are_the_counters_matmuls_plus_the_attention_three_times_its_forward():
    """A linear layer of 4 inputs and 3 outputs on 2 images: 2·2·4·3 = 48 FLOPs forward, 48 for the weight's gradient
    (the images need none), per image 48; 10 multiply-adds of attention an image: 2 · 3 · 10 = 60 FLOPs."""
    found = training_flops(nn.Linear(4, 3), torch.randn(2, 4), attention_macs=10)
    assert found == {"counted": 48, "attention": 60, "total": 108}


def test_fused_attention_that_the_counter_counts_is_left_out():
    """On the meta device the counter counts the memory-efficient SDPA kernel (as it does on a GPU): left out, the
    count is the projection's alone, forward and weight gradient."""
    class Fused(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(8, 24)

        def forward(self, x):
            q, k, v = self.qkv(x).view(1, 16, 3, 2, 4).permute(2, 0, 3, 1, 4)
            return torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True)[0]

    found = training_flops(Fused().to("meta"), torch.randn(1, 16, 8, device="meta"), attention_macs=0)
    assert found["counted"] == 2 * (2 * 16 * 8 * 24)


def test_mfu_is_the_flops_at_the_pipelined_rate_over_the_peak(tmp_path):
    ctx = CheckContext(replace(CheckSizes.smoke(), steps=1, profiled=1), tmp_path, {}, budget_s=60)
    found = _measured(lambda: None, ctx, batch=8, flops=1e9, peak=4e12)
    assert found["images_per_s"] == pytest.approx(8 / found["pipelined_s"])
    assert found["mfu"] == pytest.approx(1e9 * found["images_per_s"] / 4e12)


@pytest.mark.parametrize("gpu, tflops, listed", [
    ("NVIDIA H100 80GB HBM3", 989.0, "H100"), ("NVIDIA H100 PCIe", 756.0, "H100 PCIe"),
    ("NVIDIA H100 NVL", 835.0, "H100 NVL"), ("NVIDIA H200", 989.0, "H200"), ("NVIDIA H200 NVL", 835.0, "H200 NVL"),
    ("NVIDIA A100-SXM4-80GB", 312.0, "A100")])
def test_the_peak_is_the_datasheets_for_a_listed_gpu(tmp_path, gpu, tflops, listed):
    ctx = CheckContext(CheckSizes.smoke(), tmp_path, {"gpu": gpu}, budget_s=60)
    peak = bf16_peak(ctx)
    assert peak["flops"] == tflops * 1e12 and peak["source"] == f"datasheet: {listed}" and peak["measured"] > 0


def test_the_peak_of_an_unlisted_device_is_measured(tmp_path):
    peak = bf16_peak(CheckContext(CheckSizes.smoke(), tmp_path, {"gpu": None}, budget_s=60))
    assert peak["flops"] == peak["measured"] > 0 and peak["source"] == "measured: 256² bf16 matmul"


def trained(make_step, steps: int) -> torch.Tensor:
    torch.manual_seed(0)
    model = CheckSizes.smoke().model("convit_tiny", drop_path_rate=0.1)
    step = make_step(model)
    for _ in range(steps):
        step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_the_graphed_step_trains_as_train_step_does_with_the_cpus_stand_in_for_the_graph():
    """Five steps: three eager, the capture and a replay (StepGraph's stand-in); the graph's AdamW is the fused one,
    whose roundings differ from train_step's default AdamW, far below one step's change (the warm-up's rate, 1e-6)."""
    sizes = (4, 32, 4, "fp32", CPU)
    plain = trained(lambda model: train_step(model, *sizes), 5)
    graphed = trained(lambda model: graphed_train_step(model, *sizes), 5)
    assert (graphed - plain).abs().max() < 1e-8
    assert (trained(lambda model: graphed_train_step(model, *sizes), 4) - plain).abs().max() > 1e-7


def test_a_graphed_step_in_fp16_is_refused_naming_the_precision():
    with pytest.raises(ValueError, match="bf16 or fp32, not 'fp16'"):
        graphed_train_step(nn.Linear(2, 2), 2, 8, 2, "fp16", CPU)
