"""Tests for config_words.config_to_words / config_from_words: one pair of translators between a TrainConfig and the
`convit-edu train` words, read back equal for every kind of setting, with and without a preset."""

import json
import shlex
from dataclasses import asdict, replace

import pytest

from convit_edu.config import RECIPES, TrainConfig, recipe, resolve_config
from convit_edu.config_words import as_flags, config_from_words, config_to_words, preset_flags
from convit_edu.loader_registry import LOADERS

CONFIGS = {  # name: (preset, values on top of it)
    "defaults": (None, {}),
    "run settings": (None, {"model": "deit_small", "epochs": 3, "lr": 1e-3, "warmup_epochs": 0.5, "seed": 7,
                            "data": "imagefolder", "data_root": "my data/with spaces", "output": "runs/x",
                            "eval_every": 2}),
    "None values": (None, {"aug": None, "ema_decay": None, "clip_grad": None, "num_workers": None}),
    "optional values set": (None, {"ema_decay": 0.99996, "clip_grad": 1, "classes": 10, "global_batch": 256,
                                   "num_workers": 0, "resume": "auto", "distill_teacher": "regnety_160",
                                   "teacher_checkpoint": "t.pt"}),
    "booleans": (None, {"compile": True, "model_args": {"use_local_init": False, "freeze_gating": True,
                                                        "qkv_bias": True}}),
    "model_args": (None, {"model_args": {"depth": 6, "embed_dim": 96, "local_up_to_layer": 4, "mlp_ratio": 2.5,
                                         "local_attention": "psa", "locality_strength": 0.5}}),
    "aug_args with tuples and None": (None, {"aug_args": {"scale": (0.35, 1.0), "ratio": (0.5, 2.0),
                                                          "mean": (0.5, 0.5, 0.5), "randaugment_magnitude": None,
                                                          "mixup_alpha": 0.0, "interpolation": "bilinear"}}),
    "data_args of every kind": (None, {"data_args": {"num_train": 64, "image_size": 16, "name": "3", "flag": True,
                                                     "size": (8, 8), "none": None, "word": "none"}}),
    "a string that reads as an option": (None, {"data": "imagefolder", "data_root": "-data", "resume": "-x"}),
    **{f"preset {name}": (name, {}) for name in RECIPES},
    "preset deit with changes": ("deit", {"epochs": 30, "repeats": 1, "global_batch": None, "batch_size": 32}),
    "preset cifar100-32 with dict changes": ("cifar100-32", {
        "model_args": {"depth": 6, "local_up_to_layer": 3, "patch_size": 2}, "aug_args": {"mixup_alpha": 0.2}}),
    "preset sample-efficiency, a ConViT run": ("sample-efficiency", {
        "model": "convit_tiny", "model_args": {"local_up_to_layer": 4, "freeze_gating": True},
        "aug_args": {"scale": (0.5, 1.0)}, "fraction": 0.1, "epochs": 250, "warmup_epochs": 20.0, "seed": 1}),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_words_read_back_into_the_config_they_were_written_from(name):
    preset, values = CONFIGS[name]
    cfg, notes = resolve_config(preset, values)
    assert notes == []
    assert config_from_words(config_to_words(cfg, preset)) == cfg
    assert config_from_words(config_to_words(cfg)) == cfg  # the same config without its preset


def test_the_words_are_the_preset_and_only_what_differs_from_it():
    assert config_to_words(TrainConfig()) == []
    assert config_to_words(TrainConfig(**recipe("imagenet")), "imagenet") == ["--preset", "imagenet"]
    cfg, _ = resolve_config("sample-efficiency", {"model": "convit_tiny", "model_args": {"local_up_to_layer": 4},
                                                  "fraction": 0.1, "epochs": 250, "seed": 1})
    assert config_to_words(cfg, "sample-efficiency") == [
        "--preset", "sample-efficiency", "--model", "convit_tiny", "--local-up-to-layer", "4", "--fraction", "0.1",
        "--epochs", "250", "--seed", "1"]
    assert config_to_words(TrainConfig(aug_args={"scale": (0.3, 1.0)}, compile=True)) == [
        "--scale", "0.3", "1.0", "--compile"]


@pytest.mark.parametrize("name", [name for name, (preset, _) in CONFIGS.items() if preset is not None])
def test_a_presets_listing_is_its_flags_and_names_each_one_a_flag_overrode(name):
    preset, values = CONFIGS[name]
    cfg, _ = resolve_config(preset, values)
    lines = preset_flags(preset, cfg)
    typed = [word for line in lines for word in shlex.split(line.split(" (overridden: ")[0])]
    assert config_from_words(typed) == resolve_config(preset, {})[0]  # typed by hand, the listing is the preset
    overrides = [line.split(" (overridden: ")[1].removesuffix(")") for line in lines if "(overridden: " in line]
    changed = [(key, k) for key, value in recipe(preset).items()
               for k in (value if isinstance(value, dict) else [None])
               if (getattr(cfg, key)[k] != value[k] if k is not None else getattr(cfg, key) != value)]
    assert len(overrides) == len(changed) and all(o in shlex.join(config_to_words(cfg, preset)) for o in overrides)


def test_flags_add_to_a_presets_dicts_and_override_its_values():
    cfg = config_from_words(["--preset", "cifar100-32", "--depth", "6", "--local-up-to-layer", "3", "--epochs", "3",
                             "--data-arg", "num_train=8"])
    assert cfg.model_args == {"patch_size": 4, "depth": 6, "local_up_to_layer": 3}
    assert cfg.epochs == 3 and cfg.global_batch == 128
    assert cfg.data_args == {"num_train": 8}
    with pytest.raises(ValueError, match="model_args {} lacks 'patch_size', which preset cifar100-32 sets"):
        config_to_words(TrainConfig(img_size=32), "cifar100-32")


def test_bad_words_are_a_value_error_naming_them():
    with pytest.raises(ValueError, match="argument --epochs: invalid int value: 'ten'"):
        config_from_words(["--epochs", "ten"])
    with pytest.raises(ValueError, match="unrecognized arguments: --colour"):
        config_from_words(["--colour", "red"])
    with pytest.raises(ValueError, match="invalid choice: 'jft'"):
        config_from_words(["--preset", "jft"])
    with pytest.raises(ValueError, match="--data-arg 'num_train' is not KEY=VALUE"):
        config_from_words(["--data-arg", "num_train"])


@pytest.mark.parametrize("message, expected", [
    ("global_batch 100 is not divisible by accum_steps 3", "--global-batch 100 is not divisible by --accum-steps 3"),
    ("lr must be a finite number", "--lr must be a finite number"),
    ("repeats 3 needs loader 'torchvision'", "--repeats 3 needs --loader 'torchvision'"),
    ("(a resume may change lr, min_lr, precision)", "(a resume may change --lr, --min-lr, --precision)"),
    ("embed_dim 190 (e.g. embed_dim=192)", "--embed-dim 190 (e.g. --embed-dim=192)"),  # a model flag
    ("data_root 'x' is set but data is 'fake'", "--data-root 'x' is set but data is 'fake'"),  # prose stays
    ("classes 200 of the 100 classes at epoch 1", "--classes 200 of the 100 classes at epoch 1"),
    ("num_classes 10, head_dim 48", "num_classes 10, head_dim 48"),  # the run owns one; the other is no setting
    ("/data/global_batch and 'min_lr' and --lr", "/data/global_batch and 'min_lr' and --lr"),  # path, quote, flag
    ("data_root/last.pt, min_lr.txt; seed.", "data_root/last.pt, min_lr.txt; seed."),  # a relative path, a file
    ("it needs data_root.", "it needs --data-root."),  # at a sentence's end
])
def test_as_flags_writes_the_settings_a_message_names_as_their_flags(message, expected):
    assert as_flags(message) == expected


def test_the_dali_loader_drops_a_presets_repeats_with_a_warning(monkeypatch):
    monkeypatch.setitem(LOADERS, "dali", replace(LOADERS["dali"], needs=None))  # the config's check only
    with pytest.warns(UserWarning, match="the preset's repeats 3 becomes 1"):
        cfg = config_from_words(["--preset", "imagenet", "--loader", "dali"])
    assert cfg.repeats == 1 and config_from_words(config_to_words(cfg, "imagenet")) == cfg


def test_a_config_read_back_from_json_equals_the_one_written():
    cfg, _ = resolve_config("sample-efficiency", {"model_args": {"depth": 4}})
    assert TrainConfig.from_dict(json.loads(json.dumps(asdict(cfg)))) == cfg  # tuples were lists in the file


def test_resolve_config_refuses_unknown_settings_and_a_dict_field_given_a_non_dict():
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \['colour'\]"):
        resolve_config(None, {"colour": 1})
    with pytest.raises(TypeError, match="model_args must be a dict of overrides"):
        resolve_config("deit", {"model_args": 6})
