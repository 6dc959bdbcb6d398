"""benchmarks/never_slower.py runs end to end (`--quick`): plain against pack on shipped spaces.

This checks the script, not the timings: a space runs both methods and its ratios are those of its
runs; a space the plain loop cannot reproduce is skipped with the reason, and the JSON records the
machine's load and the package versions."""

import json

import pytest

from tests._benchmark_runs import run_from_checkout

pytestmark = pytest.mark.xdist_group(name="benchmarks")  # one process runs the benchmark files


@pytest.mark.slow
def test_quick_run_compares_plain_and_pack_and_skips_what_plain_cannot_run(tmp_path):
    out = tmp_path / "never-slower.json"
    spaces = "mnist1d_mlp,mnist1d_multiobjective,mnist1d_cnn_pbt"
    run_from_checkout(
        "-m", "benchmarks.never_slower", "--quick", "--n-trials", "2", "--spaces", spaces, "--out", str(out)
    )
    result = json.loads(out.read_text())
    rows = result["spaces"]
    assert "metrics ['val_acc', 'params']" in rows["mnist1d_multiobjective"]["skipped"]
    assert "pbt" in rows["mnist1d_cnn_pbt"]["skipped"]
    row = rows["mnist1d_mlp"]
    plain, pack = row["figures"]["runs"]["plain"], row["figures"]["runs"]["pack"]
    assert row["n_trials"] == 2 and [r["seed"] for r in plain] == [r["seed"] for r in pack] == [0]
    assert row["plain_over_pack_wall"]["median"] == pytest.approx(plain[0]["seconds"] / pack[0]["seconds"])
    assert row["never_slower"] is (row["plain_over_pack_wall"]["median"] >= 1.0)
    assert row["pack_time_account"]["overhead"] >= 0
    assert len(result["machine"]["load_average_before"]) == 3 and "optuna" in result["versions"]
