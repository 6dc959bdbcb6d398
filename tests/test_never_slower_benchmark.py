"""benchmarks/never_slower.py runs end to end (`--quick`): plain (in memory and on a journal file) against pack
on shipped spaces.

This checks the script, not the timings: a space runs both methods and its ratios are those of its
runs; a space the plain loop cannot reproduce is skipped with the reason, and the JSON records the
machine's load and the package versions."""

import json

import numpy as np
import pytest
from scipy.stats import wilcoxon

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
    assert row["paired"]["plain_over_pack_wall"]["per_seed"] == [pytest.approx(row["plain_over_pack_wall"]["median"])]
    journal = row["figures"]["runs"]["plain-journal"]  # plain Optuna on a journal file, as durable as pack's
    against = row["against_plain_journal"]["plain_over_pack_wall"]["per_seed"]
    assert against == [pytest.approx(journal[0]["seconds"] / pack[0]["seconds"])]
    assert journal[0]["epochs_trained"] == plain[0]["epochs_trained"]  # the same trials, only the storage differs


def _runs(seconds, epochs, best):
    return [
        {"seed": i, "seconds": s, "epochs_trained": e, "best_value": b}
        for i, (s, e, b) in enumerate(zip(seconds, epochs, best))
    ]


@pytest.mark.parametrize("direction", ["maximize", "minimize"])
def test_paired_statistics_are_seed_by_seed_and_their_tests_are_scipys(direction):
    from benchmarks.never_slower import paired

    plain = _runs([10.0, 12.0, 9.0, 11.0], [50, 60, 40, 55], [0.80, 0.85, 0.82, 0.90])
    pack = _runs([8.0, 13.0, 6.0, 10.0], [52, 50, 45, 60], [0.81, 0.83, 0.82, 0.92])
    stats = paired({"direction": direction, "runs": {"plain": plain, "pack": pack}})
    wall = [10 / 8, 12 / 13, 9 / 6, 11 / 10]
    assert stats["seeds"] == [0, 1, 2, 3]
    assert stats["plain_over_pack_wall"]["per_seed"] == pytest.approx(wall)
    assert stats["plain_over_pack_wall"]["median"] == pytest.approx(np.median(wall))
    assert stats["plain_over_pack_wall"]["wilcoxon_p"] == pytest.approx(wilcoxon(np.log(wall)).pvalue)
    assert (stats["plain_over_pack_wall"]["pack_ahead"], stats["plain_over_pack_wall"]["pack_behind"]) == (3, 1)
    per_epoch = [
        (a["seconds"] / a["epochs_trained"]) / (b["seconds"] / b["epochs_trained"]) for a, b in zip(plain, pack)
    ]
    assert stats["plain_over_pack_per_epoch"]["per_seed"] == pytest.approx(per_epoch)
    sign = 1 if direction == "maximize" else -1
    gains = [sign * (b["best_value"] - a["best_value"]) for a, b in zip(plain, pack)]
    assert stats["pack_best_minus_plain"]["per_seed"] == pytest.approx(gains)
    nonzero = [g for g in gains if g != 0]  # a tie (seed 2) says nothing about which is better
    assert stats["pack_best_minus_plain"]["wilcoxon_p"] == pytest.approx(wilcoxon(nonzero).pvalue)
    assert stats["pack_best_minus_plain"]["pack_ahead"] == (2 if sign > 0 else 1)


def test_a_seed_where_a_method_completed_no_trial_has_no_best_to_compare():
    from benchmarks.never_slower import paired

    plain = _runs([10.0, 12.0], [50, 60], [0.80, None])
    pack = _runs([8.0, 13.0], [52, 50], [0.81, 0.83])
    stats = paired({"direction": "maximize", "runs": {"plain": plain, "pack": pack}})
    assert stats["plain_over_pack_wall"]["per_seed"] == pytest.approx([10 / 8, 12 / 13])  # wall: both seeds
    assert stats["pack_best_minus_plain"]["per_seed"] == pytest.approx([0.01])  # best: seed 0 only
