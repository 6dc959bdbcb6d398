"""The worked example of a user's own CNN on CIFAR-shaped data, in a tiny mode: its data
script, its search (augmentation, clipping, label smoothing) and the seed test of the best config."""

import importlib.util
import json
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from hfta_nas.cli import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "cifar_shaped"


def make_data():
    spec = importlib.util.spec_from_file_location("make_data", EXAMPLE / "make_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_data_script_is_cifar_shaped_and_deterministic():
    x, y = make_data().make(50, seed=3)
    again, _ = make_data().make(50, seed=3)
    assert x.shape == (50, 3, 32, 32) and x.dtype == np.float32 and set(np.unique(y)) <= set(range(10))
    assert np.array_equal(x, again) and x.min() >= 0 and x.max() <= 1


def test_the_example_searches_and_seed_tests_in_a_tiny_mode(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the space names the model file relative to the repository, as the README runs it
    x, y = make_data().make(240)
    data = tmp_path / "tiny.npz"
    np.savez(data, x=x, y=y)
    journal, out = str(tmp_path / "c.journal"), tmp_path / "out"
    tiny = ["--set", f"data.dataset={data}", "--set", "training.epochs=1", "--set", "array.size=2"]
    result = CliRunner().invoke(
        main,
        [
            "search",
            str(EXAMPLE / "space.yaml"),
            "--n-trials",
            "2",
            "--storage",
            journal,
            "--out",
            str(out),
            "--quiet",
            "--json",
            *tiny,
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["trials"] == {"COMPLETE": 2}
    best = (out / "best_config.yaml").read_text()
    for setting in ("augment:", "shift: 4", "flip: true", "label_smoothing: 0.1", "clip_norm:"):
        assert setting in best, setting
    result = CliRunner().invoke(
        main,
        [
            "stability",
            str(out / "best_config.yaml"),
            "--seeds",
            "2",
            "--storage",
            journal,
            "--out",
            str(tmp_path / "report"),
            "--json",
            "--format",
            "csv",
            "--plot-format",
            "png",
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["configs"][0]["n"] == 2 and 0 <= summary["configs"][0]["mean"] <= 1
