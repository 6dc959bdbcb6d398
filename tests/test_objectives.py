"""Losses and metrics per slot, against each model trained and evaluated alone with plain
PyTorch (float64) and sklearn's metrics: classification with label smoothing, class weights and
missing labels; regression (MSE, MAE, Huber; one or several targets; missing targets); user
losses and metrics."""

import json

import numpy as np
import pytest
import torch
from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import hfta_nas
from hfta_nas import ArrayTrainer, HftaNasError, ModelArray, Objective
from hfta_nas.data import Dataset
from tests.test_trainer import BATCH, DATA_SEEDS, INIT_SEEDS, assert_equivalent, conv_bn_model, slot_model

LR = [1e-2, 3e-3, 3e-2, 1e-3]


def regression_data(targets=1, missing=0.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(24, max(targets, 1), generator=g, dtype=torch.float64)

    def part(n):
        x = torch.randn(n, 2, 12, generator=g, dtype=torch.float64)
        y = x.reshape(n, -1) @ weight + 0.1 * torch.randn(n, max(targets, 1), generator=g, dtype=torch.float64)
        y = y[:, 0] if targets == 1 else y
        if missing:
            y = torch.where(torch.rand(y.shape, generator=g, dtype=torch.float64) < missing, torch.nan, y)
        return x, y

    (xt, yt), (xv, yv), (xs, ys) = part(60), part(20), part(20)
    return Dataset("regression", xt, yt, xv, yv, xs, ys, max(targets, 1), task="regression")


def regression_model(outputs):
    return lambda: nn.Sequential(nn.Flatten(), nn.Linear(24, 8), nn.Tanh(), nn.Linear(8, outputs))


def plain_loss(objective, output, y):
    """The loss of one model's batch as plain PyTorch code writes it."""
    if objective.loss == "cross_entropy":
        weight = torch.tensor(objective.class_weights, dtype=output.dtype) if objective.class_weights else None
        return F.cross_entropy(output, y, weight=weight, label_smoothing=objective.label_smoothing)
    if output.dim() == y.dim() + 1:
        output = output.squeeze(-1)
    if objective.masked:
        keep = ~torch.isnan(y)
        output, y = output[keep], y[keep]
    functional = {"mse": F.mse_loss, "mae": F.l1_loss, "huber": lambda o, t: F.huber_loss(o, t, delta=objective.delta)}
    return functional[objective.loss](output, y)


def train_both(data, objective, factory, epochs=2):
    arr = ModelArray.from_factory(factory, seeds=INIT_SEEDS, dtype=torch.float64)
    trainer = ArrayTrainer(
        arr, hfta_nas.optim.Adam(arr, lr=LR), data, batch_size=BATCH, data_seeds=DATA_SEEDS, loss_fn=objective
    )
    results = trainer.fit(epochs)
    models = []
    for slot in range(len(INIT_SEEDS)):
        torch.manual_seed(INIT_SEEDS[slot])
        model = factory().double()
        opt = torch.optim.Adam(model.parameters(), lr=LR[slot])
        loader = DataLoader(
            TensorDataset(data.x_train, data.y_train),
            batch_size=BATCH,
            shuffle=True,
            generator=torch.Generator().manual_seed(DATA_SEEDS[slot]),
        )
        for _ in range(epochs):
            model.train()
            for x, y in loader:
                opt.zero_grad()
                plain_loss(objective, model(x), y).backward()
                opt.step()
        models.append(model.eval())
    return arr, results, models


@pytest.mark.parametrize(
    "objective",
    [
        Objective(label_smoothing=0.1),
        Objective(class_weights=[0.2, 1.0, 3.0]),
        Objective(class_weights=[0.5, 1.0, 2.0], label_smoothing=0.2),
    ],
    ids=["label-smoothing", "class-weights", "both"],
)
def test_classification_losses_equal_cross_entropy_on_each_model(tiny_data, objective):
    arr, results, models = train_both(tiny_data, objective, conv_bn_model)
    assert_equivalent(arr, models, 1e-10)
    for slot, model in enumerate(models):
        with torch.no_grad():
            logits = model(tiny_data.x_val)
        assert results[slot].final["val_loss"] == pytest.approx(
            plain_loss(objective, logits, tiny_data.y_val).item(), rel=1e-10
        )
        assert results[slot].final["val_acc"] == pytest.approx(
            (logits.argmax(1) == tiny_data.y_val).double().mean().item()
        )


def test_missing_labels_are_ignored_as_torchs_ignore_index(tiny_data):
    y, y_val = tiny_data.y_train.clone(), tiny_data.y_val.clone()
    y[::3], y_val[::2] = -100, -100  # partly unlabelled training and validation sets
    data = Dataset("partial", tiny_data.x_train, y, tiny_data.x_val, y_val, tiny_data.x_test, tiny_data.y_test, 3)
    arr, results, models = train_both(data, Objective(), conv_bn_model)  # F.cross_entropy skips -100 by default
    assert_equivalent(arr, models, 1e-10)
    labelled = y_val != -100
    for slot, model in enumerate(models):
        with torch.no_grad():
            logits = model(data.x_val)
        final = results[slot].final
        assert final["val_loss"] == pytest.approx(F.cross_entropy(logits, y_val).item(), rel=1e-10)
        accuracy = (logits.argmax(1) == y_val)[labelled].double().mean().item()
        assert final["val_acc"] == pytest.approx(accuracy, rel=1e-12)


@pytest.mark.parametrize(
    "loss, targets, missing", [("mse", 1, 0.0), ("mae", 1, 0.0), ("huber", 3, 0.0), ("mse", 3, 0.3), ("huber", 1, 0.2)]
)
def test_regression_losses_and_metrics_equal_torch_and_sklearn(loss, targets, missing):
    data = regression_data(targets, missing)
    objective = Objective(loss=loss, masked=missing > 0, delta=0.5)
    arr, results, models = train_both(data, objective, regression_model(targets))
    assert_equivalent(arr, models, 1e-10)
    for slot, model in enumerate(models):
        with torch.no_grad():
            out = model(data.x_val)
        final = results[slot].final
        assert final["val_loss"] == pytest.approx(plain_loss(objective, out, data.y_val).item(), rel=1e-10)
        pred, true = out.numpy().reshape(len(out), -1), data.y_val.numpy().reshape(len(out), -1)
        if missing:  # each metric over the targets present
            keep = ~np.isnan(true)
            error = (pred - np.nan_to_num(true))[keep]
            assert final["val_rmse"] == pytest.approx(np.sqrt((error**2).mean()), rel=1e-10)
            assert final["val_mae"] == pytest.approx(np.abs(error).mean(), rel=1e-10)
            r2 = np.mean([r2_score(true[keep[:, k], k], pred[keep[:, k], k]) for k in range(true.shape[1])])
        else:
            assert final["val_rmse"] == pytest.approx(np.sqrt(mean_squared_error(true, pred)), rel=1e-10)
            assert final["val_mae"] == pytest.approx(mean_absolute_error(true, pred), rel=1e-10)
            r2 = r2_score(true, pred)
        assert final["val_r2"] == pytest.approx(r2, rel=1e-9)
        assert "val_acc" not in final


def test_a_user_loss_and_metric(tiny_data):
    def focal(logits, y, reduction="none"):
        ce = F.cross_entropy(logits, y, reduction="none")
        return (1 - torch.exp(-ce)) ** 2 * ce

    def top2(logits, y):
        return (logits.topk(2, dim=-1).indices == y.unsqueeze(-1)).any(-1).double()

    objective = Objective(loss=focal, metrics={"top2": top2})
    arr = ModelArray.from_factory(conv_bn_model, seeds=INIT_SEEDS, dtype=torch.float64)
    trainer = ArrayTrainer(
        arr, hfta_nas.optim.Adam(arr, lr=LR), tiny_data, batch_size=BATCH, data_seeds=DATA_SEEDS, loss_fn=objective
    )
    results = trainer.fit(1)
    for slot in range(4):
        with torch.no_grad():
            logits = slot_model(arr, slot)(tiny_data.x_val)
        final = results[slot].final
        assert final["val_loss"] == pytest.approx(focal(logits, tiny_data.y_val).mean().item(), rel=1e-10)
        assert final["val_top2"] == pytest.approx(top2(logits, tiny_data.y_val).mean().item(), rel=1e-12)
        assert "val_acc" in final  # a user loss of a classification task keeps the accuracy


def test_train_loads_regression_targets_and_refuses_a_mismatch(tmp_path):
    x = np.random.default_rng(0).normal(size=(200, 5))
    np.savez(tmp_path / "r.npz", x=x, y=x @ np.arange(5.0))
    run = hfta_nas.train(
        "mlp",
        model_config={"width": 8, "depth": 1},
        dataset=str(tmp_path / "r.npz"),
        seeds=[0, 1],
        loss="mse",
        epochs=2,
        dtype="float64",
    )
    assert (
        run.dataset.task == "regression" and run.dataset.y_train.dtype == torch.float64 and run.dataset.num_classes == 1
    )
    assert {"val_rmse", "val_mae", "val_r2", "test_r2"} <= set(run.results[0].final)
    with pytest.raises(HftaNasError, match="regression targets but the loss is a classification loss"):
        hfta_nas.train("mlp", dataset=run.dataset, seeds=[0], epochs=1)
    with pytest.raises(HftaNasError, match="classification dataset"):
        hfta_nas.train("mlp", dataset="digits", seeds=[0], epochs=1, loss="mse")
    with pytest.raises(HftaNasError, match="unknown loss 'msee'"):
        Objective(loss="msee")


# ------------------------------------------------------------------ from YAML and the command line
def test_the_shipped_regression_space_searches_and_its_best_config_seed_tests(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from hfta_nas.cli import main
    from hfta_nas.search_spaces import SHIPPED_SPACES, load_space

    monkeypatch.chdir(tmp_path)
    space = load_space(SHIPPED_SPACES["diabetes_mlp"])
    assert (
        space.directions == ["minimize"]
        and space.resolve({p: v.values[0] if hasattr(v, "values") else v.min for p, v in space.searched.items()})
        .objective()
        .kind
        == "regression"
    )
    shrink = ["--set", "training.epochs=3", "--set", "array.size=4"]
    result = CliRunner().invoke(
        main,
        [
            "search",
            str(SHIPPED_SPACES["diabetes_mlp"]),
            "--n-trials",
            "4",
            "--storage",
            "r.journal",
            "--quiet",
            "--json",
            *shrink,
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["trials"] == {"COMPLETE": 4} and summary["best"][0]["values"]["val_rmse"] > 0
    best = tmp_path / "runs" / "diabetes-mlp" / "best_config.yaml"
    result = CliRunner().invoke(
        main,
        [
            "stability",
            str(best),
            "--seeds",
            "3",
            "--storage",
            "r.journal",
            "--json",
            "--format",
            "csv",
            "--plot-format",
            "png",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["metric"] == "test_rmse" and report["configs"][0]["n"] == 3 and report["configs"][0]["mean"] > 0
    seeds = __import__("pandas").read_csv(tmp_path / report["report"] / "seeds.csv")
    assert seeds["test_r2"].notna().all() and seeds["test_acc"].isna().all()


@pytest.mark.parametrize(
    "training, message",
    [
        ({"loss": "msee"}, "training.loss.name: unknown loss 'msee' (did you mean 'mse'?)"),
        ({"loss": {"name": "mse", "label_smoothing": 0.1}}, "training.loss: label_smoothing and class_weights"),
        (
            {"loss": {"name": "cross_entropy", "label_smoothing": 1.5}},
            "training.loss.label_smoothing: expected a value < 1",
        ),
        (
            {"early_stopping": {"metric": "val_rmse"}},
            "training.early_stopping.metric: metric 'val_rmse' is not measured here",
        ),
        ({"metrics": {"top-2": "m:f"}}, "training.metrics.top-2: a metric name must be an identifier"),
    ],
)
def test_loss_settings_are_checked_with_the_file(training, message):
    from hfta_nas.search_spaces import SpaceError, parse_space
    from tests.test_search import space_text

    with pytest.raises(SpaceError) as caught:
        parse_space(space_text(training={"epochs": 1, **training}), "s.yaml")
    assert message in str(caught.value)


def test_a_regression_metric_of_a_classification_space_is_refused_with_a_hint():
    from hfta_nas.search_spaces import SpaceError, parse_space
    from tests.test_search import space_text

    with pytest.raises(SpaceError, match=r"study.metrics\[0\]: metric 'val_rmse' is not measured here"):
        parse_space(space_text(study={"metrics": ["val_rmse"]}), "s.yaml")
    space = parse_space(
        space_text(study={"metrics": ["val_top2"]}, training={"epochs": 1, "metrics": {"top2": "m:top2"}})
    )
    assert space.directions == ["minimize"]  # a user metric: give directions to maximise it


def test_a_user_metric_is_a_stability_metric(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from hfta_nas.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "my_metrics.py").write_text(
        "def top2(logits, y):\n    return (logits.topk(2, dim=-1).indices == y.unsqueeze(-1)).any(-1).double()\n"
    )
    (tmp_path / "c.yaml").write_text(
        "model: mlp\nmodel_config: {width: 8, depth: 1}\ndataset: digits\nepochs: 1\n"
        "metrics: {top2: 'my_metrics:top2'}\n"
    )
    result = CliRunner().invoke(
        main,
        [
            "stability",
            "c.yaml",
            "--seeds",
            "3",
            "--metric",
            "test_top2",
            "--json",
            "--storage",
            "s.journal",
            "--format",
            "csv",
            "--plot-format",
            "png",
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["metric"] == "test_top2" and summary["configs"][0]["n"] == 3
    assert summary["configs"][0]["mean"] >= 0  # top-2 accuracy of 10 classes after one epoch
    bad = CliRunner().invoke(
        main, ["stability", "c.yaml", "--seeds", "3", "--metric", "test_top3", "--storage", "s.journal"]
    )
    assert bad.exit_code == 2 and "unknown metric 'test_top3' (did you mean 'test_top2'?)" in bad.output
