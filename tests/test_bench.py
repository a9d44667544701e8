"""Tests of convit_edu.benchmark_suite: the official GPSA form (timm's computation), interleaving and medians (with fake
timers), activation memory, tables, JSON, the benchmark functions on tiny sizes, the training step they time (the
optimiser and model training builds), the compile's seconds, and every part on the device and precision asked for.
No timing is asserted."""

import itertools
import json
import os
import time

import pytest
import torch
from gpsa_checks import grads, perturb, rel_err

from convit_edu import benchmark_suite as bench
from convit_edu import benchmarks
from convit_edu.benchmark_suite import (BenchSizes, bench_model, compile_seconds, compiled_throughput,
                                        peak_matmul_flops, run_benchmarks, training_flops_per_image)
from convit_edu.benchmarks import (GPSAOfficialForm, format_table, gpsa_layer_bench, interleaved_times, median,
                                   model_throughput, resolution_sweep, saved_activation_bytes, spread, train_step)
from convit_edu.config import TrainConfig
from convit_edu.gpsa import GPSA
from convit_edu.gpsa_reference import GPSAReference
from convit_edu.zoo import count_macs, model_config

pytestmark = pytest.mark.usefixtures("one_thread")


class FakeClock:
    """A timer whose every call advances by the next of some fixed step sizes."""

    def __init__(self, steps):
        self.now, self.steps = 0.0, itertools.cycle(steps)

    def __call__(self):
        self.now += next(self.steps)
        return self.now


def test_interleaved_times_calls_in_turn_after_warmup():
    calls = []
    fns = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    times = interleaved_times(fns, reps=3, warmup=2, timer=FakeClock([1.0]))
    assert calls == ["a", "b"] * 5
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3}


def test_interleaved_times_measures_between_timer_calls():
    # the clock alternates start/stop: start advances 1 s, stop 2 s (a) or 5 s (b)
    times = interleaved_times({"a": lambda: None, "b": lambda: None}, reps=2, warmup=0,
                              timer=FakeClock([1.0, 2.0, 1.0, 5.0]))
    assert times == {"a": [2.0, 2.0], "b": [5.0, 5.0]}


def test_median_and_spread():
    assert median([3.0, 1.0, 2.0]) == 2.0 and median([1.0, 2.0, 3.0, 10.0]) == 2.5
    assert spread([1.0, 2.0, 3.0]) == 1.0 and spread([4.0]) == 0.0
    with pytest.raises(ValueError, match="no timings"):
        median([])


@pytest.mark.parametrize("reps, warmup, message", [(0, 1, "reps must be at least 1, got 0"),
                                                   (2, -1, "warmup must be at least 0, got -1")])
def test_interleaved_times_rejects_bad_counts(reps, warmup, message):
    with pytest.raises(ValueError, match=message):
        interleaved_times({"a": lambda: None}, reps, warmup)


def test_saved_activation_bytes_counts_saved_storages_once_and_skips_excluded():
    w = torch.randn(10, requires_grad=True)
    x = torch.randn(10, requires_grad=True)
    # exp saves its output (40 bytes); w * x saves both w and x, but w is excluded and x counted once
    assert saved_activation_bytes(lambda: x.exp()) == 40
    assert saved_activation_bytes(lambda: (w * x) * x, exclude=[w]) == 40 + 40  # x, and w * x
    with torch.no_grad():
        assert saved_activation_bytes(lambda: x.exp()) == 0


def test_fast_gpsa_saves_at_most_half_the_reference_activations_at_convit_tiny_size():
    torch.manual_seed(0)
    x = torch.randn(32, 196, 192, requires_grad=True)
    ref, fast = GPSAReference(192, 4), GPSA(192, 4)
    m_ref = saved_activation_bytes(lambda: ref(x), ref.parameters())
    m_fast = saved_activation_bytes(lambda: fast(x), fast.parameters())
    assert m_fast <= 0.5 * m_ref


def test_official_form_is_timms_gpsa_and_equals_the_reference():
    """The speed target's baseline computes what timm's GPSA computes, outputs and gradients."""
    timm_convit = pytest.importorskip("timm.models.convit")
    torch.manual_seed(0)
    theirs = timm_convit.GPSA(48, num_heads=4, locality_strength=1.0)
    ours = GPSAOfficialForm(48, 4)
    missing, unexpected = ours.load_state_dict(theirs.state_dict(), strict=False)
    assert not unexpected and not missing, (missing, unexpected)
    perturb(theirs, gates=[-2.0, 0.0, 1.0, 3.0])
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(3, 36, 48, requires_grad=True)
    y_ours, g_ours = grads(ours, x, None)
    y_theirs = theirs(x)
    g_theirs = torch.autograd.grad(
        (y_theirs * torch.linspace(-1, 1, 48)).square().sum(), [x, *theirs.parameters()])
    g_theirs = dict(zip(["x", *dict(theirs.named_parameters())], g_theirs))
    assert rel_err(y_ours, y_theirs) < 1e-6
    assert set(g_ours) == {"x", "qk.weight", "v.weight", "proj.weight", "proj.bias", "pos_proj.weight",
                           "gating_param"}
    for name, g in g_ours.items():
        assert rel_err(g, g_theirs[name]) < 1e-5, name
    ref = GPSAReference(48, 4)
    ref.load_state_dict(ours.state_dict())
    for grid in [(6, 6), (4, 9)]:
        torch.testing.assert_close(ours(x, grid_size=grid), ref(x, grid_size=grid), rtol=1e-5, atol=1e-6)


def test_format_table_aligns_columns_and_formats_floats():
    table = format_table([{"name": "a", "ms": 1.234}, {"name": "long", "ms": 10.0}], floatfmt=".1f")
    assert table.splitlines() == ["name    ms", "   a   1.2", "long  10.0"]
    with pytest.raises(ValueError, match="columns"):
        format_table([{"a": 1}, {"b": 2}])
    with pytest.raises(ValueError, match="at least one row"):
        format_table([])


def test_gpsa_layer_bench_rows_on_a_tiny_layer():
    rows = gpsa_layer_bench(8, 4, batch=1, length=4, reps=1, warmup=0, memory_batch=3, timer=FakeClock([0.5]))
    assert [r["layer"] for r in rows] == ["official", "reference", "fast", "mhsa"]
    for row in rows:
        assert (row["B"], row["L"], row["D"], row["heads"], row["mem_B"]) == (1, 4, 8, 4, 3)
        assert row["fwd_ms"] == row["fwd_bwd_ms"] == 500.0 and row["noise"] == 0.0 and row["act_MiB"] > 0


def test_resolution_sweep_memory_ratio_falls_with_tokens():
    rows = resolution_sweep(16, 4, batch=1, lengths=(16, 64), reps=1, warmup=0, memory_batch=4)
    assert [r["L"] for r in rows] == [16, 64]
    assert rows[1]["mem_ratio"] < rows[0]["mem_ratio"]
    assert rows[1]["ref_MiB"] > rows[0]["ref_MiB"]
    for row in rows:
        assert row["vs_official"] == pytest.approx(row["official_ms"] / row["fast_ms"])
        assert row["vs_ref"] == pytest.approx(row["ref_ms"] / row["fast_ms"])


def test_model_throughput_rows_and_ratio_to_the_last_model():
    rows = model_throughput(["convit_tiny", "deit_tiny"], batch=1, img_size=32, reps=1, warmup=0, num_classes=5,
                            timer=FakeClock([1.0, 0.5, 1.0, 0.25]))
    assert [r["model"] for r in rows] == ["convit_tiny", "deit_tiny"]
    assert rows[0]["images_per_s"] == 2.0 and rows[1]["images_per_s"] == 4.0
    assert rows[0]["vs_last"] == 0.5 and rows[1]["vs_last"] == 1.0


def test_model_throughput_compares_round_by_round():
    """One round slowed on the DeiT's side only (a busy machine) moves the ratio of medians to 0.5; the median of
    the rounds' ratios stays 0.9, and the quartiles show the disturbed round."""
    convit, deit = [1.0, 2.0, 3.0], [0.9, 1.0, 2.7]
    clock = FakeClock([t for pair in zip(convit, deit) for step in pair for t in (0.0, step)])
    rows = model_throughput(["convit_tiny", "deit_tiny"], batch=1, img_size=32, reps=3, warmup=0, num_classes=5,
                            timer=clock)
    assert rows[1]["images_per_s"] / rows[0]["images_per_s"] == pytest.approx(2.0)  # medians 2.0 s and 1.0 s
    assert rows[0]["vs_last"] == pytest.approx(0.9)
    assert (rows[0]["vs_last_q1"], rows[0]["vs_last_q3"]) == (pytest.approx(0.7), pytest.approx(0.9))
    assert rows[1]["vs_last"] == rows[1]["vs_last_q1"] == rows[1]["vs_last_q3"] == 1.0


def test_model_throughput_rejects_unknown_precision():
    with pytest.raises(ValueError, match="precision 'fp8'"):
        model_throughput(["deit_tiny"], 1, 32, 1, precision="fp8")


def test_training_flops_are_six_per_forward_mac():
    macs = count_macs(model_config("convit_tiny", img_size=224)).total()
    assert training_flops_per_image("convit_tiny", 224) == 6 * macs


def test_peak_matmul_flops_is_positive():
    assert peak_matmul_flops(64, 1) > 0


def test_compiled_throughput_times_out_with_a_clear_error():
    with pytest.raises(TimeoutError, match="convit_tiny did not finish within 0 s"):
        compiled_throughput("convit_tiny", 1, 32, 1, timeout_s=0.2)


def test_compiled_throughput_gives_the_child_a_fresh_inductor_cache(monkeypatch):
    """A compile killed mid-way leaves truncated libraries in its cache: each child gets its own, removed after."""
    seen = {}

    class FakeChild:
        returncode, pid = 0, 0

        def __init__(self, cmd, env, **kwargs):
            seen["cache"] = env["TORCHINDUCTOR_CACHE_DIR"]
            seen["fresh"] = os.path.isdir(seen["cache"]) and not os.listdir(seen["cache"])

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def communicate(self, timeout=None):
            return '{"model": "convit_tiny"}\n', ""

    monkeypatch.setattr(bench.subprocess, "Popen", FakeChild)
    assert compiled_throughput("convit_tiny", 1, 32, 1, timeout_s=5) == {"model": "convit_tiny"}
    assert seen["fresh"] and not os.path.exists(seen["cache"])


def test_run_benchmarks_prints_tables_and_writes_json(tmp_path):
    printed = []
    sizes = BenchSizes(layer_batch=1, layer_reps=1, lengths=(16,), sweep_batch=1, sweep_reps=1, img_size=32,
                       tiny_batch=1, small_batch=1, model_reps=1, bf16_img_size=32, bf16_batch=1, matmul_n=32,
                       matmul_reps=1)
    results = run_benchmarks(sizes, json_path=tmp_path / "out" / "bench.json", print_fn=printed.append)
    saved = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert set(saved) == {"meta", *results} and saved["meta"]["threads"] == torch.get_num_threads()
    assert saved["device"] == "cpu" and saved["precision"] == "fp32"
    assert saved["sizes"]["lengths"] == [16] and len(saved["throughput"]) == 8
    assert [r["precision"] for r in saved["throughput"]] == ["fp32"] * 6 + ["bf16"] * 2
    assert [r["precision"] for r in saved["utilisation"]] == ["fp32"] * 6  # against the fp32 peak: fp32 rows only
    assert not any("H100" in p for p in printed)  # no estimate passed off beside measurements
    assert any("throughput:" in p and "convit_small" in p for p in printed)
    assert "compiled" not in results


def test_pipeline_bench_compares_float_and_uint8_loaders_and_the_model_with_train(tmp_path):
    from convit_edu.benchmark_suite import pipeline_bench
    from convit_edu.config import TrainConfig

    cfg = TrainConfig(model="deit_tiny", model_args={"patch_size": 4, "embed_dim": 16, "num_heads": 2, "depth": 1},
                      img_size=16, data="fake", data_args={"num_train": 64, "num_val": 8, "num_classes": 2,
                                                             "image_size": 16},
                      batch_size=8, num_workers=0, precision="fp32", device="cpu", output=str(tmp_path / "x"))
    result = pipeline_bench(cfg, steps=2, num_workers=1)
    assert result["float32_bytes_per_image"] == 4 * result["uint8_bytes_per_image"] == 4 * 3 * 16 * 16
    for key in ("loader_float32_images_per_s_per_worker", "loader_uint8_images_per_s_per_worker",
                "model_images_per_s", "end_to_end_images_per_s"):
        assert result[key] > 0, key
    assert result["end_to_end_vs_model"] == pytest.approx(result["end_to_end_images_per_s"] /
                                                          result["model_images_per_s"])
    assert 0 <= result["pipeline_share_of_step"] <= 1
    assert "end_to_end_data_wait_share" in result  # bench reports how long the end-to-end steps waited for data
    assert not (tmp_path / "x").exists()  # the end-to-end run trains in a temporary folder


def test_pipeline_bench_times_the_model_on_the_runs_device_at_its_precision(tmp_path, monkeypatch):
    """The model-only figure and the end-to-end run must share device and precision, or their ratio means nothing."""
    from convit_edu.benchmark_suite import pipeline_bench

    seen = {}

    def spy(model, batch, img_size, **kwargs):
        seen.update(kwargs)
        raise InterruptedError  # enough seen: skip the timing and the end-to-end run

    monkeypatch.setattr(bench, "measure_model", spy)
    cfg = TrainConfig(model="deit_tiny", model_args={"patch_size": 8, "embed_dim": 16, "num_heads": 2, "depth": 1},
                      img_size=16, data="fake", data_args={"num_train": 16, "num_val": 4, "num_classes": 2,
                                                             "image_size": 16},
                      batch_size=4, num_workers=0, precision="bf16", device="auto", output=str(tmp_path / "x"))
    with pytest.raises(InterruptedError):
        pipeline_bench(cfg, steps=1, num_workers=1)
    assert seen["device"] == torch.device("cpu") and seen["precision"] == "bf16" and seen["compile"] is False


def test_model_throughput_times_the_model_a_training_run_builds(monkeypatch):
    models = []
    monkeypatch.setattr(benchmarks, "train_step", lambda model, *args: models.append(model) or (lambda: None))
    model_throughput(["deit_tiny"], batch=1, img_size=32, reps=1, warmup=0, num_classes=3)
    assert models[0].config.drop_path_rate == TrainConfig().drop_path_rate > 0


def test_the_timed_training_step_uses_the_optimiser_training_builds(monkeypatch):
    built = []
    real = benchmarks.build_optimizer
    monkeypatch.setattr(benchmarks, "build_optimizer", lambda *a, **k: built.append((a, k)) or real(*a, **k))
    model = benchmarks.training_model("deit_tiny", 16, 3)
    train_step(model, 2, 16, 3, "fp32")()  # forward, backward, AdamW step and schedule step
    (cfg, optimised, batch), kwargs = built[0]
    assert optimised is model and batch == 2 and kwargs["device"] == torch.device("cpu")
    assert cfg == TrainConfig()  # a default run's AdamW: two parameter groups, fused on a GPU


def test_compile_seconds_is_the_first_compiled_call_less_a_warm_eager_call():
    # eager: a warm-up call, then one timed (1 s); compiled: its first, compiling calls (5 s and 3 s)
    clock = FakeClock([0.0, 1.0, 0.0, 1.0, 0.0, 5.0, 0.0, 3.0])
    noop = {"train": lambda: None, "infer": lambda: None}
    assert compile_seconds(noop, noop, clock) == (5.0 - 1.0) + (3.0 - 1.0)


def test_bench_model_reports_the_compile_seconds_apart_from_the_rates(monkeypatch):
    class SlowFirstCall(torch.nn.Module):  # stands in for torch.compile: the first call pays 0.2 s
        def __init__(self, model):
            super().__init__()
            self.model, self.calls = model, 0

        def forward(self, x):
            self.calls += 1
            if self.calls == 1:
                time.sleep(0.2)
            return self.model(x)

    monkeypatch.setattr(torch, "compile", SlowFirstCall)
    model = benchmarks.training_model("deit_tiny", 16, 3)
    result = bench_model(model, 2, 16, steps=1, num_classes=3, device="cpu", precision="fp32", compile=True)
    assert result["compile_s"] > 0.2  # two first calls, training and inference, 0.4 s between them
    assert {"train_images_per_s", "infer_images_per_s", "train_images_per_s_bf16"} <= set(result)


def test_run_benchmarks_runs_every_part_on_the_device_at_the_precision(monkeypatch):
    calls = {}

    def spy(part, rows):
        def record(*args, **kwargs):
            calls.setdefault(part, []).append((args, kwargs))
            return rows(*args, **kwargs)
        monkeypatch.setattr(bench, part, record)

    layer = {"layer": "fast", "fwd_bwd_ms": 1.0, "act_MiB": 1.0}
    spy("gpsa_layer_bench", lambda *a, **k: [layer] * 4)
    spy("resolution_sweep", lambda *a, **k: [{"L": 16}])
    spy("model_throughput", lambda names, batch, img_size, reps, precision, **k: [
        {"model": n, "precision": precision, "img_size": img_size, "images_per_s": 1.0} for n in names])
    spy("compiled_throughput", lambda *a, **k: {"model": "convit_tiny"})
    spy("peak_matmul_flops", lambda *a: 1e9)
    sizes = BenchSizes.fast().with_batch(3)
    run_benchmarks(sizes, compile_timeout_s=1.0, print_fn=lambda _: None, device="cpu", precision="bf16")
    cpu = torch.device("cpu")
    for part in ("gpsa_layer_bench", "resolution_sweep", "compiled_throughput"):
        assert all((k["device"], k["precision"]) == (cpu, "bf16") for _, k in calls[part]), part
    assert [(a[1], k["precision"], k["device"]) for a, k in calls["model_throughput"]] == [
        (3, "bf16", cpu), (3, "bf16", cpu), (3, "fp32", cpu), (3, "bf16", cpu)]  # the last two: the comparison
    assert calls["peak_matmul_flops"][0][0][2:] == (torch.bfloat16, cpu)
    batches = [a[2] for a, _ in calls["gpsa_layer_bench"] + calls["resolution_sweep"]]
    assert batches + [calls["compiled_throughput"][0][0][1]] == [3] * 4  # every timed step at --batch-size
