"""Tests of the `convit-edu` command: help, presets, train -> eval round trip, bench, data, bad input."""

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import torch
from test_tiny_imagenet import write_published_zip
from torchvision import datasets

from convit_edu.benchmark_suite import BenchSizes
from convit_edu.cli import build_parser, main
from convit_edu.config import RECIPES, RUN_OWNED, TrainConfig
from convit_edu.config_words import config_from_words
from convit_edu.distributed import SBATCH_SCRIPT
from convit_edu.experiment_design import sample_efficiency_scale, train_command
from convit_edu.experiments import run_config
from convit_edu.photographs import ARCHIVE_VARIABLE, COURSE_DATA
from convit_edu.run_state import read_checkpoint
from convit_edu.zoo import list_models

ROOT = Path(__file__).resolve().parents[1]

TINY = ["--model", "convit_tiny", "--img-size", "16", "--patch-size", "4", "--embed-dim", "48", "--depth", "2",
        "--local-up-to-layer", "1", "--data", "fake", "--data-arg", "num_train=64", "--data-arg", "num_val=32",
        "--data-arg", "image_size=16", "--batch-size", "16", "--precision", "fp32", "--num-workers", "0",
        "--progress", "none"]


pytestmark = pytest.mark.usefixtures("one_thread")


def test_help_names_the_commands_and_one_flag_per_config_field(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and all(c in out for c in ("train", "eval", "bench", "experiment", "data"))
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    for flag in ("--preset", "--warmup-epochs", "--global-batch", "--resume", "--distill-teacher",
                 "--local-up-to-layer", "--locality-strength", "--mixup-alpha", "--label-smoothing", "--compile"):
        assert flag in out, flag


def test_every_setting_has_exactly_one_described_flag():
    from dataclasses import MISSING, fields

    from convit_edu.augment import AugConfig
    from convit_edu.models import ModelConfig

    train = build_parser()._subparsers._group_actions[0].choices["train"]
    flags = [s for a in train._actions for s in a.option_strings if s.startswith("--") and s != "--help"]
    assert len(flags) == len(set(flags)), "a flag appears twice"
    for f in fields(TrainConfig):
        assert f.metadata["help"], f.name
        if f.default is not MISSING:
            assert "--" + f.name.replace("_", "-") in flags, f.name
    for cls in (ModelConfig, AugConfig):
        for f in fields(cls):
            assert (("--" + f.name.replace("_", "-")) in flags) == (f.name not in RUN_OWNED or
                                                                   f.name in {g.name for g in fields(TrainConfig)})


def test_a_preset_prints_its_expansion_and_explicit_flags_override_it(capsys):
    assert main(["train", "--preset", "cifar100-32", "--epochs", "3", "--mixup-alpha", "0.2", "--print-config"]) == 0
    out = capsys.readouterr().out
    expansion, config = out.split("\n{", 1)
    assert "preset cifar100-32 expands to:\n  --epochs 300 (overridden: --epochs 3)\n  --global-batch 128" in expansion
    assert {"  --aug pad-crop-flip", "  --ema-decay none", "  --patch-size 4"} <= set(expansion.splitlines())
    cfg = json.loads("{" + config)
    assert (cfg["epochs"], cfg["img_size"], cfg["global_batch"], cfg["data"]) == (3, 32, 128, "cifar100")
    assert cfg["model_args"] == {"patch_size": 4} and cfg["aug_args"] == {"mixup_alpha": 0.2}
    assert set(RECIPES) == {"deit", "imagenet", "cifar100-32", "cifar100-224", "sample-efficiency"}
    assert RECIPES["deit"]["global_batch"] == 1024 and RECIPES["imagenet"]["data"] == "imagefolder"


def test_train_reads_its_flags_as_config_from_words_does(capsys):
    words = ["--preset", "cifar100-32", "--depth", "6", "--local-up-to-layer", "2", "--no-use-local-init",
             "--scale", "0.5", "1.0", "--ema-decay", "none", "--data-arg", "num_train=8", "--epochs", "3"]
    assert main(["train", *words, "--print-config"]) == 0
    out = capsys.readouterr().out
    assert TrainConfig.from_dict(json.loads(out[out.index("\n{") + 1:])) == config_from_words(words)


def test_a_command_printed_by_a_grid_trains_that_run_by_hand(capsys):
    run = sample_efficiency_scale("data/tiny", class_sizes=(500,) * 10).run("convit", 0.1, seed=1)
    words = shlex.split(train_command(run, "runs/grid"))
    assert words[4:6] == ["--preset", "sample-efficiency"] and "--local-up-to-layer" in words
    assert main([*words[3:], "--print-config"]) == 0
    out = capsys.readouterr().out
    assert TrainConfig.from_dict(json.loads(out[out.index("\n{") + 1:])) == run_config(run, "runs/grid/" + run.name)


def test_unknown_model_or_preset_is_refused_listing_the_valid_ones(tmp_path, capsys):
    assert main(["train", "--model", "convit_huge", "--output", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "unknown --model 'convit_huge'" in err and all(name in err for name in list_models())
    with pytest.raises(SystemExit) as e:
        main(["train", "--preset", "jft"])
    assert e.value.code == 2
    assert "invalid choice: 'jft'" in capsys.readouterr().err


def test_train_then_eval_round_trip_on_fake_data(tmp_path, capsys):
    assert main(["train", *TINY, "--epochs", "1", "--ema-decay", "0.9", "--output", str(tmp_path)]) == 0
    ckpt = read_checkpoint(tmp_path / "last.pt")
    assert ckpt["epoch"] == 1 and ckpt["config"]["model_args"]["embed_dim"] == 48
    logged = ckpt["history"][-1]
    capsys.readouterr()

    assert main(["eval", str(tmp_path / "last.pt"), "--num-workers", "0"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["images"] == 32
    assert result["top1"] == pytest.approx(logged["val_top1"], abs=1e-3)
    assert result["loss"] == pytest.approx(logged["val_loss"], abs=1e-3)

    assert main(["eval", str(tmp_path / "last.pt"), "--num-workers", "0", "--ema"]) == 0
    assert json.loads(capsys.readouterr().out)["top1"] == pytest.approx(logged["ema_top1"], abs=1e-3)
    assert main(["eval", str(tmp_path / "last.pt"), "--num-workers", "0", "--gate", "1.0"]) == 0
    masked = json.loads(capsys.readouterr().out)
    assert masked["gate"] == 1.0 and masked["loss"] != pytest.approx(result["loss"], abs=1e-6)


def test_distillation_from_the_command_line_trains_and_evaluates(tmp_path, capsys):
    assert main(["train", *TINY, "--epochs", "1", "--distill-teacher", "deit_tiny", "--output", str(tmp_path)]) == 0
    ckpt = read_checkpoint(tmp_path / "last.pt")
    assert "head_dist.weight" in ckpt["model"] and "dist_token" in ckpt["model"]
    assert main(["eval", str(tmp_path / "last.pt"), "--num-workers", "0"]) == 0
    assert 0 <= json.loads(capsys.readouterr().out.splitlines()[-1])["top1"] <= 100


def test_bench_reports_rates_memory_and_the_loader(capsys):
    assert main(["bench", "--model", "convit_tiny", "--img-size", "16", "--model-arg", "patch_size=4",
                 "--model-arg", "depth=2", "--model-arg", "local_up_to_layer=1", "--num-classes", "10",
                 "--batch-size", "4", "--steps", "1", "--precision", "fp32", "--num-workers", "0",
                 "--data-arg", "num_train=16", "--data-arg", "image_size=16"]) == 0
    out = capsys.readouterr().out
    for key in ("train_images_per_s", "infer_images_per_s", "peak_memory_mib", "loader", "slowest stage",
                "train_images_per_s_bf16", "uint8_bytes_per_image", "pipeline_share_of_step"):
        assert key in out, key


def test_bench_suite_prints_the_chapter_11_tables_and_writes_json(tmp_path, capsys):
    assert main(["bench", "--suite", "fast", "--json", str(tmp_path / "bench.json")]) == 0
    out = capsys.readouterr().out
    for table in ("gpsa_layer:", "resolution:", "throughput:", "utilisation:", "matmul peak"):
        assert table in out, table
    written = json.loads((tmp_path / "bench.json").read_text())
    assert {"meta", "gpsa_layer", "resolution", "throughput", "utilisation"} <= set(written)
    assert {r["model"] for r in written["throughput"]} == {"convit_tiny", "deit_tiny", "convit_small", "deit_small"}


def test_bench_suite_runs_on_the_device_at_the_precision_and_batch_size_asked_for(monkeypatch):
    seen = {}
    monkeypatch.setattr("convit_edu.cli.run_benchmarks", lambda sizes, **kwargs: seen.update(sizes=sizes, **kwargs))
    assert main(["bench", "--suite", "fast", "--device", "cpu", "--precision", "fp32", "--batch-size", "3"]) == 0
    assert seen["sizes"] == BenchSizes.fast().with_batch(3) and seen["sizes"].small_batch == 3
    assert seen["device"] == torch.device("cpu") and seen["precision"] == "fp32"
    assert main(["bench", "--suite", "full", "--precision", "bf16"]) == 0
    assert seen["sizes"] == BenchSizes.full() and seen["precision"] == "bf16"  # no --batch-size: the suite's own


@pytest.mark.parametrize("args", [["--suite", "fast"], []], ids=["suite", "model"])
def test_bench_on_a_gpu_that_is_not_there_is_one_line_naming_it(monkeypatch, capsys, args):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", *args, "--device", "cuda"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "device 'cuda'" in err and "--device cpu" in err and "Traceback" not in err


def test_bench_suite_refuses_a_batch_size_below_one(capsys):
    assert main(["bench", "--suite", "fast", "--batch-size", "0"]) == 1
    assert "--batch-size must be at least 1, got 0" in capsys.readouterr().err


def test_bench_compile_reports_the_compile_seconds_on_their_own(monkeypatch, capsys):
    monkeypatch.setattr(torch, "compile", lambda model: model)  # Inductor takes minutes on a CPU: the plumbing only
    assert main(["bench", "--model", "deit_tiny", "--img-size", "16", "--model-arg", "patch_size=8",
                 "--model-arg", "depth=1", "--num-classes", "4", "--batch-size", "2", "--steps", "1", "--compile",
                 "--precision", "fp32", "--num-workers", "0", "--data-arg", "num_train=8",
                 "--data-arg", "image_size=16"]) == 0
    assert re.search(r"compile_s +-?\d+\.\d", capsys.readouterr().out)


@pytest.fixture
def refused_port(monkeypatch):
    """A port of 127.0.0.1 that refuses connections (bound, not listening); no proxy in the way."""
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def test_data_tiny_imagenet_extracts_an_archive_once_and_prints_the_folder(tmp_path, capsys):
    published = write_published_zip(tmp_path)
    argv = ["data", "tiny-imagenet", "--root", str(tmp_path / "data"), "--archive", str(published.zip),
            "--md5", published.md5]
    assert main(argv) == 0
    tree = tmp_path / "data" / COURSE_DATA
    assert capsys.readouterr().out.splitlines()[-1] == str(tree)
    assert {p.relative_to(tree).as_posix(): p.read_bytes() for p in tree.rglob("*")
            if p.is_file() and p.name != ".ready.json"} == published.tree
    assert main(argv) == 0
    assert capsys.readouterr().out.splitlines() == [f"{tree} is ready: 3 classes, 9 training and 6 validation images "
                                                    "(from tiny-imagenet-200.zip)", str(tree)]


def test_data_from_an_unreachable_url_is_one_line_naming_it_and_the_archive_flag(tmp_path, capsys, monkeypatch,
                                                                                  refused_port):
    monkeypatch.delenv(ARCHIVE_VARIABLE, raising=False)  # CI names the shared archive there
    url = f"http://127.0.0.1:{refused_port}/tiny-imagenet-200.zip"
    assert main(["data", "tiny-imagenet", "--root", str(tmp_path), "--url", url, "--timeout", "5"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"convit-edu data: error: could not download {url} (") and err.count("\n") == 1
    assert "--archive PATH" in err and "Traceback" not in err and not (tmp_path / COURSE_DATA).exists()


def test_data_with_the_wrong_md5_or_timeout_is_one_line_naming_the_values(tmp_path, capsys):
    published, wrong = write_published_zip(tmp_path), "0123456789abcdef0123456789abcdef"
    argv = ["data", "tiny-imagenet", "--root", str(tmp_path / "data"), "--archive", str(published.zip)]
    assert main([*argv, "--md5", wrong]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"convit-edu data: error: {published.zip} has MD5 {published.md5}, expected {wrong}")
    assert err.count("\n") == 1 and published.zip.is_file() and not (tmp_path / "data" / COURSE_DATA).exists()
    with pytest.raises(ValueError, match=wrong):
        main([*argv, "--md5", wrong, "--debug"])
    assert main([*argv, "--timeout", "0"]) == 1
    assert "--timeout must be a finite number in (0, inf), got 0.0" in capsys.readouterr().err


def test_cifar100_that_cannot_be_downloaded_is_one_line_naming_the_url(tmp_path, capsys, monkeypatch, refused_port):
    url = f"http://127.0.0.1:{refused_port}/cifar-100-python.tar.gz"
    monkeypatch.setattr(datasets.CIFAR100, "url", url)
    assert main(["train", "--preset", "cifar100-32", "--data-root", str(tmp_path / "data"), "--epochs", "1",
                 "--num-workers", "0", "--progress", "none", "--output", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"convit-edu train: error: CIFAR-100 could not be downloaded from {url} into ")
    assert err.count("\n") == 1 and "Traceback" not in err and "Connection refused" in err
    assert not any((tmp_path / "data").rglob("*"))  # no partial download left


@pytest.mark.parametrize("args, message", [
    (["--global-batch", "100", "--accum-steps", "3"], "--global-batch 100 is not divisible by --accum-steps 3"),
    (["--lr", "-1"], "convit-edu train: error: --lr must be a finite number in (0, inf), got -1.0"),  # the flag
    (["--batch-size", "128"], "fewer than one optimiser step of batch 128"),
    (["--data-arg", "num_train"], "--data-arg 'num_train' is not KEY=VALUE"),
    (["--precision", "fp8"], "unknown --precision 'fp8': choose one of"),
], ids=["global-batch", "lr", "batch-too-large", "data-arg", "precision"])
def test_bad_input_gives_a_one_line_error_naming_the_value(tmp_path, capsys, args, message):
    assert main(["train", *TINY, "--output", str(tmp_path), *args]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_resume_refuses_a_corrupt_file_another_model_and_an_unwritable_output(tmp_path, capsys):
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"not a checkpoint")
    assert main(["train", *TINY, "--output", str(tmp_path / "a"), "--resume", str(corrupt)]) == 1
    assert f"{corrupt} is truncated or not a torch checkpoint" in capsys.readouterr().err

    assert main(["train", *TINY, "--epochs", "1", "--output", str(tmp_path / "b")]) == 0
    assert main(["train", *TINY, "--model", "convit_tiny_plus", "--output", str(tmp_path / "b"), "--resume", "auto"]) == 1
    assert "model 'convit_tiny' -> 'convit_tiny_plus'" in capsys.readouterr().err

    (tmp_path / "file").write_text("")
    assert main(["train", *TINY, "--output", str(tmp_path / "file" / "run")]) == 1
    assert "is not writable" in capsys.readouterr().err


def test_train_refuses_to_overwrite_a_run_unless_resume_says_what_to_do(tmp_path, capsys):
    assert main(["train", *TINY, "--epochs", "1", "--output", str(tmp_path)]) == 0
    before = (tmp_path / "last.pt").read_bytes()
    assert main(["train", *TINY, "--epochs", "1", "--output", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path} already holds a run (its last.pt): --resume auto continues it" in err
    assert (tmp_path / "last.pt").read_bytes() == before
    assert main(["train", *TINY, "--epochs", "2", "--output", str(tmp_path), "--resume", "auto"]) == 0
    assert read_checkpoint(tmp_path / "last.pt")["epoch"] == 2
    capsys.readouterr()
    assert main(["train", *TINY, "--epochs", "2", "--output", str(tmp_path), "--resume", "auto"]) == 0
    assert "the run is complete (2 epochs): nothing to train" in capsys.readouterr().out


def test_a_run_shorter_than_its_warm_up_is_noted_before_it_trains(tmp_path, capsys):
    assert main(["train", *TINY, "--epochs", "1", "--output", str(tmp_path / "short")]) == 0  # warm-up: 5 epochs
    out = capsys.readouterr().out
    assert ("note: --warmup-epochs 5 >= --epochs 1: the learning rate rises the whole run and never reaches its peak"
            in out)
    assert main(["train", *TINY, "--epochs", "1", "--warmup-epochs", "0.5", "--output", str(tmp_path / "ok")]) == 0
    assert "never reaches its peak" not in capsys.readouterr().out


@pytest.mark.parametrize("command, shown", [("eval", "batch (default: 256)"), ("bench", "step (default: 10)")])
def test_help_gives_each_default_once(capsys, command, shown):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "(default: None)" not in text and shown in text
    assert "loader processes (default: this process's CPUs less one) --" in text  # said once, by its help


def test_a_data_root_for_random_images_is_refused_naming_the_dataset_flag(tmp_path, capsys):
    assert main(["train", "--data-root", str(tmp_path), "--output", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err
    assert f"--data-root {str(tmp_path)!r} is set but data is 'fake'" in err and "--data imagefolder" in err


def test_a_preset_marks_the_values_explicit_flags_replace(capsys):
    assert main(["train", "--preset", "sample-efficiency", "--lr", "0.01", "--print-config"]) == 0
    listing = capsys.readouterr().out.split("\n{", 1)[0].splitlines()
    assert [line for line in listing if "(overridden:" in line] == ["  --lr 0.016 (overridden: --lr 0.01)"]
    assert "  --scale 0.35 1.0" in listing  # a tuple (read back from JSON a list) is not marked as overridden


def test_ctrl_c_outside_a_run_is_one_line_and_status_130(capsys, monkeypatch):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr("convit_edu.cli.run_bench", interrupted)
    assert main(["bench"]) == 130
    assert capsys.readouterr().err == "convit-edu bench: interrupted\n"


def test_an_unforeseen_error_is_one_line_and_debug_shows_the_traceback(tmp_path, capsys, monkeypatch):
    def broken(cfg):
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nmany more lines")

    monkeypatch.setattr("convit_edu.cli.train", broken)
    assert main(["train", *TINY, "--output", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ["convit-edu train: error: RuntimeError: CUDA error: an illegal memory access "
                                        "was encountered (--debug shows the traceback)"]
    for argv in (["--debug", "train", *TINY], ["train", *TINY, "--debug"]):
        with pytest.raises(RuntimeError, match="illegal memory access"):
            main([*argv, "--output", str(tmp_path)])


STAND_IN_SRUN = """#!/bin/bash
# stands in for srun + torchrun + the trainer: records its arguments, saves and exits 0 on SIGTERM
echo "$@" > "$STAND_INS/srun.args"
echo "$TORCH_ELASTIC_SHUTDOWN_TIMEOUT" > "$STAND_INS/shutdown_timeout"
trap 'touch "$STAND_INS/saved"; exit 0' TERM
touch "$STAND_INS/started"
for _ in $(seq 1 $STEPS); do sleep 0.05; done
"""
STAND_IN_SCONTROL = """#!/bin/bash
case "$1" in
    show) printf 'node1\\nnode2\\n' ;;
    requeue) echo "requeue $2" >> "$STAND_INS/scontrol.log" ;;
esac
"""


def run_sbatch_script(tmp_path, steps: int, usr1: bool):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", STAND_IN_SRUN), ("scontrol", STAND_IN_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (tmp_path / "job.sbatch").write_text(SBATCH_SCRIPT.read_text())  # the file the package ships
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STAND_INS": str(tmp_path), "STEPS": str(steps),
           "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_NNODES": "2"}
    job = subprocess.Popen(["bash", str(tmp_path / "job.sbatch")], env=env, cwd=tmp_path)
    end = time.monotonic() + 30
    while not (tmp_path / "started").exists():
        assert job.poll() is None and time.monotonic() < end, "the training step did not start"
        time.sleep(0.02)
    if usr1:
        job.send_signal(signal.SIGUSR1)  # what --signal=B:USR1@300 does five minutes before the time limit
    return job.wait(timeout=30)


def test_the_sbatch_script_saves_and_requeues_at_the_time_limit(tmp_path):
    assert run_sbatch_script(tmp_path, steps=600, usr1=True) == 0
    assert (tmp_path / "saved").exists()  # the step got SIGTERM and saved
    assert (tmp_path / "scontrol.log").read_text().split("\n")[0] == "requeue 4242"
    args = (tmp_path / "srun.args").read_text()
    assert "--rdzv-endpoint=node1:29500" in args and "--resume auto" in args
    assert (tmp_path / "shutdown_timeout").read_text() == "240\n"  # torchrun's grace period, from the environment


def test_the_sbatch_script_does_not_requeue_a_run_that_finished(tmp_path):
    assert run_sbatch_script(tmp_path, steps=2, usr1=False) == 0
    assert not (tmp_path / "scontrol.log").exists() and not (tmp_path / "saved").exists()


# The options of torch 2.4's torchrun (torch/distributed/run.py), the oldest torch pyproject.toml admits: an option
# added later (--shutdown-timeout) makes an older torchrun refuse to start.
TORCHRUN_2_4_OPTIONS = {
    "--nnodes", "--nproc-per-node", "--nproc_per_node", "--rdzv-backend", "--rdzv_backend", "--rdzv-endpoint",
    "--rdzv_endpoint", "--rdzv-id", "--rdzv_id", "--rdzv-conf", "--rdzv_conf", "--standalone", "--max-restarts",
    "--max_restarts", "--monitor-interval", "--monitor_interval", "--start-method", "--start_method", "--role",
    "-m", "--module", "--no-python", "--no_python", "--run-path", "--run_path", "--log-dir", "--log_dir", "-r",
    "--redirects", "-t", "--tee", "--local-ranks-filter", "--local_ranks_filter", "--node-rank", "--node_rank",
    "--master-addr", "--master_addr", "--master-port", "--master_port", "--local-addr", "--local_addr"}


def torchrun_options(text: str) -> list[list[str]]:
    """The options of each torchrun command of a shell text (lines joined at their `\\`), up to `-m` (its module)."""
    commands = []
    for match in re.finditer(r"(?:^|\bsrun )torchrun (.*)$", text.replace("\\\n", " "), flags=re.M):
        options = []
        for token in match.group(1).split():
            if not token.startswith("-"):
                break
            options.append(token.split("=")[0])
            if token == "-m":
                break
        commands.append(options)
    return commands


def test_every_torchrun_option_of_the_sbatch_script_and_the_readme_is_one_torch_2_4_has():
    from torch.distributed.run import get_args_parser

    assert TORCHRUN_2_4_OPTIONS <= {option for action in get_args_parser()._actions for option in action.option_strings}
    readme = (ROOT / "README.md").read_text()
    script = SBATCH_SCRIPT.read_text()
    commands = torchrun_options(script) + torchrun_options(readme)
    assert len(commands) == 3 and all(options[-1] == "-m" for options in commands), commands
    assert {option for options in commands for option in options} <= TORCHRUN_2_4_OPTIONS
    assert "\nexport TORCH_ELASTIC_SHUTDOWN_TIMEOUT=240\n" in script  # the grace period, as a variable


@pytest.mark.parametrize("argv", [["train", "--epochs", "1", "--no-such-flag"], ["eval", "x.pt", "stray"]])
def test_an_unknown_flag_is_named_with_its_command_not_under_the_top_level_usage(capsys, argv):
    with pytest.raises(SystemExit) as exit:
        main(argv)
    err = capsys.readouterr().err
    assert exit.value.code == 2 and "usage: convit-edu [-h]" not in err
    assert err.strip() == (f"convit-edu {argv[0]}: error: unrecognized arguments: {argv[-1]} (convit-edu {argv[0]} "
                           "--help lists its flags)")
