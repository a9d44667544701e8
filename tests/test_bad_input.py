"""A battery of bad inputs a user could plausibly give, through the API and the command line: each is refused
early with a message that names the value (and, through the CLI, with exit status 1, one line, no traceback)."""

import re
import urllib.error
from pathlib import Path

import pytest
import torch
import torchvision
from torch.utils.data import TensorDataset

from convit_edu import pretrained, cli, evaluation, locality, training, zoo
from convit_edu.augment import AugConfig
from convit_edu.config import TrainConfig, recipe
from convit_edu.datasets import build_datasets
from convit_edu.files import load_file
from convit_edu.loaders import build_loaders
from convit_edu.run_state import read_checkpoint
from convit_edu.samplers import RepeatAugSampler

TINY = dict(model="deit_tiny", model_args={"patch_size": 4, "depth": 1}, img_size=8)


def files(tmp: Path) -> dict[str, Path]:
    """A truncated checkpoint, random bytes, a pickle that is not safe to load, and a foreign torch file."""
    good = tmp / "good.pt"
    torch.save({"model": zoo.create_model("deit_tiny", patch_size=4, depth=1, img_size=8).state_dict()}, good)
    made = {"truncated": good.read_bytes()[: good.stat().st_size // 2], "random": bytes(range(256)) * 8}
    for name, content in made.items():
        (tmp / f"{name}.pt").write_bytes(content)
    torch.save({"weights": Path("x")}, tmp / "unsafe.pt")  # a pathlib object: code a safe loader will not run
    torch.save({"state_dict": {}}, tmp / "foreign.pt")
    return {name: tmp / f"{name}.pt" for name in ("truncated", "random", "unsafe", "foreign")}


API = [
    (lambda t: TrainConfig(lr="1e-3"), TypeError, "lr must be a number, got '1e-3'"),
    (lambda t: TrainConfig(lr=float("inf")), ValueError, "lr must be a finite number"),
    (lambda t: TrainConfig(lr=-1.0), ValueError, "lr must be a finite number in \\(0, inf\\), got -1.0"),
    (lambda t: TrainConfig(epochs=2.5), TypeError, "epochs must be an integer, got 2.5"),
    (lambda t: TrainConfig(epochs=0), ValueError, "epochs must be at least 1, got 0"),
    (lambda t: TrainConfig(seed=-1), ValueError, "seed must be at least 0, got -1"),
    (lambda t: TrainConfig(batch_size=True), TypeError, "batch_size must be an integer, got True"),
    (lambda t: TrainConfig(fraction=0.0), ValueError, "fraction 0.0 is outside \\(0, 1\\]"),
    (lambda t: TrainConfig(classes=0), ValueError, "classes must be at least 1, got 0"),
    (lambda t: TrainConfig(device="tpu"), ValueError, "device 'tpu' is not one of auto, cpu, cuda"),
    (lambda t: TrainConfig(precision="fp8"), ValueError, "unknown precision 'fp8'"),
    (lambda t: TrainConfig(progress="verbose"), ValueError, "unknown progress 'verbose'"),
    (lambda t: TrainConfig(data="imagenet"), ValueError, "unknown dataset 'imagenet': choose one of"),
    (lambda t: TrainConfig(model="convit_huge"), ValueError, "unknown model 'convit_huge'"),
    (lambda t: TrainConfig(aug="imagenet"), ValueError, "augmentation 'imagenet' is now called 'deit'"),
    (lambda t: TrainConfig(aug_args={"scale": (0.9, 0.1)}), ValueError, "scale \\(0.9, 0.1\\) must be an increasing"),
    (lambda t: TrainConfig(aug_args={"scale": (0.5, 2.0)}), ValueError, "its upper end must be at most 1"),
    (lambda t: TrainConfig(model_args={"img_size": 32}), ValueError, "'img_size', which the run owns"),
    (lambda t: TrainConfig(model_args={"locality_strength": -1.0}), ValueError,
     "locality_strength \\(α\\) must be > 0, got -1.0"),
    (lambda t: TrainConfig(ema_decay=1.0), ValueError, "ema_decay must be a finite number in \\(0, 1\\)"),
    (lambda t: TrainConfig(clip_grad=0.0), ValueError, "clip_grad must be a finite number in \\(0, inf\\)"),
    (lambda t: TrainConfig(drop_path_rate=1.0), ValueError, "drop_path_rate must be a finite number in \\[0, 1\\)"),
    (lambda t: TrainConfig(teacher_checkpoint="t.pt"), ValueError, "given without distill_teacher"),
    (lambda t: TrainConfig.from_dict({"learning_rate": 1e-3}), ValueError,
     "unknown setting\\(s\\) \\['learning_rate'\\]"),
    (lambda t: recipe("cifar10"), ValueError, "unknown recipe 'cifar10': choose one of deit"),
    (lambda t: TrainConfig(global_batch=100).per_device_batch(3), ValueError, "global_batch 100 is not divisible"),
    (lambda t: zoo.create_model("convit_tiny")(torch.zeros(1, 3, 224, 224, dtype=torch.uint8)), TypeError,
     "got torch.uint8: pass x.float\\(\\) / 255"),
    (lambda t: zoo.create_model("convit_tiny")(torch.zeros(1, 3, 224, 224, dtype=torch.float64)), TypeError,
     "expected torch.float32 images like the model's weights, got torch.float64"),
    (lambda t: zoo.create_model("convit_tiny", embed_dim=100, num_heads=3), ValueError,
     "embed_dim 100 is not divisible by num_heads 3"),
    (lambda t: pretrained.load_weights(zoo.create_model("deit_tiny"), files(t)["truncated"]), ValueError,
     "truncated.pt is truncated or not a torch checkpoint"),
    (lambda t: pretrained.load_weights(zoo.create_model("deit_tiny"), files(t)["random"]), ValueError,
     "random.pt is truncated or not a torch checkpoint"),
    (lambda t: load_file(files(t)["unsafe"]), ValueError, "cannot be loaded safely"),
    (lambda t: locality.gates(files(t)["truncated"]), ValueError, "is truncated or not a torch checkpoint"),
    (lambda t: read_checkpoint(files(t)["foreign"]), ValueError, "not a convit-edu training checkpoint"),
    (lambda t: read_checkpoint(t / "missing.pt"), FileNotFoundError, "no checkpoint file at"),
    (lambda t: build_datasets("fake", fraction=1.5), ValueError, "fraction 1.5 is outside \\(0, 1\\]"),
    (lambda t: build_datasets("fake", num_train=100, fraction=0.05), ValueError,
     "fraction 0.05 keeps none of the 10 images of class 0; use fraction >= 0.1"),
    (lambda t: build_datasets("fake", max_classes=1000), ValueError,
     "max_classes 1000 is larger than the 10 classes of the fake data"),
    (lambda t: AugConfig(hflip=1.5), ValueError, "hflip 1.5 is a probability"),
    (lambda t: RepeatAugSampler(10, 2, 2), ValueError, "rank 2 must lie in 0..1"),
    (lambda t: build_loaders(TensorDataset(torch.zeros(2)), TensorDataset(torch.zeros(2)), batch_size=1,
                             num_replicas=3), ValueError, "3 processes but the training set has only 2 samples"),
    (lambda t: evaluation.evaluate(torch.nn.Linear(2, 2), TensorDataset(torch.zeros(0, 2), torch.zeros(0).long())),
     ValueError, "the evaluation set is empty"),
    (lambda t: training.train(TrainConfig(**TINY, aug=None, output=str(t / "run"), progress="none"),
                              datasets=(TensorDataset(torch.zeros(8, 3, 8, 8), torch.zeros(8).long()),
                                        TensorDataset(torch.zeros(2, 3, 8, 8), torch.zeros(2).long()), ["only"])),
     ValueError, "the dataset has 1 class\\(es\\) \\(only\\): a classifier needs at least two"),
]


@pytest.mark.parametrize("call, error, match", API, ids=[f"api{i}" for i in range(len(API))])
def test_the_api_refuses_bad_input_naming_the_value(tmp_path, call, error, match):
    with pytest.raises(error, match=match) as caught:
        call(tmp_path)
    assert "weights_only=False" not in str(caught.value)


def test_a_dataset_that_is_not_there_is_refused_naming_the_folder(tmp_path):
    missing = tmp_path / "imagenet"
    with pytest.raises(FileNotFoundError, match=rf"^{re.escape(str(missing))} has no train/ and val/ folders "
                                                 r"\(folder missing\)"):
        build_datasets("imagefolder", missing)
    with pytest.raises(FileNotFoundError, match=re.escape(f"CIFAR-100 not found (or its checksums do not match) "
                                                          f"under {tmp_path}/cifar-100-python")):
        build_datasets("cifar100", tmp_path, download=False)


def test_a_failed_cifar_download_says_what_to_do_offline(tmp_path, monkeypatch):
    def offline(self):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(torchvision.datasets.CIFAR100, "download", offline)
    url = torchvision.datasets.CIFAR100.url
    with pytest.raises(FileNotFoundError, match=re.escape(f"could not be downloaded from {url} into {tmp_path}")
                       + ".* download that file elsewhere"):
        build_datasets("cifar100", tmp_path)


RUN = ["--data", "fake", "--data-arg", "num_train=16", "--data-arg", "num_val=8", "--data-arg", "image_size=8",
       "--model", "deit_tiny", "--patch-size", "4", "--depth", "1", "--img-size", "8", "--num-workers", "0",
       "--progress", "none", "--epochs", "1", "--batch-size", "4"]
CLI = [
    (["train", *RUN, "--lr", "inf"], "lr must be a finite number"),
    (["train", *RUN, "--seed", "-1"], "seed must be at least 0, got -1"),
    (["train", *RUN, "--scale", "0.9", "0.1"], "scale (0.9, 0.1) must be an increasing pair"),
    (["train", *RUN, "--device", "tpu"], "device 'tpu' is not one of"),
    (["train", *RUN, "--aug", "imagenet"], "augmentation 'imagenet' is now called 'deit'"),
    (["train", *RUN, "--print-config", "--lr", "-1", "--epochs", "0"], "epochs must be at least 1, got 0"),
    (["train", *RUN, "--data-arg", "num_train"], "--data-arg 'num_train' is not KEY=VALUE"),
    (["train", *RUN, "--teacher-checkpoint", "t.pt"], "--teacher-checkpoint t.pt given without --distill-teacher"),
    (["bench", "--threads", "0"], "--threads must be at least 1, got 0"),
    (["bench", "--batch-size", "0"], "--batch-size must be at least 1, got 0"),
    (["eval", "missing.pt"], "no checkpoint file at missing.pt"),
]


@pytest.mark.parametrize("argv, message", CLI, ids=[f"cli{i}" for i in range(len(CLI))])
def test_the_command_line_refuses_bad_input_in_one_line(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    assert cli.main([*argv, "--output", str(tmp_path / "run")] if argv[0] == "train" else argv) == 1
    captured = capsys.readouterr()
    assert message in captured.err and "Traceback" not in captured.err, captured.err
    assert len(captured.err.strip().splitlines()) == 1


@pytest.mark.parametrize("make, match", [
    (lambda: AugConfig(std=(0, 0, 0)), r"std \(0, 0, 0\) must be three positive numbers"),
    (lambda: AugConfig(std=(0.2, -0.1, 0.2)), r"std \(0.2, -0.1, 0.2\) must be three positive numbers"),
    (lambda: AugConfig(std=(0.2, 0.2)), r"std \(0.2, 0.2\) must be three positive numbers"),
    (lambda: AugConfig(mean=(1.5, 0.4, 0.4)), r"mean \(1.5, 0.4, 0.4\) must be three numbers in \[0, 1\]"),
    (lambda: TrainConfig(aug_args={"std": (0, 0, 0)}), r"std \(0, 0, 0\) must be three positive numbers"),
])
def test_normalisation_constants_are_refused_when_the_config_is_made(make, match):
    with pytest.raises(ValueError, match=match + r" \(per-channel .* ImageNet's: "):
        make()


def test_the_command_line_refuses_a_zero_std_before_training(capsys):
    assert cli.main(["train", "--std", "0", "0", "0", "--print-config"]) == 1
    err = capsys.readouterr().err
    assert "std (0.0, 0.0, 0.0) must be three positive numbers" in err and "Traceback" not in err, err
