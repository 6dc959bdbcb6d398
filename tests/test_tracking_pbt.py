"""A PBT run lands in the trackers as a search does, one run per member grouped by the study, with
what PBT adds: each epoch's metrics, the explored values the member's slot trained with (`hp/<name>`),
and each exploit that replaced it (`pbt/copied_from`, `pbt/explored/<name>`) at its epoch. Read back
with each tool's own reader and compared with what the study records (intermediate values,
`pbt_slot_values`, `pbt_lineage`)."""

import pytest

from hfta_nas.tracking import SearchTracking
from tests.test_pbt_run import EPOCHS, run, study_in
from tests.test_tracking import (  # noqa: F401  (offline_wandb: a fixture)
    mlflow_runs,
    offline_wandb,
    specs,
    tensorboard_run,
    wandb_dir,
    wandb_runs,
)

pytestmark = pytest.mark.xdist_group(name="tracking")


@pytest.fixture(scope="module")
def population(tmp_path_factory, offline_wandb):  # noqa: F811
    """A population of 4 over 6 epochs (an exploit every 2) logged to every installed tracker, and its members."""
    folder = tmp_path_factory.mktemp("pbt")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WANDB_DIR", wandb_dir(folder)["WANDB_DIR"])  # read when the tracker is made
        tracking = SearchTracking(*specs(folder))
    study = study_in(folder)
    with tracking:
        run(study, folder / "out", on_event=tracking)
    members = study.trials
    assert any(m.user_attrs["pbt_lineage"] for m in members)  # some member was replaced: exploits to log
    return folder, members


def exploits_of(member) -> list[tuple[int, float]]:
    return [(x["epoch"], float(x["from_trial"])) for x in member.user_attrs["pbt_lineage"]]


def test_mlflow_has_a_run_per_member_with_its_curves_values_and_exploits(population):
    pytest.importorskip("mlflow")
    folder, members = population
    client, runs = mlflow_runs(folder, "pbt")
    assert sorted(runs) == sorted(f"trial {m.number}" for m in members)

    def curve(run, key):
        return sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))

    for member in members:
        run = runs[f"trial {member.number}"]
        assert run.data.tags["state"] == "COMPLETE" and run.data.tags["pbt_member"] == str(
            member.user_attrs["pbt_member"]
        )
        assert run.data.params == {key: str(value) for key, value in member.params.items()}
        assert curve(run, "val_acc") == sorted(member.intermediate_values.items())
        assert [v for _, v in curve(run, "hp/lr")] == member.user_attrs["pbt_slot_values"]["lr"]
        assert [s for s, _ in curve(run, "hp/lr")] == list(range(1, EPOCHS + 1))
        assert curve(run, "pbt/copied_from") == exploits_of(member)
        assert run.data.metrics["final/val_acc"] == member.value


def test_tensorboard_has_a_subfolder_per_member_with_its_curves_and_exploits(population):
    pytest.importorskip("tensorboard")
    folder, members = population
    for member in members:
        scalars, hparams = tensorboard_run(folder / "tb" / "pbt" / f"trial_{member.number}")
        assert [v for _, v in scalars["hp/lr"]] == pytest.approx(member.user_attrs["pbt_slot_values"]["lr"], rel=1e-6)
        assert scalars.get("pbt/copied_from", []) == exploits_of(member)
        assert [s for s, _ in scalars["val_acc"]] == sorted(member.intermediate_values)
        assert hparams["pbt_member"] == member.user_attrs["pbt_member"] and hparams["state"] == "COMPLETE"


def test_wandb_offline_has_a_run_per_member_with_its_curves_and_exploits(population):
    pytest.importorskip("wandb")
    folder, members = population
    runs = {name: run for (group, name), run in wandb_runs(folder / "wb").items() if group == "pbt"}
    assert sorted(runs) == sorted(f"trial {m.number}" for m in members)
    for member in members:
        rows: dict[int, dict] = {}
        for row in runs[f"trial {member.number}"]["history"]:  # a step's exploit comes in a row of its own
            rows.setdefault(row["_step"], {}).update(row)
        steps = sorted(rows)
        assert [rows[s]["hp/lr"] for s in steps] == pytest.approx(member.user_attrs["pbt_slot_values"]["lr"])
        assert [(s, rows[s]["pbt/copied_from"]) for s in steps if "pbt/copied_from" in rows[s]] == exploits_of(member)
        assert [(s, rows[s]["val_acc"]) for s in steps] == sorted(member.intermediate_values.items())
