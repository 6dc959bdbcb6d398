"""Bad input of every kind a user controls, fed through the `hfta-nas` command.

This is the one place that lists them all: search space and config files
(YAML syntax, unknown keys, types, ranges, unknown names, user factories),
storages, output folders and the numeric options of `train`, `search`,
`stability`, `report` and `dashboard`. Each must end with exit status 2 and a
clear message (what, where: file:line for YAML, what was expected), never a
traceback, and leave what the storage already holds untouched: every command
runs against a copy of a journal that holds a search study with a finished
trial, and the journal must be byte-for-byte the same afterwards.

At the end, property tests of the search space loader: for any text, and for
near-valid variations of the shipped spaces, `parse_space` returns a
SearchSpace or raises SpaceError whose message names the file.
"""

from __future__ import annotations

import contextlib
import copy
import os
import pickle
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import optuna
import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hfta_nas.cli import main
from hfta_nas.errors import HftaNasError
from hfta_nas.search import Outcome, open_storage, outcome_of
from hfta_nas.search_spaces import SHIPPED_SPACES, SearchSpace, SpaceError, parse_space
from tests.test_search import space_text
from tests.test_search_spaces import KEYS, _values
from tests.test_stability import TINY

optuna.logging.set_verbosity(optuna.logging.WARNING)

# A user factory whose models differ between calls: the width is drawn from
# torch's random numbers, so every seed builds another shape.
FACTORIES = """\
import math

import torch
from torch import nn


def random_width(input_shape=(1, 8, 8), num_classes=10):
    width = int(torch.randint(8, 4096, ()))
    features = math.prod(input_shape)
    return nn.Sequential(nn.Flatten(), nn.Linear(features, width), nn.ReLU(), nn.Linear(width, num_classes))


def three_outputs(input_shape=(1, 8, 8), num_classes=10):
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), 3))


def exits(input_shape=(1, 8, 8), num_classes=10):
    raise SystemExit(0)
"""
MISSING_MODULE = "no_such_module_hfta_nas"
LR = {"training.optimizer.lr": {"distribution": "log_uniform", "min": 1e-3, "max": 3e-2}}
OPTIMIZER = {"name": "adam", "lr": 1e-3}
STORED_SPACE = {"budget": {"n_trials": 1}, "array": {"size": 1}, "training": {"epochs": 1, "optimizer": OPTIMIZER}}
LR_WIDER = {"training.optimizer.lr": {"distribution": "log_uniform", "min": 1e-3, "max": 0.1}}


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def line_of(text: str, fragment: str) -> int:
    """1-based number of the first line of `text` that contains `fragment`."""
    return next(n for n, line in enumerate(text.splitlines(), 1) if fragment in line)


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """A journal holding study 'tiny' (the study of tests/test_search.py's space) with one finished trial."""
    folder = tmp_path_factory.mktemp("stored")
    space = folder / "space.yaml"
    space.write_text(space_text(**STORED_SPACE))
    journal = folder / "study.journal"
    result = invoke("search", space, "--storage", journal, "--out", folder / "best", "--threads", 1, "--quiet")
    assert result.exit_code == 0, result.output
    assert snapshot(journal)["tiny"], "the stored study has a finished trial"
    return journal


def snapshot(journal: Path) -> dict[str, list[bytes]]:
    """Every study's finished trials, pickled: {study name: [trial, ...]}. Trials a search
    asked and then failed unrun when it stopped on the error (outcome not_trained) are
    left out; a trial left RUNNING fails the check."""
    storage, _ = open_storage(str(journal))
    studies = {}
    for summary in optuna.get_all_study_summaries(storage):
        trials = optuna.load_study(study_name=summary.study_name, storage=storage).get_trials(deepcopy=False)
        assert not [t.number for t in trials if not t.state.is_finished()], "a trial was left RUNNING"
        studies[summary.study_name] = [pickle.dumps(t) for t in trials if outcome_of(t) != Outcome.NOT_TRAINED]
    return studies


@dataclass
class Env:
    """One test's folder (also the working directory): a copy of the stored journal,
    a regular file `afile`, the user factory module `factories.py`."""

    tmp: Path
    journal: Path
    afile: Path

    def fill(self, text: str) -> str:
        return str(text).format(tmp=self.tmp, journal=self.journal, afile=self.afile)


@pytest.fixture
def env(tmp_path, stored, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths (and a default runs/ folder) land here
    journal = tmp_path / "study.journal"
    shutil.copy(stored, journal)
    (tmp_path / "afile").write_text("a regular file; nothing can be created below it\n")
    (tmp_path / "factories.py").write_text(FACTORIES)
    os.mkfifo(tmp_path / "pipe.yaml")  # reading it would wait for a writer forever
    return Env(tmp_path, journal, tmp_path / "afile")


def check_refused(env: Env, args: list, *messages: str, stored_check: str = "bytes") -> None:
    """Run `hfta-nas args` and check: exit 2, each of `messages` in the output, no traceback, storage untouched.

    `stored_check`: "bytes", the journal is byte-for-byte the same; "trials", work had
    started (the error comes from the models themselves), and the finished trials of
    every study are the same and no study gained a finished trial."""
    before_bytes, before_trials = env.journal.read_bytes(), snapshot(env.journal)
    result = invoke(*(env.fill(a) for a in args))
    output = result.output
    assert result.exit_code == 2, output
    assert isinstance(result.exception, SystemExit), result.exception  # not an exception click caught
    assert "Traceback" not in output, output
    for message in messages:
        assert env.fill(message) in output, output
    assert any(line.startswith(("error: ", "Error: ")) for line in output.splitlines()), output
    if stored_check == "bytes":
        assert env.journal.read_bytes() == before_bytes, "the journal changed"
    else:
        after = snapshot(env.journal)
        assert {name: after.get(name) for name in before_trials} == before_trials, "finished trials changed"
        assert not any(after[name] for name in after if name not in before_trials), "a new study got trials"


# ------------------------------------------------------------ search space files
SEARCH = ["search", "{tmp}/space.yaml", "--storage", "{journal}", "--out", "{tmp}/out", "--threads", "1", "--quiet"]
SEARCH_NO_OUT = ["search", "{tmp}/space.yaml", "--storage", "{journal}", "--threads", "1", "--quiet"]

SPACE_CASES = [
    # (id, the file, the line's fragment (None: no line), the key, what the message says)
    (
        "sampler count below zero",
        space_text(sampler={"name": "tpe", "kwargs": {"n_startup_trials": -1}}),
        "n_startup_trials: -1",
        "sampler.kwargs.n_startup_trials",
        "sampler 'tpe' argument 'n_startup_trials' counts something: expected >= 0, got -1",
    ),
    (
        "pruner count below zero",
        space_text(pruner={"name": "median", "kwargs": {"n_warmup_steps": -2}}),
        "n_warmup_steps: -2",
        "pruner.kwargs.n_warmup_steps",
        "pruner 'median' argument 'n_warmup_steps' counts something: expected >= 0, got -2",
    ),
    (
        "yaml syntax",
        space_text().replace("  name: tiny", "  name: tiny: x"),
        "name: tiny: x",
        "",
        "YAML syntax error at column 13: mapping values are not allowed here",
    ),
    (
        "yaml tab indentation",
        space_text().replace("  name: tiny", "\tname: tiny"),
        "name: tiny",
        "",
        "found character '\\t' that cannot start any token",
    ),
    (
        "yaml duplicate key",
        space_text() + "seed: 8\n",
        "seed: 8",
        "seed",
        f"duplicate key 'seed' (first given on line {line_of(space_text(), 'seed: 7')})",
    ),
    ("yaml empty file", "", None, "", "the file is empty"),
    ("yaml not a mapping", "- study\n- params\n", "- study", "", "expected a mapping of sections"),
    (
        "unknown section",
        space_text(smapler={"name": "tpe"}),
        "smapler:",
        "smapler",
        "unknown key 'smapler' (did you mean 'sampler'?)",
    ),
    (
        "unknown key",
        space_text(training={"epoch": 2, "optimizer": OPTIMIZER}),
        "epoch:",
        "training.epoch",
        "unknown key 'epoch' (did you mean 'epochs'?)",
    ),
    (
        "unknown param path",
        space_text(params={"training.optimiser.lr": 0.1}),
        "training.optimiser.lr",
        "params.training.optimiser.lr",
        "did you mean 'training.optimizer.lr'",
    ),
    (
        "unknown distribution key",
        space_text(params={"training.optimizer.lr": {"distribution": "uniform", "low": 0.1, "high": 1.0}}),
        "low:",
        "params.training.optimizer.lr.low",
        "did you mean 'min'",
    ),
    (
        "unknown distribution",
        space_text(params={"training.optimizer.lr": {"distribution": "normal", "min": 0, "max": 1}}),
        "distribution: normal",
        "params.training.optimizer.lr.distribution",
        "unknown distribution 'normal'",
    ),
    (
        "type: epochs a word",
        space_text(training={"epochs": "ten", "optimizer": OPTIMIZER}),
        "epochs: ten",
        "training.epochs",
        "expected an integer, got 'ten'",
    ),
    (
        "type: epochs a float",
        space_text(training={"epochs": 2.5, "optimizer": OPTIMIZER}),
        "epochs: 2.5",
        "training.epochs",
        "expected an integer",
    ),
    ("type: section a number", space_text(budget=12), "budget: 12", "budget", "expected a mapping"),
    (
        "type: lr a word",
        space_text(training={"epochs": 1, "optimizer": {"name": "adam", "lr": "fast"}}),
        "lr: fast",
        "training.optimizer.lr",
        "expected a number, got 'fast'",
    ),
    (
        "type: min a word",
        space_text(params={"training.optimizer.lr": {"distribution": "log_uniform", "min": "low", "max": 0.1}}),
        "min: low",
        "params.training.optimizer.lr.min",
        "expected a number, got 'low'",
    ),
    (
        "type: metrics not a list",
        space_text(study={"name": "tiny", "metrics": "val_acc"}),
        "metrics: val_acc",
        "study.metrics",
        "expected a list, got 'val_acc'",
    ),
    ("type: params a list", space_text(params=["training.optimizer.lr"]), "params:", "params", "expected a mapping"),
    (
        "empty range uniform",
        space_text(params={"training.optimizer.weight_decay": {"distribution": "uniform", "min": 0.1, "max": 0.1}}),
        "training.optimizer.weight_decay:",
        "params.training.optimizer.weight_decay",
        "'min' must be < 'max' (got min=0.1, max=0.1)",
    ),
    (
        "empty range log_uniform",
        space_text(params={"training.optimizer.lr": {"distribution": "log_uniform", "min": 0.01, "max": 0.01}}),
        "training.optimizer.lr:",
        "params.training.optimizer.lr",
        "'min' must be < 'max' (got min=0.01, max=0.01)",
    ),
    (
        "inverted range uniform",
        space_text(params={"training.optimizer.weight_decay": {"distribution": "uniform", "min": 0.2, "max": 0.1}}),
        "training.optimizer.weight_decay:",
        "params.training.optimizer.weight_decay",
        "'min' must be < 'max' (got min=0.2, max=0.1)",
    ),
    (
        "inverted range log_uniform",
        space_text(params={"training.optimizer.lr": {"distribution": "log_uniform", "min": 0.1, "max": 0.01}}),
        "training.optimizer.lr:",
        "params.training.optimizer.lr",
        "'min' must be < 'max' (got min=0.1, max=0.01)",
    ),
    (
        "inverted range int_uniform",
        space_text(params={"model.config.width": {"distribution": "int_uniform", "min": 32, "max": 8}}),
        "model.config.width:",
        "params.model.config.width",
        "'min' must be <= 'max' (got min=32, max=8)",
    ),
    (
        "inverted range int_log_uniform",
        space_text(params={"model.config.width": {"distribution": "int_log_uniform", "min": 32, "max": 8}}),
        "model.config.width:",
        "params.model.config.width",
        "'min' must be <= 'max' (got min=32, max=8)",
    ),
    (
        "empty categorical",
        space_text(params={"model.config.width": {"distribution": "categorical", "values": []}}),
        "values: []",
        "params.model.config.width.values",
        "expected at least 1 item",
    ),
    ("unknown sampler", space_text(sampler={"name": "tpee"}), "name: tpee", "sampler.name", "(did you mean 'tpe'?)"),
    (
        "unknown pruner",
        space_text(pruner={"name": "medain"}),
        "name: medain",
        "pruner.name",
        "(did you mean 'median'?)",
    ),
    (
        "unknown dataset",
        space_text(data={"dataset": "mnist-1d", "batch_size": 64}),
        "dataset: mnist-1d",
        "data.dataset",
        "did you mean 'mnist1d'",
    ),
    (
        "missing data file",
        space_text(data={"dataset": "missing.npz", "batch_size": 64}),
        "dataset: missing.npz",
        "data.dataset",
        "data file 'missing.npz' not found",
    ),
    (
        "unknown model family",
        space_text(model={"family": "resnet"}),
        "family: resnet",
        "model.family",
        "unknown model family 'resnet'",
    ),
    (
        "factory module not importable",
        space_text(model={"factory": f"{MISSING_MODULE}:build"}, params=LR),
        "factory:",
        "model.factory",
        f"no module named '{MISSING_MODULE}'",
    ),
    (
        "factory file missing",
        space_text(model={"factory": "missing_models.py:build"}, params=LR),
        "factory:",
        "model.factory",
        "file 'missing_models.py' does not exist",
    ),
    (
        "factory function missing",
        space_text(model={"factory": "factories.py:nope"}, params=LR),
        "factory:",
        "model.factory",
        "has no attribute 'nope'; callables defined there: exits, random_width, three_outputs",
    ),
    (
        "factory not module:function",
        space_text(model={"factory": "factories.random_width"}, params=LR),
        "factory:",
        "model.factory",
        "expected 'module:function'",
    ),
    (
        "negative epochs",
        space_text(training={"epochs": -1, "optimizer": OPTIMIZER}),
        "epochs: -1",
        "training.epochs",
        "expected a value >= 1, got -1",
    ),
    (
        "zero array size",
        space_text(array={"size": 0}),
        "size: 0",
        "array.size",
        "expected an integer from 1 to 4096 or 'auto', got 0",
    ),
    (
        "negative n_trials",
        space_text(budget={"n_trials": -1}),
        "n_trials: -1",
        "budget.n_trials",
        "expected a value >= 1, got -1",
    ),
    ("negative seed", space_text(seed=-1), "seed: -1", "seed", "expected a value >= 0, got -1"),
    (
        "zero batch size",
        space_text(data={"dataset": "digits", "batch_size": 0}),
        "batch_size: 0",
        "data.batch_size",
        "expected a value >= 1, got 0",
    ),
    (
        "negative lr",
        space_text(training={"epochs": 1, "optimizer": {"name": "adam", "lr": -0.1}}),
        "lr: -0.1",
        "training.optimizer.lr",
        "expected a value > 0.0, got -0.1",
    ),
    (
        "val_acc with val_fraction 0",
        space_text(data={"dataset": "digits", "batch_size": 64, "val_fraction": 0}),
        "val_fraction: 0",
        "data.val_fraction",
        "the study's metric 'val_acc' needs validation data",
    ),
    (
        "adam eps 0",
        space_text(training={"epochs": 1, "optimizer": {"name": "adam", "lr": 1e-3, "eps": 0}}),
        "eps: 0",
        "training.optimizer.eps",
        "expected a value > 0.0, got 0",
    ),
    (
        "lr 1e308",
        space_text(training={"epochs": 1, "optimizer": {"name": "adam", "lr": 1e308}}),
        "lr: 1.0e+308",
        "training.optimizer.lr",
        "expected a value <= 1000.0, got 1e+308",
    ),
]


@pytest.mark.parametrize(
    ("text", "fragment", "key", "message"), [c[1:] for c in SPACE_CASES], ids=[c[0] for c in SPACE_CASES]
)
def test_bad_search_space_files(env, text, fragment, key, message):
    path = env.tmp / "space.yaml"
    path.write_text(text)
    where = f"{path}:{line_of(text, fragment)}: " if fragment is not None else f"{path}: "
    check_refused(env, SEARCH, where + (f"{key}: " if key else ""), message)


# ------------------------------------------------------------ stability config files
STABILITY = [
    "stability",
    "{tmp}/config.yaml",
    "--seeds",
    "2",
    "--storage",
    "{journal}",
    "--out",
    "{tmp}/report",
    "--threads",
    "1",
    "--quiet",
]

CONFIG_CASES = [
    # (id, the file, the line's fragment, the key, what the message says); the file is tests/test_stability.py's TINY
    (
        "yaml syntax",
        TINY.replace("epochs: 2", "epochs: 2: 3"),
        "epochs: 2: 3",
        "",
        "mapping values are not allowed here",
    ),
    (
        "unknown key",
        TINY.replace("epochs: 2", "epoch: 2"),
        "epoch: 2",
        "epoch",
        "unknown key 'epoch' (did you mean 'epochs'?)",
    ),
    (
        "type: epochs a word",
        TINY.replace("epochs: 2", "epochs: two"),
        "epochs: two",
        "epochs",
        "expected an integer, got 'two'",
    ),
    (
        "type: channels a word",
        TINY.replace("channels: [4]", "channels: four"),
        "channels: four",
        "model_config",
        "key 'channels': Input should be a valid list",
    ),
    (
        "negative epochs",
        TINY.replace("epochs: 2", "epochs: -1"),
        "epochs: -1",
        "epochs",
        "expected a value >= 1, got -1",
    ),
    (
        "negative lr",
        TINY.replace("lr: 0.01", "lr: -0.01"),
        "lr: -0.01",
        "hparams.lr",
        "expected a value > 0.0, got -0.01",
    ),
    (
        "zero batch size",
        TINY.replace("batch_size: 50", "batch_size: 0"),
        "batch_size: 0",
        "data.batch_size",
        "expected a value >= 1, got 0",
    ),
    (
        "unknown dataset",
        TINY.replace("dataset: mnist1d", "dataset: imagenet"),
        "dataset: imagenet",
        "dataset",
        "unknown dataset 'imagenet'",
    ),
    (
        "unknown model family",
        TINY.replace("model: cnn1d", "model: resnet"),
        "model: resnet",
        "model",
        "unknown model family 'resnet'",
    ),
]


@pytest.mark.parametrize(
    ("text", "fragment", "key", "message"), [c[1:] for c in CONFIG_CASES], ids=[c[0] for c in CONFIG_CASES]
)
def test_bad_stability_config_files(env, text, fragment, key, message):
    path = env.tmp / "config.yaml"
    path.write_text(text)
    check_refused(env, STABILITY, f"{path}:{line_of(text, fragment)}: " + (f"{key}: " if key else ""), message)


# ------------------------------------------------------------ options, user code, storages, folders
TRAIN = ["train", "--model", "mlp", "--dataset", "digits", "--seeds", "2", "--epochs", "1", "--threads", "1"]
UNREACHABLE = [
    ("postgresql", "postgresql://nobody@127.0.0.1:1/x", "cannot open storage 'postgresql://nobody@127.0.0.1:1/x'"),
    ("sqlite in a missing folder", "sqlite:////nonexistent_dir/x.db", "folder '/nonexistent_dir' does not exist"),
    ("a folder", "{tmp}", "cannot use '{tmp}' as storage: it is a folder"),
    ("below a file", "{afile}/x.journal", "cannot use journal file '{afile}/x.journal' as storage"),
]

OPTION_CASES = [
    # (id, the command after `hfta-nas` ({tmp}, {journal}, {afile} filled in), what the message says)
    # search
    *[(f"search --storage {name}", [*SEARCH, "--storage", url], message) for name, url, message in UNREACHABLE],
    (
        "search --out below a file",
        [*SEARCH, "--out", "{afile}/out"],
        "--out '{afile}/out': cannot create a folder there, '{afile}' is a file",
    ),
    (
        "search --dry-run --out below a file",
        [*SEARCH, "--dry-run", "--out", "{afile}/out"],
        "cannot create a folder there",
    ),
    (
        "search --sampler unknown",
        [*SEARCH, "--sampler", "tpee"],
        "--sampler: expected one of tpe, random, cmaes, gp, grid, nsga2, got 'tpee' (did you mean 'tpe'?)",
    ),
    (
        "search --pruner unknown",
        [*SEARCH, "--pruner", "medain"],
        "--pruner: expected one of none, median, successive_halving, hyperband, got 'medain' (did you mean 'median'?)",
    ),
    ("search --array-size 0", [*SEARCH, "--array-size", "0"], "array size must be a positive integer or 'auto', got 0"),
    (
        "search --array-size -2",
        [*SEARCH, "--array-size", "-2"],
        "array size must be a positive integer or 'auto', got -2",
    ),
    ("search --array-size a word", [*SEARCH, "--array-size", "many"], "expected an integer or 'auto', got 'many'"),
    ("search --n-trials -1", [*SEARCH, "--n-trials", "-1"], "n_trials must be a positive number, got -1"),
    ("search --n-trials 0", [*SEARCH, "--n-trials", "0"], "n_trials must be a positive number, got 0"),
    ("search --timeout -1", [*SEARCH, "--timeout", "-1"], "timeout must be a positive number, got -1.0"),
    ("search --seed -1", [*SEARCH, "--seed", "-1"], "--seed: expected an integer >= 0, got -1"),
    # empty values are not the defaults in disguise, and budgets have a ceiling
    ("search --storage empty", [*SEARCH, "--storage", ""], "the storage is empty; give a URL"),
    ("search --out empty", [*SEARCH, "--out", ""], "--out is empty; give a folder"),
    ("search --study-name with a newline", [*SEARCH, "--study-name", "a\nb"], "holds a control character"),
    ("search --n-trials 2**70", [*SEARCH, "--n-trials", str(2**70)], "n_trials must be at most 10,000,000"),
    ("search --array-size 10**6", [*SEARCH, "--array-size", "1000000"], "array size must be at most 4096"),
    ("search --set epochs 1e9", [*SEARCH, "--set", "training.epochs=1000000000"], "expected a value <= 1000000"),
    ("search --set params=null", [*SEARCH, "--set", "params=null"], "params searches nothing"),
    # a searched range is held to the setting's ceiling, as a fixed value is (a drawn 10^9 epochs
    # was refused only after the study was written)
    (
        "search params epochs up to 1e9",
        [*SEARCH, "--set", "params.training.epochs={{distribution: int_uniform, min: 1, max: 1000000000}}"],
        "params.training.epochs: 'max': expected a value <= 1000000",
    ),
    (
        "search params batch size choices up to 1e12",
        [*SEARCH, "--set", "params.data.batch_size={{distribution: categorical, values: [8, 1000000000000]}}"],
        "params.data.batch_size: 'values[1]' = 1000000000000: expected a value <= 16777216",
    ),
    ("search --storage-patience -1", [*SEARCH, "--storage-patience", "-1"], "storage patience must be a number"),
    ("search --storage-patience nan", [*SEARCH, "--storage-patience", "nan"], "storage patience must be a number"),
    ("search --storage grpc nonsense", [*SEARCH, "--storage", "grpc://x"], "expected grpc://HOST:PORT"),
    (
        "search val_acc minimized",
        [*SEARCH, "--set", "study.directions=[minimize]"],
        "minimize for val_acc would search for the worst models (val_acc is better higher)",
    ),
    ("search --dry-run --storage empty", [*SEARCH, "--dry-run", "--storage", " "], "the storage is empty"),
    ("search --set batch_size 1e12", [*SEARCH, "--set", "data.batch_size=1000000000000"], "<= 16777216"),
    ("search --out in /proc", [*SEARCH, "--out", "/proc/x"], "--out '/proc/x': cannot create a folder in '/proc'"),
    ("search --threads 0", [*SEARCH, "--threads", "0"], "Invalid value for '--threads': 0 is not in the range x>=1"),
    ("search --workers 0", [*SEARCH, "--workers", "0"], "Invalid value for '--workers': 0 is not in the range x>=1"),
    ("search --device unknown", [*SEARCH, "--device", "tpu"], "unknown device 'tpu'"),
    (
        "search --storage a device",
        [*SEARCH, "--storage", "/dev/null"],
        "cannot use '/dev/null' as storage: it is not a regular file",
    ),
    (
        "search --dry-run --storage a device",
        [*SEARCH, "--dry-run", "--storage", "/dev/null"],
        "cannot use '/dev/null' as storage: it is not a regular file",
    ),
    (
        "search --dry-run --storage a folder",
        [*SEARCH, "--dry-run", "--storage", "{tmp}"],
        "cannot use '{tmp}' as storage: it is a folder",
    ),
    (
        "search --storage unknown scheme",
        [*SEARCH, "--storage", "foo://bar"],
        "cannot open storage 'foo://bar': unknown URL scheme 'foo'",
    ),
    ("search --timeout nan", [*SEARCH, "--timeout", "nan"], "timeout must be a positive number, got nan"),
    ("search --timeout inf", [*SEARCH, "--timeout", "inf"], "timeout must be a positive number, got inf"),
    (
        "search --study-name outside runs",
        [*SEARCH_NO_OUT, "--study-name", "../../escape"],
        "study name '../../escape' cannot name the default output folder runs/<study name>",
    ),
    (
        "search --study-name too long",
        [*SEARCH_NO_OUT, "--study-name", "x" * 300],
        "(300 characters)' cannot name the default",
    ),
    (
        "search --out a name too long",
        [*SEARCH, "--out", "{tmp}/" + "y" * 300],
        "expected at most 255 bytes per folder name",
    ),
    (
        "search a missing file",
        ["search", "{tmp}/nope.yaml", "--storage", "{journal}"],
        "{tmp}/nope.yaml: file not found",
    ),
    ("search a folder", ["search", "{tmp}", "--storage", "{journal}"], "is a directory"),
    # stability
    *[(f"stability --storage {name}", [*STABILITY, "--storage", url], message) for name, url, message in UNREACHABLE],
    ("stability --seeds 0", [*STABILITY, "--seeds", "0"], "--seeds must be an integer from 1 to 100,000, got 0"),
    ("stability --seeds -1", [*STABILITY, "--seeds", "-1"], "--seeds must be an integer from 1 to 100,000, got -1"),
    (
        "stability --seeds too many",
        [*STABILITY, "--seeds", str(10**12)],
        "--seeds must be an integer from 1 to 100,000",
    ),
    (
        "stability --metric unknown",
        [*STABILITY, "--metric", "acc"],
        "--metric: unknown metric 'acc' (did you mean 'val_acc'?); expected one of test_acc",
    ),
    (
        "stability a pipe as config",
        ["stability", "{tmp}/pipe.yaml", "--storage", "{journal}"],
        "{tmp}/pipe.yaml: is not a regular file (a pipe, device or socket)",
    ),
    (
        "search a pipe as space",
        ["search", "{tmp}/pipe.yaml", "--storage", "{journal}"],
        "{tmp}/pipe.yaml: is not a regular file (a pipe, device or socket)",
    ),
    (
        "stability --out below a file",
        [*STABILITY, "--out", "{afile}/report"],
        "--out '{afile}/report': cannot create a folder there, '{afile}' is a file",
    ),
    (
        "stability --artifact-dir below a file",
        [*STABILITY, "--artifact-dir", "{afile}/artifacts"],
        "--artifact-dir '{afile}/artifacts': cannot create a folder there",
    ),
    ("stability --array-size 0", [*STABILITY, "--array-size", "0"], "--array-size must be a positive integer, got 0"),
    ("stability --vary unknown", [*STABILITY, "--vary", "weights"], "--vary takes"),
    (
        "stability --format unknown",
        [*STABILITY, "--format", "pdf"],
        "expected a comma-separated subset of html, md, csv, json, tex, got 'pdf'",
    ),
    ("stability --device unknown", [*STABILITY, "--device", "tpu"], "unknown device 'tpu'"),
    (
        "stability --threads 0",
        [*STABILITY, "--threads", "0"],
        "Invalid value for '--threads': 0 is not in the range x>=1",
    ),
    (
        "stability --top-k 0",
        ["stability", "--study", "tiny", "--top-k", "0", "--storage", "{journal}", "--out", "{tmp}/r"],
        "--top-k must be at least 1, got 0",
    ),
    (
        "stability --study unknown",
        ["stability", "--study", "nope", "--storage", "{journal}", "--out", "{tmp}/r"],
        "no study named 'nope' in this storage (studies: tiny)",
    ),
    (
        "stability a missing file",
        ["stability", "{tmp}/nope.yaml", "--storage", "{journal}"],
        "{tmp}/nope.yaml: file not found",
    ),
    (
        "stability compare one config",
        ["stability", "compare", "{tmp}/config.yaml", "--storage", "{journal}"],
        "compare needs at least two configurations",
    ),
    # train
    ("train --epochs -1", [*TRAIN, "--epochs", "-1"], "epochs must be a non-negative integer, got -1"),
    ("train --seeds 0", [*TRAIN, "--seeds", "0"], "Invalid value for --seeds: the number of slots must be >= 1, got 0"),
    ("train --batch-size 0", [*TRAIN, "--batch-size", "0"], "batch_size must be a positive integer, got 0"),
    ("train --threads 0", [*TRAIN, "--threads", "0"], "Invalid value for '--threads': 0 is not in the range x>=1"),
    (
        "train --lr a word",
        [*TRAIN, "--lr", "fast"],
        "expected a number or comma-separated numbers (one per slot), got 'fast'",
    ),
    ("train --model unknown family", [*TRAIN, "--model", "resnet"], "unknown model 'resnet'"),
    ("train --dataset unknown", [*TRAIN, "--dataset", "imagenet"], "unknown data source 'imagenet'"),
    ("train --device unknown", [*TRAIN, "--device", "tpu"], "unknown device 'tpu'"),
    (
        "train factory module not importable",
        [*TRAIN, "--model", f"{MISSING_MODULE}:build"],
        f"model factory '{MISSING_MODULE}:build': no module named '{MISSING_MODULE}'",
    ),
    (
        "train factory function missing",
        [*TRAIN, "--model", "factories.py:nope"],
        "model factory 'factories.py:nope': module 'factories.py' has no attribute 'nope'; callables defined "
        "there: exits, random_width, three_outputs",
    ),
    (
        "train factory of different shapes",
        [*TRAIN, "--model", "factories.py:random_width"],
        "the model factory built different models for different seeds: parameter '1.weight' is [",
    ),
    # report, dashboard
    (
        "report a folder without results",
        ["report", "{tmp}"],
        "'{tmp}' holds no stability results (expected result/seeds.csv",
    ),
    (
        "report --study unknown",
        ["report", "--study", "nope", "--storage", "{journal}"],
        "no stability study named 'nope'",
    ),
    (
        "dashboard --storage sqlite in a missing folder",
        ["dashboard", "--storage", "sqlite:////nonexistent_dir/x.db"],
        "no storage at '/nonexistent_dir/x.db'",
    ),
    (
        "dashboard --storage a missing journal",
        ["dashboard", "--storage", "{tmp}/typo.journal"],
        "no storage at '{tmp}/typo.journal': nothing has been searched or studied there yet",
    ),
    (
        "dashboard --storage a folder",
        ["dashboard", "--storage", "{tmp}"],
        "it is a folder; expected a journal file path",
    ),
    (
        "dashboard --port out of range",
        ["dashboard", "--storage", "{journal}", "--port", "70000"],
        "Invalid value for '--port': 70000 is not in the range 1<=x<=65535",
    ),
    # more threads than cores: torch could not start 100000 and left an empty study behind
    ("search --threads 100000", [*SEARCH, "--threads", "100000"], "--threads 100000: this machine has"),
    ("stability --threads 100000", [*STABILITY, "--threads", "100000"], "--threads 100000: this machine has"),
    ("search --device mps", [*SEARCH, "--device", "mps"], "device 'mps' is not supported"),
    ("search --device meta", [*SEARCH, "--device", "meta"], "device 'meta' is not supported"),
    ("stability --device mps", [*STABILITY, "--device", "mps"], "device 'mps' is not supported"),
    ("stability --seed -1", [*STABILITY, "--seed", "-1"], "Invalid value for '--seed': -1 is not in the range x>=0"),
    ("stability --out empty", [*STABILITY, "--out", ""], "--out is empty; give a folder"),
    (
        "stability --decompose grid with one seed",
        ["stability", "{tmp}/config.yaml", "--seeds", "1", "--decompose", "grid", "--storage", "{journal}"],
        "a variance needs two seeds; give --seeds 2 or more (got 1)",
    ),
    (
        "stability --metric not measured by the config",
        [*STABILITY, "--metric", "train_r2"],
        "--metric: unknown metric 'train_r2' (did you mean 'train_acc'?)",
    ),
    ("stability --storage empty", [*STABILITY, "--storage", ""], "the storage is empty; give a URL"),
]


@pytest.mark.parametrize(("args", "message"), [c[1:] for c in OPTION_CASES], ids=[c[0] for c in OPTION_CASES])
def test_bad_options_storages_folders_and_factories(env, args, message):
    (env.tmp / "space.yaml").write_text(space_text())
    (env.tmp / "config.yaml").write_text(TINY)
    check_refused(env, args, message)


FACTORY_CASES = [
    # user code that is found but misbehaves: a config file names it (a space file is covered above)
    (
        "stability factory module not importable",
        f"model: {MISSING_MODULE}:build",
        [],
        f"configuration 'config': model factory '{MISSING_MODULE}:build': no module named '{MISSING_MODULE}'",
        "bytes",
    ),
    (
        "stability factory function missing",
        "model: factories.py:nope",
        [],
        "has no attribute 'nope'; callables defined there: exits, random_width, three_outputs",
        "bytes",
    ),
    # models of different shapes are found only when the array is built: the stability study
    # (and the search's asked trials) exist by then, but no finished trial changes
    (
        "stability factory of different shapes",
        "model: factories.py:random_width",
        [],
        "the model factory built different models for different seeds",
        "trials",
    ),
    (
        "search factory of different shapes",
        None,
        SEARCH,
        "the model factory built different models on different calls (one per seed)",
        "trials",
    ),
    # found before anything trains: the asked trial is failed as not trained, nothing is left RUNNING
    (
        "search factory with too few outputs",
        "three_outputs",
        SEARCH,
        "the model returns outputs of shape [2, 3] for a batch of 2, but the loss (cross-entropy) needs [2, 10, ...]",
        "trials",
    ),
    ("search factory calling sys.exit", "exits", SEARCH, "called sys.exit(0)", "trials"),
]


@pytest.mark.parametrize(
    ("model_line", "args", "message", "stored_check"), [c[1:] for c in FACTORY_CASES], ids=[c[0] for c in FACTORY_CASES]
)
def test_bad_user_factories(env, model_line, args, message, stored_check):
    factory = model_line if model_line in ("three_outputs", "exits") else "random_width"
    (env.tmp / "space.yaml").write_text(
        space_text(  # a study of its own: the stored study 'tiny' was searched with another space
            study={"name": "factories", "metrics": ["val_acc"]},
            model={"factory": f"factories.py:{factory}"},
            params=LR,
            training={"epochs": 1, "optimizer": OPTIMIZER},
        )
    )
    if model_line is not None and factory == "random_width":
        (env.tmp / "config.yaml").write_text(
            f"{model_line}\ndataset: digits\noptimizer: adam\nhparams: {{lr: 0.01}}\nepochs: 1\n"
        )
    check_refused(env, args or STABILITY, message, stored_check=stored_check)


# ------------------------------------------------------------ property: the YAML loader
SOURCE = "fuzz/spaces/near_valid.yaml"
SHIPPED_TEXTS = {name: path.read_text() for name, path in sorted(SHIPPED_SPACES.items())}
SHIPPED_DATA = {name: yaml.safe_load(text) for name, text in SHIPPED_TEXTS.items()}
PROPERTY = settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


def _parses_or_names_the_file(text: str) -> None:
    try:
        space = parse_space(text, source=SOURCE)
    except SpaceError as error:
        lines = str(error).splitlines()
        assert lines and all(line.startswith(SOURCE) for line in lines), str(error)
        return
    assert isinstance(space, SearchSpace)


def _paths(node, prefix=()):
    """Every path into `node` (mapping keys and list indices), the root first."""
    yield prefix
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        yield from _paths(value, (*prefix, key))


def _at(node, path):
    for key in path:
        node = node[key]
    return node


@st.composite
def near_valid_spaces(draw):
    """A shipped space with a few keys removed, values replaced by random values, or keys added."""
    data = copy.deepcopy(SHIPPED_DATA[draw(st.sampled_from(sorted(SHIPPED_DATA)))])
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(list(_paths(data))[1:] or [()]))
        if not path:
            break
        parent, key = _at(data, path[:-1]), path[-1]
        how = draw(st.sampled_from(["remove", "replace", "add"]))
        if how == "remove":
            del parent[key]
        elif how == "add" and isinstance(parent[key], dict):
            parent[key][draw(st.sampled_from(KEYS))] = draw(_values)
        else:
            parent[key] = draw(_values)
    return yaml.safe_dump(data, sort_keys=False)


@st.composite
def spliced_texts(draw):
    """A shipped space's text with a random piece cut out and random text put in."""
    text = SHIPPED_TEXTS[draw(st.sampled_from(sorted(SHIPPED_TEXTS)))]
    start = draw(st.integers(0, len(text)))
    end = draw(st.integers(start, min(len(text), start + 40)))
    return text[:start] + draw(st.text(max_size=20)) + text[end:]


@PROPERTY
@given(st.one_of(st.text(), spliced_texts()))
def test_any_text_is_a_space_or_a_space_error_naming_the_file(text):
    _parses_or_names_the_file(text)


@PROPERTY
@given(near_valid_spaces())
def test_near_valid_spaces_are_a_space_or_a_space_error_naming_the_file(text):
    _parses_or_names_the_file(text)


def test_the_near_valid_strategy_starts_from_valid_spaces():
    for name, data in SHIPPED_DATA.items():
        _parses_or_names_the_file(yaml.safe_dump(data, sort_keys=False))
        assert isinstance(parse_space(yaml.safe_dump(data, sort_keys=False), source=SOURCE), SearchSpace), name


def test_a_user_factory_that_raises_is_reported_where_it_failed(env):
    (env.tmp / "broken.py").write_text(
        "def build(input_shape, num_classes):\n    raise ValueError('no such layer: Conv5d')\n"
    )
    check_refused(
        env,
        ["train", "--model", "broken.py:build", *TRAIN[3:]],
        "model factory build raised ValueError: no such layer: Conv5d",
        "broken.py:2",
    )


def test_a_journal_damaged_before_its_end_is_refused_and_kept(env):
    """A record in the middle that is not JSON (a torn last record is mended: tests/test_journal.py)."""
    lines = env.journal.read_bytes().splitlines(keepends=True)
    lines[1] = b"{damaged\n"
    env.journal.write_bytes(b"".join(lines))
    (env.tmp / "space.yaml").write_text(space_text())
    before = env.journal.read_bytes()
    for args in (SEARCH, [*SEARCH, "--dry-run"]):
        result = invoke(*(env.fill(a) for a in args))
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        assert f"cannot read journal file '{env.journal}': a record is damaged" in result.output
        assert env.journal.read_bytes() == before


def test_a_journal_record_of_an_unknown_kind_is_refused_and_kept(env):
    """An op code this Optuna does not know (a newer Optuna's, or a damaged one): its reader asserts."""
    env.journal.write_bytes(env.journal.read_bytes() + b'{"op_code": 99, "worker_id": "w"}\n')
    (env.tmp / "space.yaml").write_text(space_text())
    before = env.journal.read_bytes()
    result = invoke(*(env.fill(a) for a in SEARCH))
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "a record is damaged or of a kind this Optuna does not know (AssertionError" in result.output
    assert env.journal.read_bytes() == before


def test_a_changed_distribution_on_a_stored_study_is_refused_before_anything_is_written(env):
    """The stored study 'tiny' searched model.config.width as categorical [16, 32]."""
    params = {
        **yaml.safe_load(space_text())["params"],
        "model.config.width": {"distribution": "int_uniform", "min": 8, "max": 64},
    }
    (env.tmp / "space.yaml").write_text(space_text(params=params))
    check_refused(
        env,
        SEARCH,
        "study 'tiny' has trials where 'model.config.width' is CategoricalDistribution",
        "a study keeps one kind of distribution per parameter",
    )


OTHER_SPACES = [
    # (id, what differs from the stored study's space, what the one line says differs)
    (
        "model family",
        {"model": {"family": "cnn2d"}, "params": LR},
        "model.family is 'cnn2d' here but 'mlp' in the study",
    ),
    (
        "optimizer",
        {"training": {"epochs": 1, "optimizer": {"name": "sgd", "lr": 1e-3}}},
        "training.optimizer.name is 'sgd' here but 'adam' in the study",
    ),
    ("sampler", {"sampler": {"name": "random"}}, "sampler.name is 'random' here but 'tpe' in the study"),
    (
        "a param's range",
        {"params": {**yaml.safe_load(space_text())["params"], **LR_WIDER}},
        "params.training.optimizer.lr.max is 0.1 here but 0.03 in the study",
    ),
]


@pytest.mark.parametrize(("change", "message"), [c[1:] for c in OTHER_SPACES], ids=[c[0] for c in OTHER_SPACES])
def test_another_space_on_a_stored_study_is_refused_naming_what_differs(env, change, message):
    """The stored study 'tiny' keeps its space: another one on its name is one line, and nothing is written."""
    (env.tmp / "space.yaml").write_text(space_text(**{**STORED_SPACE, **change}))
    check_refused(
        env, SEARCH, f"study 'tiny' in {env.journal} was searched with another space: {message}; give --new-space"
    )


def test_a_dry_run_refuses_another_space_on_a_stored_study_as_a_run_does(env):
    """--dry-run reads the stored study's space too: the same one line and exit 2, nothing written;
    with --new-space it plans."""
    _, change, message = OTHER_SPACES[1]  # another optimizer
    (env.tmp / "space.yaml").write_text(space_text(**{**STORED_SPACE, **change}))
    dry_run = [*SEARCH_NO_OUT, "--dry-run"]
    check_refused(env, dry_run, f"study 'tiny' in {env.journal} was searched with another space: {message}")
    before = env.journal.read_bytes()
    result = invoke(*(env.fill(a) for a in [*dry_run, "--new-space"]))
    assert result.exit_code == 0, result.output
    assert env.journal.read_bytes() == before


def test_a_stored_study_takes_its_space_back_with_cosmetic_changes(env):
    """Comments, key order, another budget or array size are the same space: the study resumes."""
    text = "# the same space, written otherwise\n" + space_text(**{**STORED_SPACE, "budget": {"n_trials": 2}})
    reordered = yaml.safe_dump(dict(reversed(list(yaml.safe_load(text).items()))), sort_keys=False)
    (env.tmp / "space.yaml").write_text("# a comment\n" + reordered)
    result = invoke(*(env.fill(a) for a in SEARCH))
    assert result.exit_code == 0, result.output
    assert len(snapshot(env.journal)["tiny"]) == 2


def test_a_strong_mixup_alpha_in_a_space_is_warned(caplog):
    """mixup alpha 5 is legal (Beta(5, 5)) but mixes most samples half and half: one warning line."""
    text = space_text(**{**STORED_SPACE, "training": {**STORED_SPACE["training"], "augment": {"mixup": 5}}})
    with caplog.at_level("WARNING", logger="hfta_nas"):
        parse_space(text, "space.yaml")
    assert f"warning: space.yaml:{line_of(text, 'mixup: 5')}: training.augment.mixup: alpha 5 mixes" in caplog.text


def test_train_on_labels_of_one_class_is_refused(env):
    np.savez(env.tmp / "one.npz", x=np.zeros((40, 8), "float32"), y=np.zeros(40, "int64"))
    check_refused(env, [*TRAIN, "--dataset", "one.npz"], "one.npz: every label is 0, one class only")


def test_train_with_a_batch_larger_than_the_data_is_warned(env, caplog):
    with caplog.at_level("WARNING", logger="hfta_nas"):
        result = invoke(*TRAIN, "--batch-size", 10**9)
    assert result.exit_code == 0, result.output
    assert "batch size 1000000000 is larger than the 1437 training samples" in caplog.text


def _damaged_seeds_csv(folder: Path, damage: str) -> None:
    from tests.test_stability_report import synthetic_result

    synthetic_result().save(folder)
    seeds = (folder / "seeds.csv").read_text().splitlines()
    if damage == "abc":
        header = seeds[0].split(",")
        row = seeds[1].split(",")
        row[header.index("val_acc")] = "abc"
        seeds[1] = ",".join(row)
    else:  # the last column dropped from every line
        seeds = [line.rsplit(",", 1)[0] for line in seeds]
    (folder / "seeds.csv").write_text("\n".join(seeds) + "\n")


@pytest.mark.parametrize(
    ("damage", "message"),
    [("abc", "row 2, column val_acc: 'abc' is not a number"), ("dropped column", "seeds.csv' has no column ")],
)
def test_report_on_an_edited_seeds_csv_is_refused(env, damage, message):
    _damaged_seeds_csv(env.tmp / "result", damage)
    check_refused(env, ["report", "{tmp}/result", "--out", "{tmp}/report"], message)


def test_a_busy_dashboard_port_is_one_line(env):
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        check_refused(
            env,
            ["dashboard", "--storage", "{journal}", "--port", str(port)],
            f"cannot serve the dashboard on 127.0.0.1:{port}: Address already in use",
        )
    assert not (env.tmp / "artifacts").exists()


# ------------------------------------------------------------ property: the search command's options
_TEXTS = st.one_of(
    st.text(max_size=12),
    st.sampled_from(
        [
            "",
            "-1",
            "0",
            "nan",
            "inf",
            "1e309",
            "auto",
            "3",
            "tpe",
            "median",
            "cuda",
            "cpu",
            "../x",
            "/dev/null",
            "a://b",
            # past the ceilings, blank, and control characters
            "1000000",
            str(2**70),
            "1e12",
            " ",
            "a\nb",
            "x\x00y",
        ]
    ),
)
# settings past their ceilings or without sense, as `--set KEY=VALUE` (any text too)
_SETTINGS = st.one_of(
    st.sampled_from(
        [
            "training.epochs=1000000000",
            "data.batch_size=1000000000000",
            "array.size=1000000",
            "budget.n_trials=1180591620717411303424",
            "params=null",
            "study.directions=[minimize]",
            "sampler={name: tpe, kwargs: {n_startup_trials: -1}}",
            "pruner={name: median, kwargs: {n_warmup_steps: -1}}",
            "data.dataset=''",
        ]
    ),
    st.text(max_size=20),
)
SEARCH_OPTIONS = {
    "--n-trials": _TEXTS,
    "--timeout": _TEXTS,
    "--array-size": _TEXTS,
    "--seed": _TEXTS,
    "--sampler": _TEXTS,
    "--pruner": _TEXTS,
    "--threads": _TEXTS,
    "--device": _TEXTS,
    "--dtype": _TEXTS,
    "--study-name": _TEXTS,
    "--storage": _TEXTS,
    "--storage-patience": _TEXTS,
    "--set": _SETTINGS,
}


def _some_of(options):
    """Up to 4 of `options`, each with a value drawn from its own strategy."""
    return st.lists(st.sampled_from(sorted(options)), max_size=4, unique=True).flatmap(
        lambda names: st.fixed_dictionaries({name: options[name] for name in names})
    )


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(
    st.sampled_from(sorted(SEARCH_OPTIONS))
    .flatmap(lambda o: st.tuples(st.just(o), SEARCH_OPTIONS[o]))
    .map(lambda pair: {pair[0]: pair[1]})
    | _some_of(SEARCH_OPTIONS)
)
def test_any_search_options_plan_or_give_one_line_and_exit_2(tmp_path_factory, options):
    """`hfta-nas search --dry-run` with random values of its options: a plan (exit 0) or one
    `error:` line (exit 2), never a traceback; a dry run creates no file either way."""
    folder = tmp_path_factory.mktemp("fuzz")
    space = folder / "space.yaml"
    space.write_text(
        space_text(array={"size": 2, "step_cost": {"fixed_s": 0.001, "per_gmac_s": 0.1}}, budget={"n_trials": 2})
    )
    args = ["search", str(space), "--dry-run", "--quiet"]
    for option, value in options.items():
        if option == "--storage" and value and not value.startswith(("/", "a://")):
            value = str(folder / value.replace("/", "_"))  # relative paths stay in the test's folder
        args += [option, value]
    result = invoke(*args)
    assert result.exit_code in (0, 2), (args, result.output, result.exception)
    assert "Traceback" not in result.output, (args, result.output)
    if result.exit_code == 2:
        assert any(line.startswith(("error: ", "Error: ")) for line in result.output.splitlines()), (
            args,
            result.output,
        )
    assert [p.name for p in folder.iterdir()] == ["space.yaml"], (args, sorted(folder.iterdir()))


# --------------------------------------------------------- property: the stability command's options
STABILITY_OPTIONS = {
    "--seeds": _TEXTS,
    "--seed": _TEXTS,
    "--vary": _TEXTS,
    "--array-size": _TEXTS,
    "--device": _TEXTS,
    "--dtype": _TEXTS,
    "--threads": _TEXTS,
    "--storage": _TEXTS,
    "--format": _TEXTS,
    "--plot-format": _TEXTS,
    "--metric": _TEXTS,
    "--bootstrap-seed": _TEXTS,
    "--out": _TEXTS,
    "--fail-below": _TEXTS,
    # a config's settings past their ceilings or without sense (any text too)
    "--set": st.one_of(
        st.sampled_from(
            [
                "epochs=1000000000",
                "epochs=0",
                "data.batch_size=1000000000000",
                "training.epochs=-1",
                "hparams={lr: -1}",
                "hparams=null",
                "model=nonsense",
                "model_config={width: 0}",
                "optimizer=''",
                "dataset=../x",
            ]
        ),
        st.text(max_size=20),
    ),
}


class _ReachedTraining(HftaNasError):
    """Raised where the first array would train: every option was accepted."""


@settings(max_examples=50, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(_some_of(STABILITY_OPTIONS))
def test_any_stability_options_reach_training_or_give_one_line_and_exit_2(tmp_path_factory, options):
    """`hfta-nas stability` with random values of its options: every value is checked before the
    first array trains (here the training is replaced by a sentinel error), and a refused one is
    one `error:` line with exit 2, never a traceback."""
    import hfta_nas.stability._runner as runner

    folder = tmp_path_factory.mktemp("fuzz")
    config = folder / "tiny.yaml"
    config.write_text(
        "model: mlp\nmodel_config: {width: 8, depth: 1}\ndataset: digits\noptimizer: sgd\n"
        "hparams: {lr: 0.05}\nepochs: 1\ndata: {batch_size: 20}\n"
    )
    args = ["stability", str(config), "--quiet", "--storage", str(folder / "s.journal"), "--out", str(folder / "out")]
    for option, value in options.items():
        if option in ("--storage", "--out") and value and not value.startswith(("/", "a://")):
            value = str(folder / value.replace("/", "_"))  # relative paths stay in the test's folder
        args += [option, value]

    def reached(*args, **kwargs):
        raise _ReachedTraining("reached training")

    original, runner.train_slots = runner.train_slots, reached  # every array of a study trains through it
    try:
        result = invoke(*args)
    finally:
        runner.train_slots = original
    assert result.exit_code == 2, (args, result.output, result.exception)
    assert "Traceback" not in result.output, (args, result.output)
    errors = [line for line in result.output.splitlines() if line.startswith(("error: ", "Error: "))]
    assert errors, (args, result.output)


def test_a_space_file_named_with_the_other_yaml_suffix_gets_a_hint(tmp_path):
    (tmp_path / "space.yml").write_text(space_text())
    result = invoke("search", str(tmp_path / "space.yaml"), "--dry-run")
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert f"did you mean {tmp_path / 'space.yml'}?" in result.output


def test_a_file_that_is_not_a_journal_is_refused_and_left_as_it_was(env):
    """A --storage path naming some other file (a typo, the wrong tab) is neither mended nor moved aside."""
    stranger = env.tmp / "notes.journal"
    stranger.write_bytes(b"my notes\x00 not a journal")
    (env.tmp / "space.yaml").write_text(space_text())
    result = invoke("search", str(env.tmp / "space.yaml"), "--storage", str(stranger), "--threads", "1", "--quiet")
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "it is not an Optuna journal" in result.output and "nothing was changed" in result.output
    assert stranger.read_bytes() == b"my notes\x00 not a journal"
    assert not list(env.tmp.glob("notes.journal.torn"))


def test_a_malformed_npz_is_refused_before_the_study_is_written(env):
    (env.tmp / "bad.npz").write_bytes(b"PK\x03\x04 a cut archive")
    (env.tmp / "space.yaml").write_text(space_text())
    check_refused(env, [*SEARCH, "--set", "data.dataset={tmp}/bad.npz"], "it is not a zip archive")


@pytest.mark.parametrize(
    ("name", "write", "message"),
    [
        ("header.csv", lambda path: path.write_text("x,y\n"), "has a header but no rows"),
        (
            "huge_label.npz",
            lambda path: np.savez(path, x=np.zeros((20, 4), "f4"), y=np.array([0] * 19 + [10**12])),
            "labels 'y' contain the value 1000000000000",
        ),
        (
            "no_val.npz",
            lambda path: np.savez(path, x_train=np.zeros((8, 2)), y_train=np.zeros(8, int), x_test=np.zeros((2, 2))),
            "lacks ['x_val', 'y_val', 'y_test']",
        ),
    ],
    ids=["csv-header-only", "npz-label-1e12", "npz-without-val"],
)
def test_data_that_cannot_be_read_is_refused_before_the_study_is_written(env, name, write, message):
    """Data files are read before the study opens (they were read at the first trial's build,
    after the study and its first trial were written)."""
    write(env.tmp / name)
    (env.tmp / "space.yaml").write_text(space_text())
    check_refused(env, [*SEARCH, "--set", f"data.dataset={{tmp}}/{name}"], message)


def test_a_study_hfta_nas_did_not_make_is_refused_unless_adopted(tmp_path):
    """A plain Optuna study of the same name: refused and left as it was; --adopt takes it over."""
    journal = tmp_path / "plain.journal"
    plain = optuna.create_study(study_name="tiny", storage=open_storage(str(journal))[0], direction="maximize")
    plain.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=2)
    plain.ask()  # a trial its own script is running
    (tmp_path / "space.yaml").write_text(space_text(budget={"n_trials": 3}))
    args = ["search", str(tmp_path / "space.yaml"), "--storage", str(journal), "--out", str(tmp_path / "out")]
    before = journal.read_bytes()
    refused = invoke(*args, "--threads", "1", "--quiet")
    assert refused.exit_code == 2 and "Traceback" not in refused.output, refused.output
    assert "study 'tiny' in" in refused.output and "was not made by hfta-nas (3 trials" in refused.output
    assert "give --adopt" in refused.output and journal.read_bytes() == before
    adopted = invoke(*args, "--threads", "1", "--quiet", "--adopt")
    assert adopted.exit_code == 0, adopted.output
    trials = optuna.load_study(study_name="tiny", storage=open_storage(str(journal))[0]).trials
    assert trials[2].state == optuna.trial.TrialState.FAIL  # the foreign RUNNING trial, failed as interrupted
    assert any("model.config.width" in t.params for t in trials)  # this space's trials joined it


def test_train_refusing_its_model_prints_the_error_alone(tmp_path, monkeypatch):
    """No progress bar is drawn before the array is built: the error is the command's one line."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken.py").write_text("def build(input_shape, num_classes):\n    raise ValueError('no such layer')\n")
    result = invoke("train", "--model", "broken.py:build", *TRAIN[3:])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [result.output.strip()], result.output
    assert result.output.startswith("error: model factory build raised ValueError: no such layer")


@pytest.mark.parametrize(
    "damage, words",
    [
        ("another application", "an SQLite database of another application (tables invoices)"),
        ("a dropped table", "an Optuna database without its table(s) trial_values"),
        ("schema version 999", "its Optuna schema version is 999"),
    ],
)
def test_an_sqlite_file_optuna_cannot_use_as_it_is_is_refused_and_left_as_it_was(tmp_path, damage, words):
    """Optuna would add its tables to another application's file, or recreate a dropped one empty."""
    import sqlite3

    database = tmp_path / "study.db"
    if damage == "another application":
        with contextlib.closing(sqlite3.connect(database)) as connection:
            connection.execute("CREATE TABLE invoices (id INTEGER)")
            connection.commit()
    else:
        optuna.create_study(storage=f"sqlite:///{database}", study_name="someone")
        change = {
            "a dropped table": "DROP TABLE trial_values",
            "schema version 999": "UPDATE version_info SET schema_version = 999",
        }[damage]
        with contextlib.closing(sqlite3.connect(database)) as connection:
            connection.execute(change)
            connection.commit()
    (tmp_path / "space.yaml").write_text(space_text())
    before = database.read_bytes()
    for extra in ([], ["--dry-run"]):
        result = invoke(
            "search", str(tmp_path / "space.yaml"), "--storage", f"sqlite:///{database}", "--threads", "1", *extra
        )
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        assert words in result.output and "nothing was changed" in result.output, result.output
        assert database.read_bytes() == before


@pytest.fixture
def small_disk(tmp_path):
    """A 48 KiB file system (tmpfs) for a search to fill; skipped where mounting is not allowed."""
    folder = tmp_path / "disk"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small file system here: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)


def test_a_full_disk_is_one_line_and_the_run_after_freeing_space_completes(tmp_path, small_disk):
    journal = small_disk / "study.journal"
    (tmp_path / "space.yaml").write_text(space_text(budget={"n_trials": 24}))
    args = ["search", str(tmp_path / "space.yaml"), "--storage", str(journal), "--out", str(tmp_path / "out")]
    full = invoke(*args, "--threads", "1", "--quiet")
    assert full.exit_code == 2 and "Traceback" not in full.output, full.output
    assert "error: no space left on the device: free space and run the command again" in full.output
    subprocess.run(["mount", "-o", "remount,size=8m", str(small_disk)], check=True)  # space freed
    again = invoke(*args, "--threads", "1", "--quiet")
    assert again.exit_code == 0, again.output
    trials = optuna.load_study(study_name="tiny", storage=open_storage(str(journal))[0]).get_trials(deepcopy=False)
    counted = [t for t in trials if outcome_of(t) in (Outcome.COMPLETE, Outcome.PRUNED, Outcome.FAILED)]
    assert len(counted) == 24 and not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]


def test_a_text_trial_value_in_sqlite_is_refused_naming_the_trial(tmp_path):
    """SQLite keeps whatever is written into a number column (by hand, by another tool): a trial
    whose value is text is refused in one line naming it, by a resumed search, its dry run and an
    export, and the file is left as it was (Optuna handed the text on as a 'value')."""
    import sqlite3

    database = tmp_path / "study.db"
    (tmp_path / "space.yaml").write_text(space_text(budget={"n_trials": 2}, training={"epochs": 1}))
    args = ["search", str(tmp_path / "space.yaml"), "--storage", f"sqlite:///{database}", "--threads", "1"]
    first = invoke(*args, "--out", str(tmp_path / "out"), "--quiet")
    assert first.exit_code == 0, first.output
    with contextlib.closing(sqlite3.connect(database)) as connection:
        connection.execute("UPDATE trial_values SET value = 'n/a' WHERE trial_id = 2")
        connection.commit()
    before = database.read_bytes()
    for extra in (["--n-more", "1", "--quiet"], ["--n-more", "1", "--dry-run"]):
        result = invoke(*args, *extra)
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        [line] = result.output.strip().splitlines()
        assert "trial 1 of study 'tiny'" in line and "'n/a'" in line and "not a number" in line, line
        assert database.read_bytes() == before
