"""Stability studies: seed designs, the runner (per-source seeds, slot independence,
failures counted), storage and resume, config sources, and the commands end to end."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
import pytest
import torch
from click.testing import CliRunner
from optuna.trial import TrialState

from hfta_nas import ModelArray
from hfta_nas.cli import main
from hfta_nas.models import resolve_model
from hfta_nas.search import open_storage
from hfta_nas.search_spaces import SHIPPED_SPACES, ResolvedConfig
from hfta_nas.stability._configs import DEFAULT_CONFIG, LabelledConfig, load_config, parse_params
from hfta_nas.stability._design import parse_vary, plan, source_seed
from hfta_nas.stability._result import StabilityResult
from hfta_nas.stability._runner import run_stability, train_seeds
from tests.conftest import synthetic_dataset

TINY = """\
model: cnn1d
model_config: {channels: [4], kernel_size: 3, dropout: 0.1}
dataset: mnist1d
data: {batch_size: 50, num_samples: 400}
optimizer: adam
hparams: {lr: 0.01}
epochs: 2
"""


@pytest.fixture
def tiny_config(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return path


def mlp_config(**changes):
    config = ResolvedConfig.from_yaml(
        "model: mlp\nmodel_config: {width: 8, depth: 1}\ndataset: digits\n"
        "optimizer: sgd\nhparams: {lr: 0.05}\nepochs: 2\ndata: {batch_size: 20}\n"
    )
    return dataclasses.replace(config, **changes)


# ------------------------------------------------------------------ designs
def test_each_source_has_its_own_stream_and_fixed_sources_keep_their_first_seed():
    plans = plan(5, vary=("data",))
    assert len({p.seeds["data"] for p in plans}) == 5
    assert {p.seeds["init"] for p in plans} == {source_seed(0, "init", 0)}
    assert {p.seeds["dropout"] for p in plans} == {source_seed(0, "dropout", 0)}
    assert source_seed(0, "init", 1) != source_seed(0, "data", 1) != source_seed(1, "data", 1)
    assert all(0 <= p.seeds[s] < 2**31 for p in plans for s in p.seeds)


def test_decompose_adds_one_design_per_varied_source():
    plans = plan(3, vary=("init", "data"), decompose=True)
    designs = {d: [p for p in plans if p.design == d] for d in ("all", "only_init", "only_data")}
    assert [len(v) for v in designs.values()] == [3, 3, 3] and len(plans) == 9
    assert len({p.seeds["init"] for p in designs["only_init"]}) == 3
    assert len({p.seeds["data"] for p in designs["only_init"]}) == 1
    assert len({p.seeds["data"] for p in designs["only_data"]}) == 3
    assert len({p.seeds["init"] for p in designs["only_data"]}) == 1


@pytest.mark.parametrize("bad", ["", "weights", "init,colour"])
def test_unknown_sources_are_refused(bad):
    with pytest.raises(Exception, match="--vary takes"):
        parse_vary(bad)
    assert parse_vary("all") == ("init", "data", "dropout")  # the split only when named


@pytest.mark.parametrize("n", [0, -3])
def test_zero_seeds_are_refused(n):
    with pytest.raises(Exception, match="positive integer"):
        plan(n)


# ------------------------------------------------------------------- runner
def test_vary_data_keeps_initial_weights_equal_across_slots_and_changes_only_the_order():
    config = mlp_config()
    data = synthetic_dataset(n_train=40, shape=(64,), classes=10)
    plans = plan(4, vary=("data",))
    factory = resolve_model(
        config.model, config.model_config, input_shape=data.input_shape, num_classes=data.num_classes
    )
    array = ModelArray.from_factory(factory, [p.seeds["init"] for p in plans], dtype=torch.float64)
    first = array.slot_state_dict(0)
    for slot in range(1, 4):
        assert all(torch.equal(first[k], v) for k, v in array.slot_state_dict(slot).items())
    outcomes, _ = train_seeds(config, plans, data, dtype="float64")
    losses = [o.final["train_loss"] for o in outcomes]
    assert len(set(losses)) == 4  # same start, different data order: different endings


def test_every_slot_ends_as_if_trained_alone():
    config = mlp_config()
    data = synthetic_dataset(n_train=40, shape=(64,), classes=10)
    plans = plan(3)
    together, _ = train_seeds(config, plans, data, dtype="float64")
    for p, outcome in zip(plans, together):
        alone, _ = train_seeds(config, [p], data, dtype="float64")
        assert len(alone[0].history) == len(outcome.history)
        for mine, reference in zip(outcome.history, alone[0].history):
            assert mine == pytest.approx(reference, rel=1e-12, abs=1e-12)


def test_diverged_seeds_are_counted_not_dropped(tmp_path):
    config = mlp_config(
        hparams={
            "lr": 1e20,
            "momentum": 0.0,
            "dampening": 0.0,
            "weight_decay": 0.0,
            "nesterov": False,
            "maximize": False,
        }
    )
    storage, location = open_storage(str(tmp_path / "s.journal"))
    result, _ = run_stability([LabelledConfig("hot", config)], n_seeds=3, storage=storage, storage_location=location)
    assert len(result.seeds) == 3
    assert set(result.seeds["status"]) == {"failed"}
    assert all(result.seeds["reason"].str.len() > 0)
    study = optuna.load_study(study_name=result.metadata["studies"]["hot"], storage=storage)
    assert [t.state for t in study.trials] == [TrialState.FAIL] * 3


def test_a_rerun_reuses_stored_seeds_and_trains_only_new_ones(tmp_path):
    config = mlp_config()
    storage, location = open_storage(str(tmp_path / "s.journal"))
    first, _ = run_stability([LabelledConfig("m", config)], n_seeds=3, storage=storage, storage_location=location)
    events = []
    second, _ = run_stability(
        [LabelledConfig("m", config)],
        n_seeds=4,
        storage=storage,
        storage_location=location,
        on_event=lambda kind, info: events.append((kind, info)),
    )
    assert second.metadata["reused_seeds"] == 3
    assert [info["size"] for kind, info in events if kind == "array"] == [1]
    assert second.seeds["test_acc"].tolist()[:3] == first.seeds["test_acc"].tolist()
    study = optuna.load_study(study_name=second.metadata["studies"]["m"], storage=storage)
    assert len(study.trials) == 4 and all(t.state == TrialState.COMPLETE for t in study.trials)
    assert {t.user_attrs["seed_index"] for t in study.trials} == {0, 1, 2, 3}
    assert all(t.intermediate_values for t in study.trials)
    for t in study.trials:  # the curve is the objective's (test_acc), its last point the trial's value
        assert t.intermediate_values[max(t.intermediate_values)] == t.value


def test_array_size_splits_the_seeds_without_changing_results():
    config = mlp_config()
    whole, _ = run_stability([LabelledConfig("m", config)], n_seeds=4, dtype="float64")
    split, _ = run_stability([LabelledConfig("m", config)], n_seeds=4, dtype="float64", array_size=3)
    assert [a["size"] for a in split.metadata["arrays"]] == [3, 1]
    assert split.seeds["test_loss"].tolist() == pytest.approx(whole.seeds["test_loss"].tolist(), rel=1e-12)


def test_protocol_metadata_records_what_reproduces_the_run():
    result, _ = run_stability([LabelledConfig("m", mlp_config())], n_seeds=2, vary=("init",), base_seed=7)
    meta = result.metadata
    assert meta["vary"] == ["init"] and meta["base_seed"] == 7 and meta["n_test"] > 0
    assert set(meta["versions"]) >= {"hfta_nas", "torch", "optuna", "numpy", "scipy"}
    assert meta["determinism"]["torch_threads"] >= 1
    assert meta["seeds_per_source"]["init"] == sorted(source_seed(7, "init", i) for i in range(2))
    assert meta["configs"]["m"]["model"] == "mlp"


# ------------------------------------------------------------------ configs
def test_a_space_file_with_params_gives_the_same_config_as_resolve():
    values = [
        "training.optimizer.lr=3e-3",
        "training.optimizer.weight_decay=1e-4",
        "model.config.channels=[32, 32]",
        "model.config.kernel_size=5",
    ]
    config = load_config(SHIPPED_SPACES["mnist1d_cnn"], parse_params(values))
    assert config.hparams["lr"] == 3e-3 and config.model_config["channels"] == [32, 32]


def test_a_space_file_without_params_says_which_to_fix():
    with pytest.raises(Exception, match="fix each with --params"):
        load_config(SHIPPED_SPACES["mnist1d_cnn"])


def test_the_shipped_default_config_loads():
    config = load_config(DEFAULT_CONFIG)
    assert config.model == "cnn1d" and config.dataset == "mnist1d" and config.model_config["dropout"] > 0


# ----------------------------------------------------------------- commands
def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_stability_command_writes_every_format_and_stores_the_seeds(tmp_path, tiny_config):
    out, journal = tmp_path / "report", tmp_path / "runs" / "s.journal"
    result = cli("stability", tiny_config, "--seeds", 4, "--out", out, "--storage", journal, "--threads", 1, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    (row,) = summary["configs"]
    assert row["config"] == "tiny" and row["n"] + row["n_failed"] == 4
    assert set(summary["files"]) == {"html", "md", "csv", "json", "tex", "plots"}
    assert all(Path(p).exists() for paths in summary["files"].values() for p in paths)
    assert (out / "result" / "seeds.csv").exists()
    html = next(Path(p) for p in summary["files"]["html"] if p.endswith(".html")).read_text()
    assert "data:image/png;base64," in html or "<svg" in html
    # stored as a study whose trials are the seeds, with the report attached as an artifact
    storage, _ = open_storage(str(journal))
    (name,) = summary["studies"].values()
    study = optuna.load_study(study_name=name, storage=storage)
    assert len(study.trials) == 4
    from optuna.artifacts import get_all_artifact_meta

    assert [m.filename for m in get_all_artifact_meta(study)] == ["report.html"]
    assert summary["dashboard"].startswith(f"optuna-dashboard {journal}")

    # the same command again reuses every seed; `report` rebuilds from the folder or the study
    again = cli("stability", tiny_config, "--seeds", 4, "--out", out, "--storage", journal, "--json")
    assert json.loads(again.output)["reused_seeds"] == 4 and json.loads(again.output)["arrays"] == []
    from_folder = cli("report", out, "--format", "md,json", "--json")
    assert from_folder.exit_code == 0, from_folder.output
    assert json.loads(from_folder.output)["configs"][0]["mean"] == pytest.approx(row["mean"], rel=1e-12)
    from_study = cli(
        "report", "--study", name, "--storage", journal, "--out", tmp_path / "again", "--format", "csv", "--json"
    )
    assert from_study.exit_code == 0, from_study.output
    assert json.loads(from_study.output)["configs"][0]["mean"] == pytest.approx(row["mean"], rel=1e-12)


def test_compare_two_configs_reports_the_comparison(tmp_path, tiny_config):
    other = tmp_path / "slow.yaml"
    other.write_text(TINY.replace("lr: 0.01", "lr: 0.001"))
    result = cli(
        "stability",
        "compare",
        tiny_config,
        other,
        "--seeds",
        4,
        "--out",
        tmp_path / "cmp",
        "--storage",
        tmp_path / "s.journal",
        "--format",
        "json,md",
        "--plot-format",
        "png",
        "--json",
    )
    assert result.exit_code == 0, result.output
    (comparison,) = json.loads(result.output)["comparisons"]
    assert {comparison["a"], comparison["b"]} == {"tiny", "slow"}
    assert 0.0 <= comparison["welch_p_holm"] <= 1.0 and 0.0 <= comparison["p_a_better"] <= 1.0


def test_compare_of_two_report_folders_reuses_their_seeds_without_training(tmp_path, monkeypatch):
    """`stability compare REPORT1 REPORT2` (its help: report folders are reused) said 'no configuration to
    run'. Two folders of stored per-seed results are compared as they are: nothing trained, no storage."""
    import hfta_nas.stability._runner as stability_runner
    from tests.test_stability_report import synthetic_result

    whole = synthetic_result(failed=1)
    for label in ("A", "B_wide"):
        StabilityResult(
            whole.seeds[whole.seeds["config"] == label].reset_index(drop=True),
            whole.curves[whole.curves["config"] == label].reset_index(drop=True),
            {**whole.metadata, "configs": {label: {}}},
        ).save(tmp_path / label / "result")

    def no_training(*args, **kwargs):
        raise AssertionError("compare of report folders trained")

    monkeypatch.setattr(stability_runner, "run_stability", no_training)
    monkeypatch.chdir(tmp_path)  # a default storage would be created here
    out = tmp_path / "cmp"
    result = cli("stability", "compare", tmp_path / "A", tmp_path / "B_wide", "--out", out, "--format", "json,md")
    assert result.exit_code == 0, result.output
    assert "no configuration to run" not in result.output and not (tmp_path / "runs").exists()
    document = json.loads((out / "report.json").read_text())
    (comparison,) = [c for c in document["comparisons"] if c["metric"] == "test_acc"]
    assert (comparison["a"], comparison["b"], comparison["paired"], comparison["n_pairs"]) == ("A", "B_wide", True, 7)
    assert {s["config"] for s in document["seeds"]} == {"A", "B_wide"} and len(document["seeds"]) == 16
    assert "A vs B_wide (same seeds, 7 pairs; left out: #0 (no value: A))" in " ".join(result.output.split())


def test_decompose_reports_a_share_per_source(tmp_path, tiny_config):
    result = cli(
        "stability",
        tiny_config,
        "--seeds",
        3,
        "--vary",
        "init,data",
        "--decompose",
        "--out",
        tmp_path / "d",
        "--storage",
        tmp_path / "s.journal",
        "--format",
        "json",
        "--plot-format",
        "png",
        "--json",
    )
    assert result.exit_code == 0, result.output
    sources = {row["source"] for row in json.loads(result.output)["decomposition"]}
    assert {"init", "data"} <= sources


def test_decompose_grid_reports_init_data_and_their_interaction(tmp_path, tiny_config):
    result = cli(
        "stability",
        tiny_config,
        "--seeds",
        4,
        "--vary",
        "init,data",
        "--out",
        tmp_path / "g",
        "--storage",
        tmp_path / "s.journal",
        "--format",
        "json,md",
        "--plot-format",
        "png",
        "--json",
        "--decompose",
        "grid",
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)["decomposition"]
    assert {row["method"] for row in rows} == {"grid"}
    assert [row["source"] for row in rows] == ["init", "data", "init:data+residual"]
    assert all(0.0 <= row["ci_low"] <= row["variance"] <= row["ci_high"] for row in rows)
    assert "Method 'grid'" in (tmp_path / "g" / "report.md").read_text()


def test_a_single_varied_source_cannot_be_decomposed(tmp_path, tiny_config):
    result = cli(
        "stability", tiny_config, "--seeds", 2, "--vary", "data", "--decompose", "--storage", tmp_path / "s.journal"
    )
    assert result.exit_code == 2 and "vary at least two" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "s.journal").exists() or "stability:" not in (tmp_path / "s.journal").read_text()


def test_top_k_trials_of_a_search_are_rerun_across_seeds(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text(
        "study: {name: tiny-search}\nbudget: {n_trials: 3}\narray: {size: 3}\n"
        "data: {dataset: digits, batch_size: 50}\ntraining: {epochs: 1, optimizer: {name: adam}}\n"
        "model: {family: mlp, config: {width: 8, depth: 1}}\n"
        "params:\n  training.optimizer.lr: {distribution: log_uniform, min: 1.0e-3, max: 1.0e-1}\n"
    )
    journal = tmp_path / "s.journal"
    searched = cli("search", space, "--storage", journal, "--out", tmp_path / "best", "--json")
    assert searched.exit_code == 0, searched.output
    summary = stability_json(journal, tmp_path / "top", "--study", "tiny-search", "--top-k", 2, "--seeds", 3)
    assert len(summary["configs"]) == 2 and all(c["config"].startswith("trial ") for c in summary["configs"])
    assert len(summary["comparisons"]) == 1


def test_the_exported_best_config_is_accepted(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text(
        "study: {name: tiny-export}\nbudget: {n_trials: 2}\narray: {size: 2}\n"
        "data: {dataset: digits, batch_size: 50}\ntraining: {epochs: 1, optimizer: {name: adam}}\n"
        "model: {family: mlp, config: {width: 8, depth: 1}}\n"
        "params:\n  training.optimizer.lr: {distribution: log_uniform, min: 1.0e-3, max: 1.0e-1}\n"
    )
    searched = cli("search", space, "--storage", tmp_path / "s.journal", "--out", tmp_path / "best", "--json")
    assert searched.exit_code == 0, searched.output
    exported = json.loads(searched.output)["exported"]["config"]
    result = cli(
        "stability",
        exported,
        "--seeds",
        2,
        "--storage",
        tmp_path / "s.journal",
        "--out",
        tmp_path / "r",
        "--format",
        "csv",
        "--plot-format",
        "png",
        "--json",
    )
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    "args,message",
    [
        (["--seeds", "0"], "--seeds must be an integer from 1 to 100,000"),
        (["--vary", "weights"], "--vary takes"),
        (["--format", "pdf"], "expected a comma-separated subset of html, md, csv, json, tex"),
        (["--storage", "postgresql://nobody@127.0.0.1:1/x"], "cannot open storage"),
        (["--device", "tpu"], "unknown device"),
        (["--array-size", "0"], "--array-size must be a positive integer"),
        (["--fail-below", "60"], "--fail-below 60: accuracies are fractions from 0 to 1 (did you mean 0.6?)"),
        (["--metric", "test_loss", "--fail-below", "0.5"], "test_loss is better lower"),
    ],
)
def test_stability_user_errors_exit_2_without_traceback(tmp_path, tiny_config, args, message):
    result = cli(
        "stability", tiny_config, "--seeds", 2, "--out", tmp_path / "r", "--storage", tmp_path / "s.journal", *args
    )
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


def test_missing_or_wrong_inputs_are_clear(tmp_path, tiny_config):
    assert "file not found" in cli("stability", tmp_path / "nope.yaml").output
    assert cli("stability", SHIPPED_SPACES["mnist1d_cnn"]).exit_code == 2
    assert "holds no stability results" in cli("report", tmp_path).output
    a_file = tmp_path / "file"
    a_file.write_text("")  # a folder below a file cannot be made, even by root
    result = cli("stability", tiny_config, "--seeds", 2, "--out", a_file / "r", "--storage", tmp_path / "s.journal")
    assert result.exit_code == 2 and "cannot create a folder there" in result.output  # checked before training


def test_the_benchmark_runs_in_quick_mode_from_the_command_line(tmp_path):
    result = cli("bench", "stability", "--quick", "--out", tmp_path / "b.json")
    assert result.exit_code == 0, result.output
    assert "plain / array wall time" in result.output
    figures = json.loads((tmp_path / "b.json").read_text())
    assert len(figures["array_acc"]) == len(figures["plain_acc"]) == 4 and figures["speedup"] > 0


class _Killed(Exception):
    """Stands in for a kill: raised from the progress callback, after an epoch's checkpoint."""


@pytest.mark.parametrize("checkpoints", ["on", "off"])
def test_an_array_killed_mid_training_continues_from_its_last_epoch_bit_identically(tmp_path, monkeypatch, checkpoints):
    monkeypatch.setenv("HFTA_NAS_CHECKPOINT", checkpoints)
    config = dataclasses.replace(mlp_config(), epochs=5)
    labelled = [LabelledConfig("m", config)]
    reference, _ = run_stability(
        labelled,
        n_seeds=3,
        storage=open_storage(str(tmp_path / "ref.journal"))[0],
        storage_location=str(tmp_path / "ref.journal"),
    )

    storage, location = open_storage(str(tmp_path / "s.journal"))

    def kill_in_epoch_4(kind, info):
        if kind == "epoch" and info["epoch"] == 4:  # epoch 3's checkpoint is written, epoch 4's is not
            raise _Killed

    with pytest.raises(_Killed):
        run_stability(labelled, n_seeds=3, storage=storage, storage_location=location, on_event=kill_in_epoch_4)
    study_name = next(
        s.study_name for s in optuna.get_all_study_summaries(storage) if s.study_name.startswith("stability:")
    )
    folder = tmp_path / "checkpoints"
    assert len(list(folder.rglob("*.pt"))) == (1 if checkpoints == "on" else 0)

    epochs, continued = [], []

    def heard(kind, info):
        if kind == "epoch":
            epochs.append(info["epoch"])
        elif kind == "continued":
            continued.append(info["epoch"])

    resumed, _ = run_stability(labelled, n_seeds=3, storage=storage, storage_location=location, on_event=heard)
    assert epochs == ([4, 5] if checkpoints == "on" else [1, 2, 3, 4, 5])
    assert continued == ([3] if checkpoints == "on" else [])  # said before the first epoch it trains
    assert resumed.metadata["arrays"][0]["resumed_epoch"] == (3 if checkpoints == "on" else 0)
    columns = ["seed_index", "status", "epochs", "test_acc", "test_loss", "val_acc", "val_loss", "train_loss"]
    assert resumed.seeds[columns].equals(reference.seeds[columns])  # every number to the bit
    assert resumed.curves.equals(reference.curves)
    assert not list(folder.rglob("*.pt"))  # removed once the array ended
    assert len(optuna.load_study(study_name=study_name, storage=storage).trials) == 3


def test_configs_that_fuse_train_as_one_array_of_k_x_s_slots():
    """Per-slot hyper-parameters and architectures the engine pads into one envelope share an array;
    another optimizer cannot."""
    fast, slow = mlp_config(), mlp_config(hparams={**mlp_config().hparams, "lr": 0.01})
    wider = dataclasses.replace(mlp_config(), model_config={"width": 12, "depth": 1})  # padded with the others
    adam = dataclasses.replace(mlp_config(), optimizer="adam", hparams={"lr": 1e-3})
    labelled = [
        LabelledConfig("fast", fast),
        LabelledConfig("slow", slow),
        LabelledConfig("wider", wider),
        LabelledConfig("adam", adam),
    ]
    events = []
    fused, _ = run_stability(
        labelled, n_seeds=3, dtype="float64", on_event=lambda kind, info: events.append((kind, info))
    )
    assert [(info["label"], info["size"]) for kind, info in events if kind == "array"] == [
        ("fast, slow, wider", 9),
        ("adam", 3),
    ]
    for item in labelled:  # each equals its own array: slots are independent
        alone, _ = run_stability([item], n_seeds=3, dtype="float64")
        mine = fused.seeds[fused.seeds["config"] == item.label]
        for metric in ("test_acc", "test_loss", "train_loss"):
            np.testing.assert_allclose(mine[metric].to_numpy(), alone.seeds[metric].to_numpy(), rtol=1e-10)


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def stability_json(storage, out, *args):
    """`hfta-nas stability ARGS` storing its seeds in `storage`, its JSON tables and PNG plots in `out`;
    its JSON summary (after asserting it succeeded)."""
    result = cli(
        "stability", *args, "--storage", storage, "--out", out, "--format", "json", "--plot-format", "png", "--json"
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def run_example(tmp_path, *args):
    """`hfta-nas stability ARGS` on the worked examples, small, with its JSON summary."""
    return stability_json(tmp_path / "s.journal", tmp_path / "r", *args, "--threads", 1)


def test_the_readme_worked_example_runs(tmp_path):
    """`hfta-nas stability compare examples/adam_vs_sgd/adam.yaml examples/adam_vs_sgd/sgd.yaml` (2 seeds here)."""
    summary = run_example(
        tmp_path, "compare", EXAMPLES / "adam_vs_sgd/adam.yaml", EXAMPLES / "adam_vs_sgd/sgd.yaml", "--seeds", 2
    )
    assert [row["config"] for row in summary["configs"]] == ["adam", "sgd"]
    (comparison,) = summary["comparisons"]
    assert comparison["better"] == "higher" and 0.0 <= comparison["p_a_better_low"] <= comparison["p_a_better"]


def test_the_bimodal_seeds_example_runs(tmp_path):
    """`hfta-nas stability examples/bimodal_seeds/sgd_high_lr.yaml --seeds 32` (2 seeds, 1 epoch here)."""
    example = EXAMPLES / "bimodal_seeds/sgd_high_lr.yaml"
    assert load_config(example).hparams["lr"] == 0.25  # the learning rate docs/stability.md reads
    (row,) = run_example(tmp_path, example, "--seeds", 2, "--set", "epochs=1")["configs"]
    assert row["config"] == "sgd_high_lr" and row["n"] + row["n_failed"] == 2


def test_the_two_modes_example_runs(tmp_path):
    """`hfta-nas stability examples/bimodal_seeds/deep_mlp_sgd.yaml --seeds 32` (4 seeds, 1 epoch here)."""
    example = EXAMPLES / "bimodal_seeds/deep_mlp_sgd.yaml"
    config = load_config(example)
    assert (config.hparams["lr"], config.epochs, config.model_config["depth"]) == (0.09, 60, 9)  # as the docs read
    (row,) = run_example(tmp_path, example, "--seeds", 4, "--set", "epochs=1")["configs"]
    assert row["config"] == "deep_mlp_sgd" and row["n"] + row["n_failed"] == 4


def test_vary_split_redraws_each_seeds_train_validation_partition(tmp_path, tiny_config):
    result = cli(
        "stability",
        tiny_config,
        "--seeds",
        3,
        "--vary",
        "init,split",
        "--decompose",
        "--out",
        tmp_path / "s",
        "--storage",
        tmp_path / "s.journal",
        "--format",
        "csv,json",
        "--plot-format",
        "png",
        "--json",
    )
    assert result.exit_code == 0, result.output
    seeds = pd.read_csv(tmp_path / "s" / "seeds.csv")
    main_design = seeds[seeds["design"] == "all"]
    assert main_design["seed_split"].nunique() == 3 and main_design["seed_data"].nunique() == 1
    assert seeds[seeds["design"] == "only_init"]["seed_split"].isna().all()  # the data's own split there
    assert seeds[seeds["design"] == "only_split"]["seed_split"].nunique() == 3
    sources = {row["source"] for row in json.loads(result.output)["decomposition"]}
    assert {"init", "split"} <= sources


def test_vary_split_without_validation_data_is_refused_before_anything_is_stored(tmp_path):
    from hfta_nas.errors import HftaNasError
    from hfta_nas.stability import run_study

    config = mlp_config(data={**mlp_config().data, "val_fraction": 0.0})
    with pytest.raises(HftaNasError, match="--vary split re-draws the train/validation split"):
        run_study(
            LabelledConfig("noval", config),
            seeds=2,
            vary="split",
            storage=str(tmp_path / "s.journal"),
            out_dir=tmp_path / "out",
        )
    assert not (tmp_path / "s.journal").exists() and not (tmp_path / "out").exists()


def test_stability_help_shows_the_default_commands_options():
    result = cli("stability", "--help")
    assert result.exit_code == 0
    assert "Commands:" in result.output and "compare" in result.output  # the group
    for option in ("--seeds", "--vary", "--decompose", "--top-k", "--artifact-dir"):  # and `run`'s options
        assert option in result.output, option
    assert "beside the journal" in result.output
