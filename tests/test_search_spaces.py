"""search_spaces: the YAML schema, its errors, and the conversion to Optuna."""

from __future__ import annotations

import re
import warnings

import optuna
import pydantic
import pytest
import yaml
from conftest import synthetic_dataset
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

import hfta_nas
from hfta_nas.errors import HftaNasError
from hfta_nas.search_spaces import (
    SHIPPED_SPACES,
    Fixed,
    ResolvedConfig,
    SearchSpace,
    SpaceError,
    load_space,
    parse_space,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)

SPACE = """\
study: {name: demo, metrics: [val_acc]}
training:
  epochs: 4
  optimizer: {name: adam, lr: 1e-3}
  schedule: {kind: cosine}
model: {family: cnn1d, config: {channels: [32, 32], kernel_size: 5}}
params:
  training.optimizer.lr: {distribution: log_uniform, min: 1.0e-4, max: 1.0e-1}
  training.optimizer.weight_decay: {distribution: uniform, min: 0.0, max: 0.1}
  model.config.kernel_size: {distribution: int_uniform, min: 3, max: 9, step: 2}
  model.config.channels: {distribution: categorical, values: [[16, 16], [32, 32]]}
  data.batch_size: 50
"""
VALUES = {
    "training.optimizer.lr": 0.01,
    "training.optimizer.weight_decay": 0.05,
    "model.config.kernel_size": 7,
    "model.config.channels": [16, 16],
}


@pytest.fixture
def space() -> SearchSpace:
    return parse_space(SPACE, "demo.yaml")


# ------------------------------------------------------------ shipped spaces
def test_every_shipped_space_loads():
    assert {"mnist1d_mlp", "mnist1d_cnn", "digits_cnn", "mnist1d_multiobjective", "mnist1d_user_factory"} <= set(
        SHIPPED_SPACES
    )
    for name, path in SHIPPED_SPACES.items():
        space = load_space(path)
        assert space.source == str(path) and space.text == path.read_text()
        assert space.searched, name
        study = optuna.create_study(
            sampler=space.make_sampler(), pruner=space.make_pruner(), directions=space.directions
        )
        config = space.resolve(space.suggest(study.ask()))
        # each a few minutes on a laptop CPU: diabetes' 265 training samples are 9 steps an epoch
        if space.pbt is not None:  # one population: at most the slot-epochs of 32 trials of 10 epochs
            assert space.pbt.population * config.epochs <= 32 * 10
        else:
            assert config.epochs <= (40 if config.dataset == "diabetes" else 10) and space.budget.n_trials <= 32


def test_shipped_multiobjective_and_factory():
    multi = load_space(SHIPPED_SPACES["mnist1d_multiobjective"])
    assert multi.study.metrics == ["val_acc", "params"] and multi.directions == ["maximize", "minimize"]
    assert isinstance(multi.make_sampler().kind, optuna.samplers.NSGAIISampler)
    assert isinstance(multi.make_pruner(), optuna.pruners.NopPruner)
    # The factory file is not imported (nor needed) to validate the space.
    user = load_space(SHIPPED_SPACES["mnist1d_user_factory"])
    assert user.model.factory == "examples/custom_model.py:build_model"
    config = user.resolve({"training.optimizer.lr": 1e-3, "model.config.width": 32})
    assert config.model == "examples/custom_model.py:build_model" and config.model_config == {"width": 32}


# -------------------------------------------------------------- conversion
def test_distributions_are_the_optuna_ones(space):
    assert space.distributions() == {
        "training.optimizer.lr": FloatDistribution(1e-4, 1e-1, log=True),
        "training.optimizer.weight_decay": FloatDistribution(0.0, 0.1),
        "model.config.kernel_size": IntDistribution(3, 9, step=2),
        "model.config.channels": CategoricalDistribution(["[16, 16]", "[32, 32]"]),
    }
    assert space.fixed == {"data.batch_size": 50}
    assert isinstance(space.params["data.batch_size"], Fixed)


def test_int_log_uniform_and_stepped_uniform():
    space = parse_space(
        "model: mlp\nparams:\n"
        "  model.config.width: {distribution: int_log_uniform, min: 8, max: 256}\n"
        "  model.config.dropout: {distribution: uniform, min: 0.0, max: 0.5, step: 0.1}\n"
    )
    assert space.distributions() == {
        "model.config.width": IntDistribution(8, 256, log=True),
        "model.config.dropout": FloatDistribution(0.0, 0.5, step=0.1),
    }


def test_suggest_with_fixed_trial_decodes_lists(space):
    trial = optuna.trial.FixedTrial(space.encode(VALUES))
    assert space.encode(VALUES)["model.config.channels"] == "[16, 16]"
    assert space.suggest(trial) == VALUES


def test_suggest_with_a_real_study_and_resolve(space):
    study = optuna.create_study(sampler=space.make_sampler(seed=3), direction="maximize")
    for _ in range(6):
        trial = study.ask()
        values = space.suggest(trial)
        assert values["model.config.channels"] in ([16, 16], [32, 32])
        assert trial.params["model.config.channels"] in ("[16, 16]", "[32, 32]")
        assert values["model.config.kernel_size"] in (3, 5, 7, 9)
        assert 1e-4 <= values["training.optimizer.lr"] <= 0.1
        assert space.decode(trial.params) == values
        # Optuna's stored params resolve to the same candidate as suggest's values.
        assert space.resolve(trial.params) == space.resolve(values)
        study.tell(trial, 0.5)


def test_ask_with_distributions_then_decode(space):
    study = optuna.create_study()
    trial = study.ask(space.distributions())
    config = space.resolve(trial.params)
    assert isinstance(config.model_config["channels"], list)


def test_resolve_merges_at_dotted_paths(space):
    config = space.resolve(VALUES)
    assert isinstance(config, ResolvedConfig)
    assert config.model == "cnn1d"
    assert config.model_config["channels"] == [16, 16] and config.model_config["kernel_size"] == 7
    assert config.model_config["pool"] == "none"  # family defaults written out
    assert config.optimizer == "adam"
    assert config.hparams["lr"] == 0.01 and isinstance(config.hparams["lr"], float)
    assert config.hparams["weight_decay"] == 0.05 and config.hparams["beta1"] == 0.9
    assert config.hparams["amsgrad"] is False
    assert config.data == {
        "batch_size": 50,
        "val_fraction": 0.1,
        "test_fraction": 0.1,
        "split_seed": 0,
        "num_samples": None,
    }
    assert config.dataset == "mnist1d" and config.epochs == 4 and isinstance(config.epochs, int)
    assert config.schedule["kind"] == "cosine" and config.schedule["t_max"] == 4  # t_max defaults to epochs
    kwargs = config.train_kwargs()
    assert kwargs["batch_size"] == 50 and kwargs["model_config"] == config.model_config
    assert config.dataset_kwargs() == {"val_fraction": 0.1, "test_fraction": 0.1, "split_seed": 0, "num_samples": None}
    # resolving does not share mutable values between candidates
    kwargs["model_config"]["channels"].append(1)
    assert space.resolve(VALUES).model_config["channels"] == [16, 16]


def test_resolve_refuses_bad_values(space):
    with pytest.raises(SpaceError, match="no value given for searched param 'model.config.channels'"):
        space.resolve({k: v for k, v in VALUES.items() if k != "model.config.channels"})
    with pytest.raises(SpaceError, match="not a param of this space"):
        space.resolve({**VALUES, "training.epochs": 3})
    with pytest.raises(SpaceError, match=r"8 is outside \[3, 9\] with step 2"):
        space.resolve({**VALUES, "model.config.kernel_size": 8})
    with pytest.raises(SpaceError, match="not one of the choices"):
        space.resolve({**VALUES, "model.config.channels": [8, 8]})
    with pytest.raises(SpaceError, match=r"demo\.yaml:8: params\.training\.optimizer\.lr: 0\.5 is outside"):
        space.resolve({**VALUES, "training.optimizer.lr": 0.5})


def test_betas_and_optimizer_choice():
    space = parse_space(
        "training: {optimizer: {name: adam, betas: [0.8, 0.99]}}\nparams:\n"
        "  training.optimizer.name: {distribution: categorical, values: [adam, adamw]}\n"
    )
    config = space.resolve({"training.optimizer.name": "adamw"})
    assert config.optimizer == "adamw" and config.hparams["beta1"] == 0.8 and config.hparams["beta2"] == 0.99
    assert config.hparams["weight_decay"] == 1e-2  # AdamW's default, not Adam's
    assert "betas" not in config.hparams


def test_resolved_config_round_trips_through_yaml(space, tmp_path):
    config = space.resolve(VALUES)
    path = config.save(tmp_path / "best.yaml", header="best trial 3\nval_acc=0.9")
    text = path.read_text()
    assert text.startswith("# best trial 3\n# val_acc=0.9\n")
    assert "channels: [16, 16]" in text and "origin" not in text
    assert ResolvedConfig.from_file(path) == config
    assert ResolvedConfig.from_yaml(config.to_yaml()) == config


def test_resolved_config_keeps_its_origin():
    import numpy as np

    config = parse_space(
        "model: mlp\nparams:\n  model.config.width: {distribution: int_uniform, min: 4, max: 8}"
    ).resolve({"model.config.width": np.int64(6)})
    assert type(config.model_config["width"]) is int
    text = config.to_yaml(study="s", trial=3, values={"val_acc": np.float64(0.75)}, seeds={"init": 1, "data": 2})
    again = ResolvedConfig.from_yaml(text)
    assert again == config
    assert again.origin == {"study": "s", "trial": 3, "values": {"val_acc": 0.75}, "seeds": {"init": 1, "data": 2}}


def test_resolved_config_file_errors(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("model: cnn1d\nhparams:\n  lr: -1\noptimizer: adam\n")
    with pytest.raises(SpaceError) as error:
        ResolvedConfig.from_file(path)
    assert f"{path}:3: hparams.lr: expected a value > 0" in str(error.value)
    path.write_text("model: cnn1d\nepochs: 3\nmodel_config: {kernal_size: 3}\n")
    with pytest.raises(SpaceError, match=r"cfg\.yaml:3: model_config\.kernal_size: .*did you mean 'kernel_size'"):
        ResolvedConfig.from_file(path)
    path.write_text("model: cnn1d\nepoch: 3\n")
    with pytest.raises(SpaceError, match=r"cfg\.yaml:2: epoch: unknown key 'epoch' \(did you mean 'epochs'\?\)"):
        ResolvedConfig.from_file(path)
    with pytest.raises(SpaceError, match="file not found"):
        ResolvedConfig.from_file(tmp_path / "missing.yaml")


def test_resolved_config_trains_through_hfta_nas():
    space = parse_space(
        "model: {family: mlp, config: {width: 8, depth: 1}}\ntraining: {epochs: 1, optimizer: sgd}\n"
        "data: {batch_size: 20}\nparams:\n  training.optimizer.lr: {distribution: log_uniform, min: 0.01, max: 0.1}\n"
    )
    config = space.resolve({"training.optimizer.lr": 0.05})
    run = hfta_nas.train(dataset=synthetic_dataset(), seeds=[0, 1], dtype="float64", **config.train_kwargs())
    assert len(run.results) == 2 and all(r.epochs == 1 for r in run.results.values())


def test_shared_key_separates_what_an_array_cannot_mix():
    space = parse_space(
        "training: {optimizer: sgd}\nparams:\n  data.batch_size: {distribution: categorical, values: [32, 64]}\n"
        "  training.optimizer.lr: {distribution: uniform, min: 0.01, max: 0.1}\n"
    )
    a = space.resolve({"data.batch_size": 32, "training.optimizer.lr": 0.01})
    b = space.resolve({"data.batch_size": 32, "training.optimizer.lr": 0.05})
    c = space.resolve({"data.batch_size": 64, "training.optimizer.lr": 0.01})
    assert a.shared_key() == b.shared_key() != c.shared_key()
    assert a.slot_hparams()["lr"] == 0.01 and a.optimizer_flags() == {"nesterov": False, "maximize": False}


# ------------------------------------------------------- samplers, pruners
def test_tpe_defaults_and_overrides():
    sampler = parse_space("params: {}").make_sampler().kind  # what each trial's sampler is
    assert isinstance(sampler, optuna.samplers.TPESampler)
    assert sampler._constant_liar is True and sampler._multivariate is True
    sampler = (
        parse_space("sampler: {name: tpe, kwargs: {constant_liar: false, n_startup_trials: 3}}").make_sampler().kind
    )
    assert sampler._constant_liar is False and sampler._multivariate is True and sampler._n_startup_trials == 3


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("random", optuna.samplers.RandomSampler),
        ("nsga2", optuna.samplers.NSGAIISampler),
        ("gp", optuna.samplers.GPSampler),
        ("tpe", optuna.samplers.TPESampler),
    ],
)
def test_sampler_classes(name, cls):
    assert type(parse_space(f"sampler: {name}").make_sampler().kind) is cls


def test_cmaes_needs_its_package():
    import importlib.util

    space = parse_space("sampler: cmaes\n", "c.yaml")
    if importlib.util.find_spec("cmaes") is None:
        with pytest.raises(SpaceError, match=r"c\.yaml:1: sampler\.name: .*pip install cmaes"):
            space.make_sampler()
    else:
        assert isinstance(space.make_sampler().kind, optuna.samplers.CmaEsSampler)


@pytest.mark.parametrize(
    ("text", "cls"),
    [
        ("pruner: none", optuna.pruners.NopPruner),
        ("pruner: median", optuna.pruners.MedianPruner),
        ("pruner: successive_halving", optuna.pruners.SuccessiveHalvingPruner),
        ("pruner: hyperband", optuna.pruners.HyperbandPruner),
        ("params: {}", optuna.pruners.MedianPruner),
    ],
)
def test_pruner_classes(text, cls):
    assert type(parse_space(text).make_pruner()) is cls


def test_pruner_kwargs_reach_optuna():
    pruner = parse_space("pruner: {name: median, kwargs: {n_startup_trials: 2, n_warmup_steps: 3}}").make_pruner()
    assert pruner._n_startup_trials == 2 and pruner._n_warmup_steps == 3


def test_grid_sampler_covers_the_grid_with_ask_and_tell():
    space = parse_space(
        "sampler: grid\nmodel: mlp\nparams:\n"
        "  model.config.width: {distribution: categorical, values: [8, 16]}\n"
        "  model.config.depth: {distribution: int_uniform, min: 1, max: 3}\n"
        "  model.config.dropout: {distribution: uniform, min: 0.0, max: 0.2, step: 0.1}\n"
        "  training.optimizer.lr: 0.01\n"
    )
    assert space.grid_size == 2 * 3 * 3
    study = optuna.create_study(sampler=space.make_sampler())
    assert isinstance(study.sampler.kind, optuna.samplers.GridSampler)
    seen = set()
    for _ in range(space.grid_size):
        trial = study.ask()
        values = space.suggest(trial)
        seen.add(tuple(values.values()))
        study.tell(trial, 0.0)  # the last tell must not raise (Optuna's stop() outside optimize)
    assert len(seen) == space.grid_size


# ------------------------------------------------------------------ errors
ERRORS = [
    # (name, text, line, key, fragment of the message)
    ("yaml syntax", "params:\n  a: [1, 2\n  b: 3\n", 3, "", "YAML syntax error at column"),
    ("unknown top key", "study: {}\nsmapler: tpe\n", 2, "smapler", "did you mean 'sampler'"),
    (
        "unknown param path",
        "params:\n  training.optimiser.lr: 0.1\n",
        2,
        "params.training.optimiser.lr",
        "did you mean 'training.optimizer.lr'",
    ),
    (
        "unknown optimizer argument",
        "params:\n  training.optimizer.lrate: 0.1\n",
        2,
        "params.training.optimizer.lrate",
        "optimizer 'adam' has no argument 'lrate'",
    ),
    (
        "min > max",
        "params:\n  training.optimizer.lr:\n    distribution: log_uniform\n    min: 0.1\n    max: 0.01\n",
        2,
        "params.training.optimizer.lr",
        "'min' must be < 'max' (got min=0.1, max=0.01)",
    ),
    (
        "int min > max",
        "params:\n\n  model.config.kernel_size: {distribution: int_uniform, min: 9, max: 3}\n",
        3,
        "params.model.config.kernel_size",
        "'min' must be <= 'max'",
    ),
    (
        "log_uniform min <= 0",
        "params:\n  training.optimizer.lr: {distribution: log_uniform, min: 0, max: 1}\n",
        2,
        "params.training.optimizer.lr",
        "log_uniform needs 'min' > 0",
    ),
    (
        "unknown distribution",
        "params:\n  training.optimizer.lr: {distribution: normal, min: 0, max: 1}\n",
        2,
        "params.training.optimizer.lr.distribution",
        "unknown distribution 'normal'",
    ),
    (
        "foreign distribution",
        "params:\n  model.config.kernel_size: {distribution: randint, min: 3, max: 9}\n",
        2,
        "params.model.config.kernel_size.distribution",
        "did you mean int_uniform (note: here 'max' is included)",
    ),
    (
        "empty categorical",
        "params:\n  model.config.channels:\n    distribution: categorical\n    values: []\n",
        4,
        "params.model.config.channels.values",
        "expected at least 1 item",
    ),
    ("unknown sampler", "sampler:\n  name: tpee\n", 2, "sampler.name", "did you mean 'tpe'"),
    ("unknown pruner", "pruner: {name: medain}\n", 1, "pruner.name", "did you mean 'median'"),
    (
        "bad sampler kwarg",
        "sampler:\n  name: tpe\n  kwargs:\n    n_startup_trial: 5\n",
        4,
        "sampler.kwargs.n_startup_trial",
        "valid arguments: consider_prior",
    ),
    (
        "sampler kwarg type",
        "sampler: {name: nsga2, kwargs: {population_size: many}}\n",
        1,
        "sampler.kwargs.population_size",
        "expected an integer",
    ),
    (
        "sampler seed kwarg",
        "sampler: {name: random, kwargs: {seed: 1}}\n",
        1,
        "sampler.kwargs.seed",
        "top-level 'seed'",
    ),
    (
        "bad pruner kwarg",
        "pruner:\n  name: median\n  kwargs: {warmup: 2}\n",
        3,
        "pruner.kwargs.warmup",
        "did you mean 'n_warmup_steps'",
    ),
    (
        "multi-objective without directions",
        "study:\n  metrics: [val_acc, params]\n",
        1,
        "study",
        "missing key 'directions'",
    ),
    (
        "directions of the wrong length",
        "study:\n  metrics: [val_acc, params]\n  directions: [maximize]\n",
        3,
        "study.directions",
        "expected 2 direction(s)",
    ),
    (
        "multi-objective with a pruner",
        "study: {metrics: [val_acc, params], directions: [maximize, minimize]}\npruner: median\n",
        2,
        "pruner.name",
        "Optuna prunes single-objective studies only",
    ),
    (
        "unknown metric",
        "study: {metrics: [accuracy]}\n",
        1,
        "study.metrics[0]",
        "metric 'accuracy' is not measured here; measured: train_loss, train_acc, val_loss, val_acc",
    ),
    (
        "grid with a continuous param",
        "sampler: grid\nparams:\n  training.optimizer.lr: {distribution: log_uniform, min: 0.001, max: 0.1}\n",
        3,
        "params.training.optimizer.lr",
        "grid sampler needs a finite set of values",
    ),
    ("epochs not a number", "training:\n  epochs: ten\n", 2, "training.epochs", "expected an integer, got 'ten'"),
    ("negative epochs", "training:\n  epochs: -2\n", 2, "training.epochs", "expected a value >= 1"),
    ("float epochs", "training:\n  epochs: 2.5\n", 2, "training.epochs", "expected an integer"),
    ("empty file", "", None, "", "the file is empty"),
    ("comment-only file", "# nothing\n", None, "", "the file is empty"),
    ("top level not a mapping", "- params\n", 1, "", "expected a mapping of sections"),
    ("section not a mapping", "budget: 12\n", 1, "budget", "expected a mapping"),
    (
        "duplicate key",
        "training: {epochs: 2}\nseed: 1\ntraining: {epochs: 3}\n",
        3,
        "training",
        "duplicate key 'training' (first given on line 1)",
    ),
    (
        "step does not reach max",
        "params:\n  model.config.kernel_size: {distribution: int_uniform, min: 3, max: 10, step: 2}\n",
        2,
        "params.model.config.kernel_size",
        "set max to 9 or 11",
    ),
    (
        "float step does not divide",
        "params:\n  model.config.dropout: {distribution: uniform, min: 0, max: 0.5, step: 0.2}\n",
        2,
        "params.model.config.dropout",
        "does not divide",
    ),
    (
        "family config key",
        "model:\n  family: cnn1d\n  config: {kernal_size: 3}\n",
        3,
        "model.config.kernal_size",
        "did you mean 'kernel_size'",
    ),
    (
        "family config param key",
        "model: mlp\nparams:\n  model.config.channels: [8]\n",
        3,
        "params.model.config.channels",
        "model family 'mlp': unknown key 'channels'",
    ),
    (
        "config value does not fit the data",
        "model: {family: cnn1d, config: {pool: max, padding: valid}}\nparams:\n"
        "  model.config.kernel_size: {distribution: int_uniform, min: 3, max: 39}\n",
        3,
        "params.model.config.kernel_size",
        "'max'",
    ),
    (
        "uniform for an integer setting",
        "params:\n  data.batch_size: {distribution: uniform, min: 16, max: 64}\n",
        2,
        "params.data.batch_size",
        "use int_uniform",
    ),
    (
        "lr choice not positive",
        "params:\n  training.optimizer.lr: {distribution: categorical, values: [0.1, 0]}\n",
        2,
        "params.training.optimizer.lr",
        "'values[1]' = 0: expected a value > 0",
    ),
    (
        "equal categorical choices",
        "params:\n  model.config.kernel_size: {distribution: categorical, values: [3, 3.0]}\n",
        2,
        "params.model.config.kernel_size",
        "Optuna cannot tell them apart",
    ),
    (
        "distribution key missing",
        "params:\n  training.optimizer.lr: {min: 0.1, max: 1}\n",
        2,
        "params.training.optimizer.lr",
        "missing key 'distribution'",
    ),
    (
        "foreign distribution key",
        "params:\n  training.optimizer.lr: {distribution: uniform, low: 0.1, high: 1}\n",
        2,
        "params.training.optimizer.lr.low",
        "did you mean 'min'",
    ),
    (
        "section as a param",
        "params:\n  training.optimizer: {name: sgd}\n",
        2,
        "params.training.optimizer",
        "is a section, not one setting",
    ),
    ("non-searchable param", "params:\n  budget.n_trials: 3\n", 2, "params.budget.n_trials", "cannot be params"),
    ("dataset as a param", "params:\n  data.dataset: digits\n", 2, "params.data.dataset", "same data"),
    ("unknown dataset", "data:\n  dataset: mnist-1d\n", 2, "data.dataset", "did you mean 'mnist1d'"),
    ("unknown family", "model:\n  family: cnn\n", 2, "model.family", "unknown model family 'cnn'"),
    ("family and factory", "model:\n  family: mlp\n  factory: a:b\n", 1, "model", "exactly one of"),
    ("bad factory", "model:\n  factory: my_models.build\n", 2, "model.factory", "expected 'module:function'"),
    (
        "optimizer argument of another optimizer",
        "training:\n  optimizer: {name: sgd, momentum: 0.9}\nparams:\n"
        "  training.optimizer.name: {distribution: categorical, values: [sgd, adam]}\n",
        2,
        "training.optimizer.momentum",
        "optimizer 'adam'",
    ),
    ("unknown optimizer", "training:\n  optimizer: adamm\n", 2, "training.optimizer.name", "did you mean 'adam'"),
    (
        "unknown schedule kind",
        "training:\n  schedule: {kind: cosin}\n",
        2,
        "training.schedule.kind",
        "did you mean 'cosine'",
    ),
    (
        "unknown schedule argument",
        "training:\n  schedule:\n    kind: step\n    stepsize: 2\n",
        4,
        "training.schedule.stepsize",
        "did you mean 'step_size'",
    ),
    (
        "schedule without kind",
        "params:\n  training.schedule.t_max: 5\n",
        2,
        "params.training.schedule.t_max",
        "a schedule needs 'kind'",
    ),
    ("array size", "array:\n  size: 0\n", 2, "array.size", "an integer from 1 to 4096 or 'auto'"),
    ("no budget", "budget: {n_trials: null}\n", 1, "budget", "never stop"),
    (
        "num_samples for digits",
        "model: mlp\ndata:\n  dataset: digits\n  num_samples: 100\n",
        4,
        "data.num_samples",
        "only applies",
    ),
    ("fractions", "data: {val_fraction: 0.6, test_fraction: 0.5}\n", 1, "data", "must be < 1"),
    ("bad character", "params:\n  a: \x07\n", 2, "", "not allowed"),
    ("recursive alias", "a: &x [1, *x]\n", 1, "", "recursive"),
]


@pytest.mark.parametrize(("name", "text", "line", "key", "fragment"), ERRORS, ids=[e[0] for e in ERRORS])
def test_errors_name_file_line_and_key(tmp_path, name, text, line, key, fragment):
    path = tmp_path / "bad_space.yaml"
    path.write_text(text)
    with pytest.raises(SpaceError) as caught:
        load_space(path)
    error = caught.value
    assert isinstance(error, HftaNasError)
    message = str(error)
    first = error.problems[0]
    where = f"{path}:{line}: " if line is not None else f"{path}: "
    assert message.startswith(where), message
    if key:
        assert message.startswith(f"{where}{key}: "), message
    assert fragment in message, message
    assert (first.source, first.line) == (str(path), line) and first.key == key


def test_all_problems_are_listed_at_once():
    with pytest.raises(SpaceError) as caught:
        parse_space("training:\n  epochs: 0\nseed: -1\n", "two.yaml")
    assert [(p.line, p.key) for p in caught.value.problems] == [(2, "training.epochs"), (3, "seed")]
    assert str(caught.value).count("\n") == 1


# -------------------------------------------------------------- the format
def test_yaml_conveniences():
    space = parse_space(
        "sampler: random\npruner: none\ntraining: {optimizer: sgd, schedule: step}\nmodel: gru\n"
        "study:\ndata:\nparams:\n  training.optimizer.lr: {distribution: uniform, min: 1e-3, max: 2E-2}\n"
    )
    assert space.sampler.name == "random" and space.pruner.name == "none"
    assert space.training.optimizer.name == "sgd" and space.training.schedule.kind == "step"
    assert space.model.family == "gru" and space.study.metrics == ["val_acc"]
    assert space.distributions()["training.optimizer.lr"] == FloatDistribution(1e-3, 2e-2)
    assert parse_space("model: pkg.models:build").model.factory == "pkg.models:build"


def test_defaults():
    space = parse_space("params:\n")
    assert space.model.family == "cnn1d" and space.data.dataset == "mnist1d"
    assert space.sampler.name == "tpe" and space.pruner.name == "median"
    assert space.budget.n_trials == 32 and space.array.size == "auto" and space.seed == 0
    assert space.directions == ["maximize"]
    assert parse_space("study: {metrics: [val_loss]}").directions == ["minimize"]
    config = space.default_config()
    assert config is not None and config.model == "cnn1d" and config.schedule is None


def test_space_is_frozen(space):
    with pytest.raises(pydantic.ValidationError):  # pydantic's frozen models refuse assignment
        space.seed = 3  # type: ignore[misc]


# --------------------------------------------------------------- property
KEYS = [
    "study",
    "sampler",
    "pruner",
    "budget",
    "array",
    "data",
    "training",
    "model",
    "seed",
    "params",
    "name",
    "metrics",
    "kwargs",
    "n_trials",
    "size",
    "dataset",
    "batch_size",
    "epochs",
    "optimizer",
    "schedule",
    "kind",
    "lr",
    "family",
    "factory",
    "config",
    "distribution",
    "min",
    "max",
    "step",
    "values",
    "training.optimizer.lr",
    "model.config.channels",
    "model.config.kernel_size",
    "training.optimizer.name",
    "tpe",
    "grid",
    "uniform",
    "log_uniform",
    "int_uniform",
    "categorical",
    "cnn1d",
    "mlp",
    "adam",
    "cosine",
]
_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 100), st.floats(), st.sampled_from(KEYS), st.text(max_size=4)
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(KEYS), inner, max_size=3)),
    max_leaves=12,
)


def _space_or_space_error(text: str) -> None:
    try:
        result = parse_space(text, "fuzz.yaml")
    except SpaceError as error:
        assert str(error).startswith("fuzz.yaml")
        return
    assert isinstance(result, SearchSpace)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study = optuna.create_study(sampler=result.make_sampler(), directions=result.directions)
        result.resolve(result.suggest(study.ask()))


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.text())
def test_any_text_is_a_space_or_a_space_error(text):
    _space_or_space_error(text)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.dictionaries(st.sampled_from(KEYS[:10]), _values, max_size=5))
def test_any_yaml_mapping_is_a_space_or_a_space_error(data):
    _space_or_space_error(yaml.safe_dump(data))


def test_error_lines_point_at_the_key():
    text = SPACE.replace("max: 9, step: 2", "max: 10, step: 2")
    with pytest.raises(SpaceError) as caught:
        parse_space(text, "demo.yaml")
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "model.config.kernel_size" in t)
    assert re.match(rf"demo\.yaml:{line}: params\.model\.config\.kernel_size: ", str(caught.value))


def test_readme_examples_are_valid():
    from pathlib import Path

    import hfta_nas.search_spaces as search_spaces

    readme = (Path(search_spaces.__file__).parent / "README.md").read_text()
    space_text, pbt_text, constraints_text, config_text = re.findall(r"```yaml\n(.*?)```", readme, re.S)
    assert len(parse_space(space_text, "README.md").searched) == 4
    assert parse_space(space_text + constraints_text, "README.md").constraints
    assert ResolvedConfig.from_yaml(config_text, "README.md").origin["trial"] == 12
    searched_lr = "params:\n  training.optimizer.lr: {distribution: log_uniform, min: 1.0e-4, max: 1.0e-2}\n"
    explore = search_spaces.pbt_options(parse_space(pbt_text + searched_lr, "README.md"))["explore"]
    assert sorted(explore) == ["lr", "weight_decay"]


def test_a_bare_values_list_is_a_categorical():
    """`{values: [...]}` alone, as in a Weights & Biases sweep file, reads as `distribution: categorical`."""
    import yaml as _yaml

    from tests.test_search import space_text as _space_text

    text = _yaml.safe_load(_space_text())
    text["params"]["model.config.width"] = {"values": [16, 32]}
    bare = parse_space(_yaml.safe_dump(text), source="bare.yaml")
    explicit = parse_space(_space_text(), source="explicit.yaml")
    assert bare.params["model.config.width"] == explicit.params["model.config.width"]
    text["params"]["model.config.width"] = {"values": []}
    with pytest.raises(SpaceError, match="model.config.width"):
        parse_space(_yaml.safe_dump(text), source="empty.yaml")


# ------------------------------------------------------------ a study keeps its space


def test_two_processes_opening_one_study_with_different_spaces_do_not_both_succeed(tmp_path):
    """Both find the study absent at once: the first to store its space wins, the other is refused."""
    import threading

    from hfta_nas.search import open_storage, study_lock, study_text
    from hfta_nas.search_spaces import open_space_study
    from tests.test_search import space_text as _space_text

    journal = str(tmp_path / "study.journal")
    spaces = {
        "mlp": parse_space(_space_text(), "mlp.yaml"),
        "random": parse_space(_space_text(sampler={"name": "random"}), "random.yaml"),
    }
    outcomes: dict[str, str] = {}

    def open_it(name: str) -> None:
        try:
            open_space_study(spaces[name], journal)
            outcomes[name] = "opened"
        except HftaNasError as error:
            outcomes[name] = str(error)

    opened, location = open_storage(journal)
    threads = [threading.Thread(target=open_it, args=(name,)) for name in spaces]
    with study_lock(opened, location, "tiny"):  # both start before either may store its space
        for thread in threads:
            thread.start()
    for thread in threads:
        thread.join()
    winners = [name for name, outcome in outcomes.items() if outcome == "opened"]
    assert len(winners) == 1, outcomes
    (loser,) = set(spaces) - set(winners)
    assert "was searched with another space: sampler.name is" in outcomes[loser]
    study = optuna.load_study(study_name="tiny", storage=open_storage(journal)[0])
    assert study_text(study, "space_text") == spaces[winners[0]].text


def test_a_new_space_on_a_study_keeps_each_trials_own_space_for_stability(tmp_path):
    """`--new-space` is asked for explicitly: the earlier trials are rebuilt with their own space."""
    from hfta_nas.search import open_storage
    from hfta_nas.stability._configs import top_k_configs
    from tests.test_search import search
    from tests.test_search import space_text as _space_text

    tiny = {"budget": {"n_trials": 1}, "array": {"size": 1}, "training": {"epochs": 1, "optimizer": {"name": "adam"}}}
    search(tmp_path, _space_text(**tiny))
    deeper = _space_text(**tiny, model={"family": "mlp", "config": {"depth": 2}})
    with pytest.raises(HftaNasError, match="model.config.depth is 2 here but 1 in the study"):
        search(tmp_path, deeper, n_trials=2)
    search(tmp_path, deeper, n_trials=2, new_space=True)
    configs = top_k_configs(open_storage(str(tmp_path / "study.journal"))[0], "tiny", 2)
    depths = {c.config.origin["trial"]: c.config.model_config["depth"] for c in configs}
    assert depths == {0: 1, 1: 2}
