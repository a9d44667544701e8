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
# # A config as command-line words, and back
#
# A run has one shape, a `TrainConfig`, and one way to be written as a command. Every `TrainConfig` field is a flag of
# the same name (`warmup_epochs` is `--warmup-epochs`); the dict fields gather the flags of what they override: each
# `ModelConfig` field is a flag filling `model_args` (`--local-up-to-layer 4`), each `AugConfig` field one filling
# `aug_args` (`--mixup-alpha 0`), and `--data-arg KEY=VALUE` fills `data_args`; those the run owns (`RUN_OWNED`) are
# the run's flags only. Booleans are `--flag` / `--no-flag`, `None` is `none`, a range is one word per number.
#
# `config_to_words` writes a config as `--preset NAME` and a flag for every setting that differs from what the recipe
# gives; `config_from_words` reads words back: defaults < preset < flags, the dict fields merged key by key
# (`--local-up-to-layer 4` keeps the preset's patch size; `resolve_config` does the same for values). The command line
# (chapter 42) builds its `train` parser from these flags (`add_config_flags`, `config_from_args`) and the experiment
# grids (chapters 35, 37) print their runs with `config_to_words`: one pair of translators, so any run of a grid can be
# repeated by hand from the words it prints. One setting gives way: the DALI loader (chapter 18) has no `repeats`, so
# a preset's `repeats` becomes 1 under `loader` 'dali', with a note (an explicit `--repeats 3` is still refused).
# The translators are their own module, `convit_edu.config_words`; `convit_edu.config` holds the config itself.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
from typing import Any

from convit_edu.checks import expect_error
from convit_edu.config import RECIPES, TrainConfig, _check_names, recipe
from convit_edu.loader_registry import LOADERS

# %%
#| export config
DICT_FIELDS = ("model_args", "aug_args", "data_args")  # overrides of another dataclass's fields, merged by key


def resolve_config(preset: str | None, values: dict[str, Any]) -> tuple[TrainConfig, list[str]]:
    """The config of recipe `preset` (None: the defaults) with `values` on top — defaults < preset < values, the
    dict fields (`model_args`, `aug_args`, `data_args`) merged key by key — and notes on what the preset could
    not keep: a preset's `repeats` gives way to a `loader` without repeated augmentation (`LOADERS`: 'dali')."""
    _check_names(values)
    merged = recipe(preset) if preset is not None else {}
    for key, value in values.items():
        if key in DICT_FIELDS and not isinstance(value, dict):
            raise TypeError(f"{key} must be a dict of overrides, e.g. {{'depth': 6}}, not {value!r}")
        merged[key] = {**merged.get(key, {}), **value} if key in DICT_FIELDS else value
    notes, loader = [], LOADERS.get(merged.get("loader", TrainConfig.loader))
    if loader is not None and not loader.repeats and merged.get("repeats", 1) != 1 and "repeats" not in values:
        notes.append(f"loader {merged['loader']} has no repeated augmentation: the preset's repeats "
                     f"{merged['repeats']} becomes 1 (each image once per epoch; --loader torchvision keeps it)")
        merged["repeats"] = 1
    return TrainConfig(**merged), notes


# %%
#| default_exp config_words
# A config as command-line words and back: the `train` command's flags (one per setting), the namespace they parse
# into, and the words that give back a config.

# %%
#| export
import argparse
import ast
import re
import shlex
import typing
import warnings
from collections.abc import Sequence
from dataclasses import MISSING, Field, fields
from typing import Any

from convit_edu.augment import AugConfig
from convit_edu.config import DICT_FIELDS, RECIPES, RUN_OWNED, TrainConfig, recipe, resolve_config
from convit_edu.models import ModelConfig

_OVERRIDES = {  # TrainConfig field: (the dataclass it overrides, the prefix of its flags' dests, the group's title)
    "model_args": (ModelConfig, "model", "model architecture (convit_edu.models.ModelConfig; defaults shown are "
                                         "ConViT-Ti's, unset flags keep those of --model)"),
    "aug_args": (AugConfig, "aug", "augmentation (convit_edu.augment.AugConfig; defaults shown are those of the deit "
                                   "augmentation, unset flags keep those of --aug)")}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _parse_value(text: str) -> Any:
    """`3` -> 3, `0.5` -> 0.5, `none` -> None, `true` -> True, `(1, 2)` -> (1, 2), anything else -> the string."""
    special = {"none": None, "null": None, "true": True, "false": False}
    if text.strip().lower() in special:
        return special[text.strip().lower()]
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _value_word(value: Any) -> str:
    """The word `_parse_value` reads back as `value`: `none`, `3`, `0.5`, `(1, 2)`, a plain string, or a quoted
    one where the plain one would read as something else (`'3'`, `'none'`)."""
    word = "none" if value is None else str(value)
    if _parse_value(word) == value and type(_parse_value(word)) is type(value):
        return word
    if _parse_value(repr(value)) != value:
        raise ValueError(f"{value!r} cannot be written as a command-line word (a number, string, bool, tuple or None)")
    return repr(value)


def _kind(f: Field) -> tuple[str, list[type]]:
    """How field `f` is a flag: "bool" (--x / --no-x), "tuple" (one word per number), "parsed" (`_parse_value`:
    a field that may be None or of several types) or "plain" (its default's type); and its non-None types."""
    default = f.default if f.default is not MISSING else f.default_factory()
    types = [t for t in typing.get_args(f.type) if t is not type(None)]
    if isinstance(default, (bool, tuple)):
        return ("bool" if isinstance(default, bool) else "tuple"), types
    return ("parsed" if types or default is None else "plain"), types


def _add_flag(group, f: Field, dest: str) -> None:
    """One flag for dataclass field `f`, storing into `dest`; unset flags stay out of the namespace."""
    default = f.default if f.default is not MISSING else f.default_factory()
    help = f"{f.metadata.get('help', '')} (default: {default})".strip()
    kwargs = dict(dest=dest, default=argparse.SUPPRESS, help=help)
    kind, types = _kind(f)
    if kind == "bool":
        group.add_argument(_flag(f.name), action=argparse.BooleanOptionalAction, **kwargs)
    elif kind == "tuple":
        group.add_argument(_flag(f.name), type=float, nargs=len(default), metavar="X", **kwargs)
    elif kind == "parsed":
        metavar = "|".join(t.__name__.upper() for t in types) or "VALUE"
        group.add_argument(_flag(f.name), type=_parse_value, metavar=metavar, **kwargs)
    else:
        group.add_argument(_flag(f.name), type=type(default), metavar=type(default).__name__.upper(), **kwargs)


def _field_words(f: Field, value: Any) -> list[str]:
    """The words of `f`'s flag that set it to `value` (`_add_flag`'s inverse)."""
    kind, _ = _kind(f)
    if kind == "bool":
        return [_flag(f.name) if value else "--no-" + f.name.replace("_", "-")]
    if kind == "tuple":
        return [_flag(f.name), *map(str, value)]
    word = _value_word(value) if kind == "parsed" else str(value)
    return [f"{_flag(f.name)}={word}"] if word.startswith("-") else [_flag(f.name), word]  # "-x" is no option


def parse_key_value(item: str, flag: str) -> tuple[str, Any]:
    """A `KEY=VALUE` word of `flag` (`--data-arg num_train=512`) as (key, value), the value read as every flag's
    is (`3`, `0.5`, `none`, `true`, `(1, 2)` or a string); ValueError when there is no `=`."""
    key, sep, value = item.partition("=")
    if not sep:
        raise ValueError(f"{flag} {item!r} is not KEY=VALUE")
    return key, _parse_value(value)


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """`--preset`, `--data-arg` and one flag per setting (`TrainConfig`'s, then its `model_args`' and `aug_args'`
    fields, each group under its title), read back by `config_from_args`."""
    parser.add_argument("--preset", choices=list(RECIPES), help="a recipe (config.RECIPES); it prints what it sets")
    parser.add_argument("--data-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="extra dataset arguments (data_args), e.g. --data-arg num_train=512 for --data fake")
    run = parser.add_argument_group("run (TrainConfig)")
    for f in fields(TrainConfig):
        if f.name in _OVERRIDES:
            cls, prefix, title = _OVERRIDES[f.name]
            group = parser.add_argument_group(title)
            for g in [g for g in fields(cls) if g.name not in RUN_OWNED]:
                _add_flag(group, g, f"{prefix}.{g.name}")
        elif f.name != "data_args":  # data_args has the repeatable --data-arg instead
            _add_flag(run, f, f.name)


class DefaultsHelp(argparse.ArgumentDefaultsHelpFormatter):
    """`--help` with each flag's default after its help, unless the help says it already or it is None (then the
    help says what None means): no "(default: 64; …) (default: None)"."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        said = action.default is None or "default" in (action.help or "")
        return action.help if said else super()._get_help_string(action)


def config_from_args(args: argparse.Namespace) -> tuple[TrainConfig, list[str]]:
    """The config of a namespace parsed by a parser with `add_config_flags` (its other attributes ignored), and
    `resolve_config`'s notes."""
    values: dict[str, Any] = {"data_args": dict(parse_key_value(item, "--data-arg") for item in args.data_arg)}
    target = {prefix: name for name, (_, prefix, _) in _OVERRIDES.items()}
    for key, value in vars(args).items():
        prefix, _, name = key.partition(".")
        if name:
            values.setdefault(target[prefix], {})[name] = tuple(value) if isinstance(value, list) else value
        elif key in {f.name for f in fields(TrainConfig)}:
            values[key] = value
    return resolve_config(args.preset, values)


class _WordsParser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:  # a ValueError for the caller, not an exit
        raise ValueError(f"convit-edu train: {message}")


def config_from_words(words: Sequence[str]) -> TrainConfig:
    """The config that `convit-edu train WORDS` trains: defaults < `--preset` < flags, read as the command line
    reads them (`add_config_flags`); ValueError for a word it does not know. A note of `resolve_config` is a
    warning here."""
    parser = _WordsParser(prog="convit-edu train", add_help=False)
    add_config_flags(parser)
    cfg, notes = config_from_args(parser.parse_args(list(words)))
    for note in notes:
        warnings.warn(note, stacklevel=2)
    return cfg


def _flags_of(name: str, value: Any) -> dict[str, list[str]]:
    """The flags that set TrainConfig field `name` to `value`, each with its words (`{"--epochs": ["--epochs",
    "3"]}`): one flag, or for a dict field one per key (`--patch-size 4`, `--data-arg num_train=512`)."""
    if name == "data_args":
        return {f"--data-arg {k}": ["--data-arg", f"{k}={_value_word(v)}"] for k, v in value.items()}
    if name in _OVERRIDES:
        by_name = {g.name: g for g in fields(_OVERRIDES[name][0])}
        return {_flag(k): _field_words(by_name[k], v) for k, v in value.items()}
    return {_flag(name): _field_words(next(f for f in fields(TrainConfig) if f.name == name), value)}


def config_to_words(cfg: TrainConfig, preset: str | None = None) -> list[str]:
    """`convit-edu train` words that give back `cfg`: `--preset NAME` when given, then the flag of every setting
    that differs from what the preset (or the defaults) gives, in field order; `config_from_words` reads them
    back into an equal config. Flags add to a preset's dicts and cannot remove a key: ValueError naming it."""
    base, _ = resolve_config(preset, {})
    words = ["--preset", preset] if preset is not None else []
    for f in fields(TrainConfig):
        value, given = getattr(cfg, f.name), getattr(base, f.name)
        if f.name in DICT_FIELDS:
            missing = sorted(set(given) - set(value))
            if missing:
                raise ValueError(f"{f.name} {value} lacks {missing[0]!r}, which preset {preset} sets: flags cannot "
                                 "remove it; pass another preset, or none")
            changed = {k: v for k, v in value.items() if k not in given or given[k] != v}
            words += [w for flag in _flags_of(f.name, changed).values() for w in flag]
        elif value != given:
            words += _field_words(f, value)
    return words


def preset_flags(preset: str, cfg: TrainConfig) -> list[str]:
    """The flags `--preset NAME` stands for, one line each (`--global-batch 128`), and where `cfg` sets that
    setting otherwise, the flag that overrode it: `--epochs 300 (overridden: --epochs 3)`."""
    lines = []
    for name, value in recipe(preset).items():
        now = _flags_of(name, getattr(cfg, name))
        for flag, words in _flags_of(name, value).items():
            lines.append(shlex.join(words) + ("" if now[flag] == words else f" (overridden: {shlex.join(now[flag])})"))
    return lines


# %% [markdown]
# A setting's name is its field's in Python (`global_batch`) and its flag's on the command line (`--global-batch`).
# The config's errors name fields; `as_flags` rewrites a message in flags for the `train` command (chapter 42):
# every name with an underscore, and a one-word name (`lr`, `epochs`) where it stands as a setting — before its
# value, before "must", or in a list of settings — so that "the 100 classes" stays prose.

# %%
#| export
def _setting_names() -> list[str]:
    """The names `train`'s flags set: TrainConfig's fields, then its dict fields' (those the run does not own)."""
    names = {f.name for f in fields(TrainConfig) if f.name not in DICT_FIELDS}
    names |= {g.name for cls, _, _ in _OVERRIDES.values() for g in fields(cls) if g.name not in RUN_OWNED}
    return sorted(names, key=len, reverse=True)  # the longest first: `min_lr` is not `lr`


def as_flags(message: str) -> str:
    """`message` with each setting it names written as the flag that sets it (`global_batch 100` -> `--global-batch
    100`): a name with an underscore always, a one-word name before its value or "must", or in a list of names."""
    name = "(?:" + "|".join(map(re.escape, _setting_names())) + ")"
    before, after = r"(?<![\w./'-])", r"(?![\w/-]|\.\w)"  # a whole word: not in a path, file name, quote or flag
    message = re.sub(rf"{before}{name}(?:, {name})+{after}",  # a list of names: all of them flags
                     lambda m: ", ".join(map(_flag, m[0].split(", "))), message)

    def one(m: re.Match) -> str:
        standing = "_" in m[0] or re.match(r" (?:must\b|-?\d|['(\[]|None\b|True\b|False\b)", m.string[m.end():])
        return _flag(m[0]) if standing else m[0]
    return re.sub(f"{before}{name}{after}", one, message)


# %%
for field_words, flag_words in [
        ("global_batch 100 is not divisible by accum_steps 3",
         "--global-batch 100 is not divisible by --accum-steps 3"),
        ("lr must be a finite number in (0, inf), got -1.0", "--lr must be a finite number in (0, inf), got -1.0"),
        ("a resume may change lr, min_lr, epochs", "a resume may change --lr, --min-lr, --epochs"),
        ("data_root 'x' is set but data is 'fake'", "--data-root 'x' is set but data is 'fake'"),
        ("classes 200: the dataset has 100 classes", "--classes 200: the dataset has 100 classes")]:
    print(f"{field_words:<55} -> {as_flags(field_words)}")
    assert as_flags(field_words) == flag_words

# %% [markdown]
# A run of chapter 35's grid (recipe, data folder, four changes) as words and back, with the preset or without (then a
# flag for each setting off the defaults); `TrainConfig.from_dict` reads its `run.json` back equal, tuples and all.

# %%
import json
import shlex
from dataclasses import asdict

run, _ = resolve_config("sample-efficiency", {"model": "convit_tiny", "model_args": {"local_up_to_layer": 4},
                                               "data_root": "data/tiny", "fraction": 0.1, "epochs": 250, "seed": 1})
for words in (config_to_words(run, "sample-efficiency"), config_to_words(run)):
    print(shlex.join(words))
    assert config_from_words(words) == run
assert run.model_args["patch_size"] == 8  # the preset's, kept
assert TrainConfig.from_dict(json.loads(json.dumps(asdict(run)))) == run
print(expect_error(lambda: config_from_words(["--epochs", "ten"])))

# %% [markdown]
# `train --preset NAME` prints what the preset stands for (chapter 42) as flags, `preset_flags`, each with the flag
# that overrode it: typed by hand without `--preset`, its lines give the preset's config.

# %%
lines = preset_flags("sample-efficiency", run)
print("\n".join(lines))
typed = [word for line in lines for word in shlex.split(line.split(" (overridden")[0])]
assert config_from_words(typed) == resolve_config("sample-efficiency", {})[0]  # the listing is the preset
assert lines[0] == "--model deit_tiny (overridden: --model convit_tiny)" and "--patch-size 8" in lines
