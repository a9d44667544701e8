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
# # The command line: `convit-edu train / eval / bench / experiment / data / check-gpu`
#
# Chapters 12-28 wrote one training loop, `train(TrainConfig)`. This chapter puts a command in front of it (chapter
# 43 launches it on one GPU, a node, many nodes and SLURM):
#
# * `convit-edu train` — every field of `TrainConfig`, `ModelConfig` and `AugConfig` is a flag of the same
#   name; **presets** fill in the paper's recipes and print what they expand to;
# * `convit-edu eval` — top-1/top-5 of a checkpoint, with chapter 10's test-time masking (SM F, Tables 5-6);
# * `convit-edu bench` — training and inference images/s and peak memory of a model here, and the loader's;
# * `convit-edu experiment` — chapter 37's grids (Tables 2 and 3 at CPU scale), built from its functions;
# * `convit-edu data tiny-imagenet` — the course's photographs (chapter 00_photographs): downloaded, checked,
#   extracted once;
# * `convit-edu check-gpu` — the GPU check of chapters 44–45, with its own flags (`--smoke`, `--budget-s`, `--phases`,
#   `--output`).

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp cli
# The command line: `convit-edu train / eval / bench / experiment / data / check-gpu`, every config field a flag
# (chapter 22's).

# %%
import contextlib
import io
import tempfile

from convit_edu.config import RECIPES

# %% [markdown]
# ## Presets: the paper's recipes by name
#
# `--preset NAME` applies one of chapter 21's `RECIPES` over the defaults. `deit` is DeiT's ImageNet recipe as the
# ConViT paper uses it (Sec. 3): 300 epochs, global batch 1024 (lr = 5·10⁻⁴ × 1024/512 = 10⁻³), 5 warm-up epochs,
# cosine to 10⁻⁵, AdamW wd 0.05, drop path 0.1, RandAugment, random erasing, Mixup/CutMix, label smoothing, repeated
# augmentation ×3; `imagenet` is `deit` on an ImageNet folder. `cifar100-224` is SM C's CIFAR-100 setting (images
# rescaled to 224 px; the paper trains up to 3000 epochs: pass `--epochs`). `cifar100-32` is the course's setting for
# one GPU or a CPU: 32 px images in 4 × 4 patches, pad-crop-flip without mixing, global batch 128.
# `sample-efficiency` is chapter 35's grid recipe: the command its script prints for any run runs here by hand.
#
# Explicit flags override the preset (its listing, in flags, names each one that did); a preset's global batch holds
# on any number of GPUs. DALI (chapter 18) has no repeated augmentation: `--preset imagenet --loader dali` trains
# with `repeats` 1 and says so in a note (an explicit `--repeats 3` with `--loader dali` is refused, naming the value).

# %%
#| export
import argparse
import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from convit_edu.augment import AugConfig, build_mixup, build_transforms
from convit_edu.benchmark_suite import BenchSizes, bench_model, pipeline_bench, run_benchmarks, save_results
from convit_edu.benchmarks import benchmark_loader
from convit_edu.pretrained import read_state_dict
from convit_edu.checks import number, positive_int
from convit_edu.config import TrainConfig
from convit_edu.config_words import (DefaultsHelp, add_config_flags, as_flags, config_from_args, parse_key_value,
                                     preset_flags)
from convit_edu.datasets import build_datasets
from convit_edu.devices import PRECISIONS, resolve_device, resolve_precision
from convit_edu.evaluation import evaluate
from convit_edu.experiment_design import ABLATIONS, ablation_grid, sample_efficiency_grid, sample_efficiency_scale
from convit_edu.experiments import fixed_test_split, run_grid
from convit_edu.loaders import default_num_workers
from convit_edu.masking import mask_at_test_time
from convit_edu.models import VisionTransformer
from convit_edu.photographs import ARCHIVE_VARIABLE, TINY_IMAGENET_URL, tiny_imagenet
from convit_edu.run_records import RunFolder
from convit_edu.run_state import read_checkpoint
from convit_edu.training import train


# %% [markdown]
# ## One flag per field
#
# The flags are chapter 22's, made from the three dataclasses (`config_words.add_config_flags`): one name per idea,
# for the field, its flag, log key and checkpoint field (`warmup_epochs` is `--warmup-epochs`), with the field's own
# help. Architecture flags fill `model_args`, augmentation flags `aug_args`, `--data-arg KEY=VALUE` fills `data_args`;
# what the run owns (`config.RUN_OWNED`: image size, classes, distillation head, drop path) is the run's flag only.
# `train` reads them with `config_from_args`, the code of `config_from_words`: a grid's printed words train it here.

# %%
#| exporti
def _train_parser(sub) -> None:
    p = sub.add_parser(
        "train", help="train a model", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train a ConViT or DeiT (one process, or one per GPU under torchrun). Precedence: "
                    "TrainConfig defaults < --preset < explicit flags.",
        epilog="examples:\n  convit-edu train --model convit_tiny --preset cifar100-32 --epochs 1\n"
               "  torchrun --nproc_per_node=8 -m convit_edu.cli train --model convit_small --preset imagenet "
               "--data-root /data/imagenet --output runs/convit_small --resume auto")
    p.add_argument("--print-config", action="store_true", help="print the complete config as JSON and exit")
    add_config_flags(p)


# %% [markdown]
# ## The five commands
#
# `main(argv)` returns 0 when the work is done — including a run that a SIGTERM or SIGINT stopped *with a checkpoint
# written* (resume it with `--resume auto`) — and 1 with a one-line message, no traceback, for a bad input (`train`'s
# names settings as flags: `as_flags`, chapter 22) or a non-finite loss. Any other failure is one line too, with its
# type and a pointer to `--debug` (anywhere on the line); Ctrl-C (twice in a run) is 130; an unknown flag is 2, named
# with its command. Under `torchrun` only rank 0 prints. `train` refuses an `--output` holding a run without `--resume`.

# %%
#| export
def run_train(args: argparse.Namespace) -> int:
    cfg, notes = config_from_args(args)
    main_process = os.environ.get("RANK", "0") == "0"
    if main_process and args.preset:
        print(f"preset {args.preset} expands to:", *preset_flags(args.preset, cfg), sep="\n  ")
        for note in notes:
            print(f"note: {note}")
    if not args.print_config:
        folder = RunFolder(cfg.output)
        if cfg.resume is None and folder.holds_run():
            raise FileExistsError(f"{cfg.output} already holds a run (its {folder.last.name}): --resume auto continues "
                                  "it; another --output starts a new one")
        if main_process and cfg.warmup_epochs >= cfg.epochs:  # a short run at the default warm-up of 5 epochs
            print(f"note: --warmup-epochs {cfg.warmup_epochs:g} >= --epochs {cfg.epochs}: the learning rate rises "
                  "the whole run and never reaches its peak (a smaller --warmup-epochs lets it)", flush=True)
        train(cfg)
    elif main_process:
        print(json.dumps(asdict(cfg), indent=2))
    return 0


def run_eval(args: argparse.Namespace) -> int:
    ckpt = read_checkpoint(args.checkpoint)
    given = {k: v for k, v in (("data", args.data), ("data_root", args.data_root), ("classes", args.classes))
             if v is not None}
    cfg = TrainConfig.from_dict({**ckpt["config"], **given})
    model = VisionTransformer(cfg.model_config(ckpt["num_classes"], distilled=cfg.distill_teacher is not None))
    if args.ema and ckpt["ema"] is None:
        raise ValueError(f"checkpoint {args.checkpoint} has no EMA (it was trained without --ema-decay)")
    model.load_state_dict(read_state_dict(ckpt["ema"]) if args.ema else ckpt["model"])
    _, val_tf = build_transforms(cfg.aug_config() or AugConfig(img_size=cfg.img_size))
    _, val_set, classes = build_datasets(cfg.data, cfg.data_root, val_transform=val_tf, max_classes=cfg.classes,
                                         download=False, **cfg.data_args)
    if len(classes) != ckpt["num_classes"]:
        raise ValueError(f"the checkpoint has {ckpt['num_classes']} classes, dataset {cfg.data} has {len(classes)}: "
                         f"pass --classes {ckpt['num_classes']} and the data it was trained on")
    device = resolve_device(args.device)
    with mask_at_test_time(model.to(device), mask_pos_embed=args.mask_pos_embed, gate=args.gate,
                           num_layers=args.gate_layers):
        metrics = evaluate(model, val_set, batch_size=args.batch_size, device=device,
                           precision=resolve_precision(args.precision, device), num_workers=_workers(args))
    print(json.dumps({"checkpoint": str(args.checkpoint), "weights": "ema" if args.ema else "model",
                      "data": cfg.data, "images": len(val_set), "mask_pos_embed": args.mask_pos_embed,
                      "gate": args.gate, "gate_layers": args.gate_layers, **metrics}))
    return 0


def run_bench(args: argparse.Namespace) -> int:
    if args.threads is not None:
        torch.set_num_threads(positive_int("--threads", args.threads))
    device = resolve_device(args.device)  # every part runs here (a GPU asked for and absent: one line, now)
    precision = resolve_precision(args.precision, device)
    if args.suite:  # chapters 30 and 41: GPSA layer, resolution sweep, ConViT vs DeiT throughput, peak fraction
        sizes = BenchSizes.fast() if args.suite == "fast" else BenchSizes.full()
        if args.batch_size is not None:
            sizes = sizes.with_batch(positive_int("--batch-size", args.batch_size))
        run_benchmarks(sizes, compile_timeout_s=args.compile_timeout if args.compile else None, json_path=args.json,
                       device=device, precision=precision)
        return 0
    batch = positive_int("--batch-size", 64 if args.batch_size is None else args.batch_size)
    positive_int("--steps", args.steps)
    model_args = dict(parse_key_value(item, "--model-arg") for item in args.model_arg)
    data_args = dict(parse_key_value(item, "--data-arg") for item in args.data_arg)
    workers = _workers(args)
    cfg = TrainConfig(model=args.model, model_args=model_args, img_size=args.img_size, data=args.data,
                      data_root=str(args.data_root), data_args=data_args, aug=args.aug, batch_size=batch,
                      num_workers=workers, precision=args.precision, device=args.device, compile=args.compile)
    print(f"{args.model} at {args.img_size} px, batch {batch}, {precision} on {device}:")
    measured = bench_model(VisionTransformer(cfg.model_config(args.num_classes, distilled=False)), batch,
                           args.img_size, steps=args.steps, num_classes=args.num_classes, device=device,
                           precision=precision, compile=args.compile)
    for key, value in measured.items():
        print(f"  {key:<28}{value:>10.1f}")
    aug = cfg.aug_config()
    train_tf, _ = build_transforms(aug)
    train_set, _, classes = build_datasets(args.data, args.data_root, download=False, **data_args)
    print(f"data loader on {args.data} ({args.aug} augmentation, {workers} workers):")
    loader = benchmark_loader(train_set, train_tf, batch_size=batch, num_workers=workers,
                              mixup=build_mixup(aug, len(classes)) if len(classes) > 1 else None)
    print(loader)
    print(f"data pipeline against the model ({args.steps} steps of real batches through train):")
    pipeline = pipeline_bench(cfg, steps=args.steps, num_workers=max(1, workers))
    for key, value in pipeline.items():
        print(f"  {key:<42}{value:>10.2f}")
    if args.json:
        save_results({"model": args.model, "img_size": args.img_size, "batch_size": batch, "device": str(device),
                      "precision": precision, **measured, "loader": str(loader), "pipeline": pipeline}, args.json)
    return 0


def _workers(args: argparse.Namespace) -> int:
    """`--num-workers`, or the loader default of training runs (`default_num_workers`) when it is not given."""
    return default_num_workers() if args.num_workers is None else positive_int("--num-workers", args.num_workers, 0)


# %%
#| export
def run_experiment(args: argparse.Namespace) -> int:
    """`experiment sample-efficiency` (Table 2) or `experiment ablations` (Table 3, App. A): chapter 37's grid."""
    common = {"num_workers": args.num_workers, "device": args.device, "progress": args.progress,
              **dict(parse_key_value(item, "--set") for item in args.set)}
    for flag, words, key in (("--model-arg", args.model_arg, "model_args"), ("--aug-arg", args.aug_arg, "aug_args")):
        if words:
            common[key] = dict(parse_key_value(item, flag) for item in words)
    convit_args = dict(parse_key_value(item, "--convit-arg") for item in args.convit_arg)
    def grid(data_root: Path) -> list:  # building the runs' configs checks every setting
        scale = sample_efficiency_scale(data_root, args.classes, args.images_per_run,
                                        positive_int("--warmup-images", args.warmup_images, 0),
                                        convit_args=convit_args, **common)
        return (sample_efficiency_grid(scale, args.fractions, args.seeds) if args.grid == "sample-efficiency" else
                ablation_grid(scale, args.fraction, args.names, args.seeds))
    runs = grid(args.data_root)  # on the source: a mistyped setting leaves no split behind in OUTPUT
    if args.test_per_class or args.first_class:  # a first class needs the split (test_per_class 0 is refused there)
        runs = grid(fixed_test_split(args.data_root, args.output / "data", args.classes, args.test_per_class,
                                     args.dev_per_class, args.first_class))
    run_grid(runs, args.output)
    print((args.output / "table.txt").read_text() if (args.output / "table.txt").is_file() else "no run finished")
    return 0


def run_data(args: argparse.Namespace) -> int:
    """`data tiny-imagenet`: chapter 00_photographs' `tiny_imagenet`, then the path of the tree it made or found."""
    print(tiny_imagenet(args.root, url=args.url, md5=args.md5, archive=args.archive,
                        timeout=number("--timeout", args.timeout, 0, open_low=True)))
    return 0


def run_check_gpu(flags: list[str]) -> int:
    """`check-gpu FLAGS`: the GPU check of chapter 45 (`python -m convit_edu.gpu_check FLAGS`) in a process of its
    own, which a command line of chapter 42 may start but not import; its exit status."""
    return subprocess.run([sys.executable, "-m", "convit_edu.gpu_check", *flags]).returncode


def _experiment_parser(sub) -> None:
    e = sub.add_parser("experiment", help="a grid of the paper's experiments at CPU scale (chapter 37)")
    grids = e.add_subparsers(dest="grid", required=True)
    for name, what in (("sample-efficiency", "Table 2: ConViT and DeiT on fractions of the data"),
                       ("ablations", "Table 3 and App. A: the ConViT taken apart, on one fraction")):
        g = grids.add_parser(name, help=what, formatter_class=DefaultsHelp,
                             description=f"{what}. Runs one after another, resumes a partly finished grid, "
                                         "writes OUTPUT/summary.json, table.txt and the figures.")
        g.add_argument("--data-root", type=Path, required=True, help="ImageNet-style folder: train/ and val/")
        g.add_argument("--output", type=Path, required=True, help="one folder per run, and the summary")
        g.add_argument("--classes", type=int, default=10, help="use K classes, the first or from --first-class")
        g.add_argument("--first-class", type=int, default=0, help="the split's classes start here, in sorted order")
        g.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="one run per seed and cell")
        g.add_argument("--images-per-run", type=int, default=120_000,
                       help="optimiser steps of this many images in every run, whatever the fraction")
        g.add_argument("--warmup-images", type=int, default=10_000,
                       help="the learning rate's warm-up, in images at f = 1 (scaled with the steps like the epochs)")
        g.add_argument("--num-workers", type=int, default=1, help="data loader processes per run")
        g.add_argument("--device", default="auto")
        g.add_argument("--progress", default="auto", help="auto, bar, lines or none (each run's progress)")
        g.add_argument("--test-per-class", type=int, default=100, help="one test set for every run: this many "
                       "training images per class that no fraction trains on, and the validation images (0: none)")
        g.add_argument("--dev-per-class", type=int, default=50, help="training images per class scored in training")
        for flag, what in (("--set", "a TrainConfig field of every run"),
                           ("--model-arg", "a model_args entry of every run (patch_size=4)"),
                           ("--aug-arg", "an aug_args entry of every run"),
                           ("--convit-arg", "a model_args entry of the ConViT only (local_up_to_layer=5)")):
            g.add_argument(flag, action="append", default=[], metavar="KEY=VALUE", help=what)
        if name == "sample-efficiency":
            g.add_argument("--fractions", type=float, nargs="+", default=[0.1, 0.3, 1.0])
        else:
            g.add_argument("--fraction", type=float, default=0.1)
            g.add_argument("--names", nargs="+", default=list(ABLATIONS), choices=list(ABLATIONS),
                           help="ablations to run (convit and deit are shared with Table 2's runs)")
        g.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show the full traceback")


# %%
#| export
def build_parser() -> argparse.ArgumentParser:
    """The `convit-edu` argument parser with its six sub-commands."""
    parser = argparse.ArgumentParser(
        prog="convit-edu", description="Train, evaluate and benchmark ConViT and DeiT models (d'Ascoli et al. 2021).")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True,
                                metavar="{train,eval,bench,experiment,data,check-gpu}")
    _train_parser(sub)
    _experiment_parser(sub)

    e = sub.add_parser("eval", help="top-1/top-5 of a training checkpoint, optionally with parts masked (SM F)",
                       formatter_class=DefaultsHelp)
    e.add_argument("checkpoint", type=Path, help="a checkpoint written by convit-edu train (last.pt, best.pt)")
    e.add_argument("--data", help="dataset name (default: the checkpoint's)")
    e.add_argument("--data-root", help="dataset folder (default: the checkpoint's)")
    e.add_argument("--classes", type=int, help="first K classes (default: the checkpoint's)")
    e.add_argument("--ema", action="store_true", help="evaluate the EMA weights instead of the model's")
    e.add_argument("--mask-pos-embed", action="store_true", help="drop the absolute position embedding (Table 5)")
    e.add_argument("--gate", type=float, help="replace σ(λ) by this value: 1 masks content, 0 position (Table 6)")
    e.add_argument("--gate-layers", type=int, help="apply --gate to the first N GPSA layers only")
    e.add_argument("--batch-size", type=int, default=256, help="images per evaluated batch")
    e.add_argument("--precision", choices=PRECISIONS, default="auto")
    e.add_argument("--num-workers", type=int, help="loader processes (default: this process's CPUs less one)")
    e.add_argument("--device", default="auto")

    b = sub.add_parser("bench", help="training/inference images/s, peak memory, data loader images/s",
                       formatter_class=DefaultsHelp)
    b.add_argument("--model", default="convit_tiny")
    b.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE", help="ModelConfig override")
    b.add_argument("--img-size", type=int, default=224)
    b.add_argument("--num-classes", type=int, default=1000)
    b.add_argument("--batch-size", type=int, help="images per step (default: 64; with --suite: of every timed "
                   "step, default: the suite's own sizes)")
    b.add_argument("--steps", type=int, default=10, help="timed steps after one warm-up step")
    b.add_argument("--precision", choices=PRECISIONS, default="auto", help="of every part, --suite's too")
    b.add_argument("--compile", action="store_true", help="torch.compile the model first; reports compile_s")
    b.add_argument("--device", default="auto", help="where every part runs, --suite's too")
    b.add_argument("--data", default="fake", help="dataset for the loader benchmark")
    b.add_argument("--data-root", default="data")
    b.add_argument("--data-arg", action="append", default=[], metavar="KEY=VALUE", help="e.g. num_train=512")
    b.add_argument("--aug", default="deit", help="augmentation for the loader benchmark (augment.AUGMENTATIONS)")
    b.add_argument("--num-workers", type=int, help="loader processes (default: this process's CPUs less one)")
    b.add_argument("--suite", choices=["fast", "full"],
                   help="instead: chapter 41's whole suite (GPSA layer, resolution, ConViT vs DeiT throughput)")
    b.add_argument("--compile-timeout", type=float, default=120.0,
                   help="with --suite --compile: seconds allowed for torch.compile")
    b.add_argument("--threads", type=int, help="torch threads (default: torch's; 1 is steadier on a shared CPU)")
    b.add_argument("--json", type=Path, help="also write the results to this JSON file")

    d = sub.add_parser("data", help="the course's photographs: downloaded or --archive, checked, extracted once")
    d.add_argument("dataset", choices=["tiny-imagenet"], help="100 classes of Tiny ImageNet (chapter 00_photographs)")
    d.add_argument("--root", type=Path, default=Path("data"), help="writes ROOT/tiny-imagenet-100 (default: data)")
    d.add_argument("--url", default=TINY_IMAGENET_URL, help="the published zip (default: %(default)s)")
    d.add_argument("--md5", help="the archive's MD5 (default: the published one of the zip or the course's tar.gz)")
    d.add_argument("--archive", type=Path, help="the zip or the course's tar.gz, downloaded elsewhere (default: "
                   f"the file ${ARCHIVE_VARIABLE} names, else a download of --url into ROOT)")
    d.add_argument("--timeout", type=float, default=30.0, help="seconds a silent server is given (default: 30)")
    sub.add_parser("check-gpu", add_help=False,  # its flags, --help too, are the check's (chapter 45)
                   help="is this GPU set up right, and how fast does it train? (chapters 44-45: convit-edu check-gpu "
                        "--help lists its flags)")
    for command in sub.choices.values():  # also after the command: `convit-edu train ... --debug`
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help="show the full traceback of an error")
    return parser


def main(argv: list[str] | None = None) -> int:
    """The `convit-edu` console script; returns the exit status."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if args.command == "check-gpu":  # every flag after it is the check's
        return run_check_gpu(unknown)
    if unknown:  # argparse would print the top level's usage: name the command whose flags they are not
        parser.exit(2, f"convit-edu {args.command}: error: unrecognized arguments: {' '.join(unknown)} (convit-edu "
                       f"{args.command} --help lists its flags)\n")
    command = {"train": run_train, "eval": run_eval, "bench": run_bench, "experiment": run_experiment,
               "data": run_data}[args.command]
    try:
        return command(args)
    except KeyboardInterrupt:  # Ctrl-C outside a run, or twice inside one (its last.pt stays as last written)
        print(f"convit-edu {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # one line for the user; --debug shows where it came from
        if args.debug:
            raise
        if isinstance(e, (ValueError, TypeError, OSError, FloatingPointError)):  # ours: they name value and fix
            message = as_flags(str(e)) if args.command == "train" else str(e)  # train's settings are its flags
        else:  # a failure we did not foresee: its first line, and how to see more
            message = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]} (--debug shows the traceback)"
        print(f"convit-edu {args.command}: error: {message}", file=sys.stderr)
        return 1


if __name__ == "__main__" and Path(sys.argv[0]).name == "cli.py":  # `python -m convit_edu.cli`, not a notebook kernel
    sys.exit(main())


# %% [markdown]
# ## `--help`
#
# The top level, then `train`'s flags: its own, then `ModelConfig`'s and `AugConfig`'s (as `--model`, `--aug` set).

# %%
def captured(argv: list[str]) -> tuple[int, str, str]:
    """Run `convit-edu ARGV` in this process; return (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as e:  # argparse exits after --help and on usage errors
            status = e.code
    return status, out.getvalue(), err.getvalue()


status, text, _ = captured(["--help"])
assert status == 0
print(text)
status, text, _ = captured(["train", "--help"])
assert status == 0 and "--local-up-to-layer" in text and "--mixup-alpha" in text and "--warmup-epochs" in text
assert "--loader STR" in text and "dali" in text  # chapter 18's optional DALI loader
print(text)

# %% [markdown]
# `check-gpu` hands every flag after it to chapter 45's GPU check, which runs in a process of its own (this chapter
# may start a later chapter's module, not import it); its `--help`:

# %%
shown = subprocess.run([sys.executable, "-m", "convit_edu.cli", "check-gpu", "--help"], capture_output=True, text=True)
assert shown.returncode == 0 and "--smoke" in shown.stdout and "--phases" in shown.stdout, shown.stderr
print(shown.stdout)

# %% [markdown]
# ## Presets, expanded
#
# A preset prints what it sets before the run starts; `--print-config` prints the whole resolved `TrainConfig`
# and exits — the way to check a command before spending GPU hours on it.

# %%
status, text, _ = captured(["train", "--preset", "cifar100-32", "--epochs", "100", "--print-config"])
assert status == 0 and "  --epochs 300 (overridden: --epochs 100)\n  --global-batch 128" in text
print(text)
resolved = json.loads(text[text.index("{\n"):])
assert resolved["epochs"] == 100 and resolved["img_size"] == 32 and resolved["model_args"] == {"patch_size": 4}
keys = ["data", "aug", "img_size", "epochs", "global_batch", "batch_size", "lr", "repeats"]
print(f"{'preset':<14}" + "".join(f"{k:>14}" for k in keys))
for name, values in RECIPES.items():
    print(f"{name:<14}" + "".join(f"{str(values.get(k, '-')):>14}" for k in keys))

# %% [markdown]
# ## A round trip: train, then evaluate
#
# A tiny ConViT (2 blocks, width 48) trained two epochs on synthetic 16 × 16 images, `eval` of its checkpoint (giving
# back the validation numbers logged) and `eval` with every GPSA layer's positional attention off (`--gate 0`, Table 6).

# %%
TINY = ["--model", "convit_tiny", "--img-size", "16", "--patch-size", "4", "--embed-dim", "48", "--depth", "2",
        "--local-up-to-layer", "1", "--data", "fake", "--data-arg", "num_train=256", "--data-arg", "num_val=64",
        "--data-arg", "image_size=16", "--batch-size", "32", "--warmup-epochs", "0", "--lr", "2e-3",
        "--precision", "fp32", "--num-workers", "0"]
out_dir = Path(tempfile.mkdtemp()) / "tiny"
status, text, err = captured(["train", *TINY, "--epochs", "2", "--progress", "lines", "--log-every", "4",
                              "--output", str(out_dir)])
assert status == 0, err
print(sorted(p.name for p in out_dir.iterdir()))
logged = json.loads((out_dir / "log.jsonl").read_text().splitlines()[-1])

# %%
# NBVAL_IGNORE_OUTPUT
print(text)

# %%
status, text, err = captured(["eval", str(out_dir / "last.pt"), "--num-workers", "0"])
assert status == 0, err
evaluated = json.loads(text)
assert abs(evaluated["top1"] - logged["val_top1"]) < 1e-3 and abs(evaluated["loss"] - logged["val_loss"]) < 1e-3
status, text, err = captured(["eval", str(out_dir / "last.pt"), "--num-workers", "0", "--gate", "0"])
masked = json.loads(text)
assert masked["gate"] == 0 and masked["loss"] != evaluated["loss"]
print("eval gives back the top-1 and loss the training logged; masking changes them")

# %%
# NBVAL_IGNORE_OUTPUT
print(f"top-1 {evaluated['top1']:.2f} % as logged; with positional attention masked (σ(λ) = 0): {masked['top1']:.2f} %")

# %% [markdown]
# ## Bad input: one line, before any work
# Each fails before an image is loaded, naming the wrong value and what works (`tests/test_bad_input.py`: 50 more):

# %%
corrupt = out_dir.parent / "corrupt.pt"
corrupt.write_bytes(b"\x00" * 64)
for argv in (["train", "--model", "convit_huge"],
             ["train", *TINY, "--global-batch", "100", "--accum-steps", "3", "--output", str(out_dir.parent / "x")],
             ["train", *TINY, "--model", "convit_tiny_plus", "--output", str(out_dir), "--resume", "auto"],
             ["train", *TINY, "--output", str(out_dir.parent / "y"), "--resume", str(corrupt)],
             ["train", *TINY, "--output", str(corrupt / "run")], ["train", "--data-root", str(out_dir.parent)],
             ["train", *TINY, "--output", str(out_dir)],
             ["data", "tiny-imagenet", "--root", str(out_dir.parent), "--archive", str(out_dir.parent / "absent.zip")]):
    status, _, err = captured(argv)
    assert status == 1 and "Traceback" not in err
    print(err.strip().replace(str(out_dir.parent), "TMP"))

# %% [markdown]
# ## `bench`
#
# A model's training and inference images/s and peak memory (chapter 41's `bench_model`: on a CPU, fp32 and bf16
# side by side; `--compile` adds the compile's seconds), the loader's images/s by stage (chapter 17), the pipeline
# against the model (chapter 41's `pipeline_bench`). ConViT-Ti, 224 px, batch 16 (FAST: 64 px), 2-core Intel Xeon.

# %%
# NBVAL_IGNORE_OUTPUT
size = "64" if FAST else "224"
status, text, err = captured(["bench", "--model", "convit_tiny", "--img-size", size, "--batch-size", "16",
                              "--steps", "2", "--num-workers", "2", "--data-arg", "num_train=64",
                              "--data-arg", f"image_size={size}"])
assert status == 0, err
print(text)

# %% [markdown]
# `convit-edu bench --suite fast|full [--device D] [--precision P] [--batch-size N] [--threads 1] [--json FILE]`
# runs chapters 30 and 41's measurements (GPSA layer, resolution, ConViT vs DeiT, the matmul peak; `--compile` adds
# `torch.compile`, capped at `--compile-timeout` s). The FAST suite, as a smoke test:

# %%
# NBVAL_IGNORE_OUTPUT
status, text, err = captured(["bench", "--suite", "fast", "--threads", "1"])
assert status == 0 and "gpsa_layer:" in text and "throughput:" in text, err
print(text)
