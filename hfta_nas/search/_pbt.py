"""`pbt(study, build, data)`: population-based training inside one fused array.

The population is the array's slots, one Optuna trial per member (asked from the study, so
the sampler draws the starting hyper-parameters and `build(trial)` turns each into a
Candidate, as for `optimize`). Every member reports its metric each epoch (the dashboard
shows the curves). After every `interval` epochs the worst quantile of the running members
copy a member of the best quantile (exploit: `ArrayTrainer.copy_slot`, one indexed copy per
tensor, nothing leaves the device) and change their explored hyper-parameters (explore: a
per-slot value in the optimizer, the dropout layers or the augmentation; `_pbt_explore`).
At the end each member is told COMPLETE with its last value.

A copy takes every hyper-parameter of its source, explored or not, and trains on in the
source's seeds' streams: the best member's weights are its root's (the member whose initial
weights they descend from) trained with the best member's schedule. So the export writes the
root's config and seeds with that schedule (`hparam_schedule`), which re-trains the best member
exactly.

Checkpoints: the whole run (array, optimizer, orders, the records and the random generator)
is saved after every epoch beside the storage; a run that was killed or stopped leaves its
members RUNNING, and calling `pbt` again on the study continues it bit-identically.
One process trains a population: `--workers` does not apply, nor do pruners (members are
never pruned; the worst copy the best instead).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from hfta_nas.array._signature import equal_shapes
from hfta_nas.data import Dataset
from hfta_nas.errors import HftaNasError
from hfta_nas.search._array_job import array_trainer
from hfta_nas.search._candidate import Candidate, Proposal, as_candidate, built, meta_shell, trial_seeds
from hfta_nas.search._events import PBTExploited, PBTStarted, TrialEnded, TrialEpochEnded, TrialStarted
from hfta_nas.search._export import BestExport
from hfta_nas.search._ledger import Ledger, Outcome
from hfta_nas.search._optuna_private import storage_of, trial_id
from hfta_nas.search._patience import StorageUnreachable
from hfta_nas.search._pbt_explore import check_explored, check_ranked_metric
from hfta_nas.search._pbt_files import write_pbt_files
from hfta_nas.search._pbt_records import Exploit, Records
from hfta_nas.search._pbt_resume import check_same_run, members_as_left, run_identity
from hfta_nas.search._pbt_settings import Explore, PBTSettings
from hfta_nas.search._storage import checkpoint_folder, dashboard_command, storage_location
from hfta_nas.training._checkpoint import enabled as checkpoints_enabled
from hfta_nas.training._checkpoint import load as load_checkpoint
from hfta_nas.training._checkpoint import remove as remove_checkpoint
from hfta_nas.training._checkpoint import save as save_checkpoint
from hfta_nas.training._objectives import higher_is_better
from hfta_nas.training._run import DTYPES, _checked_device
from hfta_nas.training._slot_values import prepare, read, write
from hfta_nas.training._trainer import ArrayTrainer

log = logging.getLogger(__name__)
MEMBER_ATTR = "pbt_member"  # a trial's slot in its population (and that it is one)
CHECKPOINT = "pbt.pt"


@dataclass
class PBTSummary:
    """What a PBT run did, for the table, `--json` and the caller."""

    study_name: str
    storage: str
    dashboard: str
    metric: str
    direction: str
    population: int
    epochs: int
    interval: int
    trials: list[int]
    best: dict[str, Any]  # number, value, params, root, seeds (the root's), schedule, lineage
    exploits: int
    seconds: float
    curve: list[tuple[float, float]]  # (seconds since this run started, the population's best) per epoch
    resumed_from_epoch: int | None = None
    exported: dict[str, str] = field(default_factory=dict)  # what -> path


def pbt(
    study: optuna.Study,
    build: Callable[[optuna.Trial], Candidate],
    data: Dataset | None = None,
    *,
    population: int = 8,
    interval: int = 4,
    metric: str | None = None,
    quantile: float = 0.25,
    resample_probability: float = 0.25,
    explore: Mapping[str, Explore] | None = None,
    seed: int = 0,
    device: str = "cpu",
    dtype: str = "float32",
    out_dir: str | Path | None = None,
    on_event: Callable[[Any], None] | None = None,
) -> PBTSummary:
    """Population-based training of `population` members of `build(trial)` in one array (module docstring).

    - interval: epochs between exploit-and-explore rounds; the epochs are the candidates'.
    - metric: what ranks members and what each trial is told [default: the study's metric name, else
      val_acc]; quantile: the share of members that copy (and of those copied), at least one.
    - explore: name -> `Explore(low, high, log, factors)`; a name is an optimizer hyper-parameter a slot
      keeps (lr, weight_decay, momentum, beta1, beta2, clip_norm, ...), "dropout" (every dropout layer's
      rate) or "augment.noise" / "augment.mixup" / "augment.cutmix" (an augmentation the candidate turns
      on); resample_probability: the chance a value is drawn afresh.
    - seed: the members' init / data / dropout seeds derive from (seed, trial number), and the
      exploit / explore draws from seed.
    - out_dir: the best member's weights and config, its schedule (`best_schedule.yaml`) and `pbt.png`.
    """
    settings = PBTSettings(population, interval, metric, quantile, resample_probability, dict(explore or {}))
    return _PBTRun(study, build, data, settings, seed, device, dtype, out_dir, on_event).run()


def ranked_members(values: Mapping[int, float], direction: str) -> list[int]:
    """The members (trial number -> metric value) whose value is finite, best first for `direction`; ties go
    to the lower trial number. A member whose metric is NaN or infinite is not ranked: it neither copies
    nor is copied (with fewer than two ranked members nothing is exploited) and is never the best."""
    sign = -1.0 if direction == "maximize" else 1.0
    finite = [number for number, value in values.items() if math.isfinite(value)]
    return sorted(finite, key=lambda number: (sign * values[number], number))


class _PBTRun:
    """One run of `pbt`; see the module docstring."""

    def __init__(self, study, build, data, settings, seed, device, dtype, out_dir, on_event) -> None:
        if dtype not in DTYPES:
            raise HftaNasError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}.")
        if len(study.directions) != 1:
            raise HftaNasError(
                f"population-based training ranks members by one metric; the study has {len(study.directions)} "
                "objectives. Use a single-objective study."
            )
        self.study, self.build, self.data, self.settings, self.seed = study, build, data, settings, seed
        self.device, self.dtype = _checked_device(device), DTYPES[dtype]
        # what ranks and what each trial is told: one metric (the study's name for it, when it has one)
        told = study.metric_names[0] if study.metric_names else (settings.metric or "val_acc")
        self.metric = settings.metric or told
        if self.metric != told:
            raise HftaNasError(
                f"pbt ranks members by '{self.metric}' but the study's metric is '{told}'; a member's trial is "
                "told the value it is ranked by, so give the same metric to both."
            )
        self.direction = study.direction.name.lower()
        if (self.direction == "maximize") != higher_is_better(self.metric):
            log.warning("the study %ss %s; is that the direction you mean?", self.direction[:-1], self.metric)
        self.emit = on_event or (lambda event: None)
        self.location = storage_location(storage_of(study))
        self.ledger = Ledger(study, None)
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.export = BestExport(study, self.out_dir, [self.metric], [self.direction])
        folder = checkpoint_folder(self.location, study.study_name) if checkpoints_enabled() else None
        self.path = folder / CHECKPOINT if folder is not None else None
        self.identity = run_identity(settings, seed, self.device.type, str(self.dtype))
        self.proposals: list[Proposal] = []

    # ------------------------------------------------------------------ the run
    def run(self) -> PBTSummary:
        started = time.monotonic()
        resumed = self._resumed()
        trainer, records = resumed if resumed is not None else self._started()
        first = self.proposals[0].candidate
        start_epoch = trainer.epoch if resumed is not None else None
        self.emit(
            PBTStarted(
                self.study.study_name,
                self.location,
                dashboard_command(self.location),
                [p.number for p in self.proposals],
                first.epochs,
                self.settings.interval,
                self.metric,
                self.direction,
                start_epoch,
            )
        )
        self._announce_members(trainer)
        curve: list[tuple[float, float]] = []
        try:
            for report in trainer.epochs(first.epochs):
                self._tell_epoch(report, trainer, records)
                running = {n: m[self.metric] for n, m in report.metrics.items() if n not in report.failed}
                ranked = self._ranked(running)
                curve.append((time.monotonic() - started, running[ranked[0]] if ranked else math.nan))
                if report.epoch % self.settings.interval == 0 and report.epoch < first.epochs:
                    self._exploit_and_explore(report.epoch, ranked, trainer, records)
                self._save(trainer, records)
        except (KeyboardInterrupt, SystemExit, StorageUnreachable):
            raise  # the members stay RUNNING with the checkpoint: the next call continues them
        except Exception as error:
            raise self._failed(error) from error
        best = self._finish(trainer, records)
        return PBTSummary(
            self.study.study_name,
            self.location,
            dashboard_command(self.location),
            self.metric,
            self.direction,
            len(self.proposals),
            first.epochs,
            self.settings.interval,
            [p.number for p in self.proposals],
            best,
            records.exploits,
            time.monotonic() - started,
            curve,
            start_epoch,
            dict(self.export.files),
        )

    # ------------------------------------------------------------- the population
    def _started(self) -> tuple[ArrayTrainer, Records]:
        """A fresh population: members asked from the study, checked, built into one array."""
        self._fail_orphans(
            reason="its PBT run left no checkpoint that can continue it (it stopped before its first, or its "
            "trials were told since); a new population trained"
        )
        asked = []
        try:
            for slot in range(self.settings.population):
                trial = self.study.ask()
                asked.append(trial)
                trial.set_user_attr(MEMBER_ATTR, slot)
                self.proposals.append(self._proposal(trial))
            self._check_population()
            trainer = self._trainer()
        except BaseException as error:  # nothing trained: the asked trials are failed, not left RUNNING
            for trial in asked:
                self.ledger.fail(trial, Outcome.FAILED, f"not trained: {error}")
            raise
        return trainer, Records([p.number for p in self.proposals], self.seed)

    def _proposal(self, trial: optuna.Trial) -> Proposal:
        candidate = as_candidate(built(self.build, trial)).checked(self.data)
        return Proposal(trial, candidate, trial_seeds(self.seed, trial.number), meta_shell(candidate), 0)

    def _check_population(self) -> None:
        """One architecture and one set of shared settings; explored names that the optimizer keeps per slot."""
        first = self.proposals[0]
        for other in self.proposals[1:]:
            if not equal_shapes([first.shell, other.shell]):  # shapes, and module settings (a dropout rate)
                differ = sorted(k for k, v in other.trial.params.items() if first.trial.params.get(k) != v)
                raise HftaNasError(
                    f"population-based training copies weights between members, so they share one architecture; "
                    f"trials {first.number} and {other.number} build different models (params that differ: "
                    f"{', '.join(differ) or 'none'}). Search only hyper-parameters a slot keeps for itself."
                )
            if other.candidate.shared_settings() != first.candidate.shared_settings():
                raise HftaNasError(
                    f"trials {first.number} and {other.number} differ in settings an array shares (data, batch size, "
                    "epochs, optimizer, schedule kind, loss, augmentation, precision); PBT members share them."
                )
        candidate = first.candidate
        check_ranked_metric(candidate, self.metric)
        if candidate.early_stopping is not None:
            raise HftaNasError("early stopping does not apply to PBT: its worst members copy the best instead.")
        if self.settings.interval >= candidate.epochs:
            raise HftaNasError(
                f"pbt interval {self.settings.interval} is not below the members' {candidate.epochs} epochs: the "
                "population would never exploit; give a smaller interval or more epochs."
            )
        check_explored(self.settings.explore, candidate)

    def _trainer(self) -> ArrayTrainer:
        trainer = array_trainer(self.proposals, self.device, self.dtype, evaluate_test=self.metric.startswith("test_"))
        prepare(trainer, self.settings.explore)
        return trainer

    def _announce_members(self, trainer: ArrayTrainer) -> None:
        """Each member's start, as a search's trial starts (a tracker opens its run: params, slot, seeds)."""
        for proposal in self.proposals:
            attributes = {
                MEMBER_ATTR: proposal.trial.user_attrs.get(MEMBER_ATTR),
                "slot": trainer.position_of(proposal.number),
                **{f"seed_{source}": seed for source, seed in proposal.seeds.items()},
            }
            self.emit(TrialStarted(proposal.number, dict(proposal.trial.params), attributes))

    # ------------------------------------------------------------------ per epoch
    def _tell_epoch(self, report: Any, trainer: ArrayTrainer, records: Records) -> None:
        explored = {n: self._explored_now(trainer, n) for n in report.metrics}
        records.record_epoch(explored)
        for proposal in self.proposals:
            number = proposal.number
            if number in report.failed:
                if self.ledger.is_running(proposal.trial):  # (told already when a stopped run got this far)
                    self._record_end(proposal, records, trainer.results[number].epochs)
                    self.ledger.fail(proposal.trial, Outcome.FAILED, report.failed[number])
                self.emit(TrialEnded(number, "FAIL", reason=report.failed[number]))
            elif number in report.metrics and report.epoch not in proposal.reported:
                proposal.reported.add(report.epoch)
                proposal.trial.report(report.metrics[number][self.metric], report.epoch)
                # its curves, and the explored values it trained this epoch with (a tracker's hp/ curves)
                hparams = {f"hp/{name}": value for name, value in explored[number].items()}
                self.emit(TrialEpochEnded(number, report.epoch, {**report.metrics[number], **hparams}))

    def _explored_now(self, trainer: ArrayTrainer, number: int) -> dict[str, float]:
        """The explored hyper-parameters of a member as set (a scheduled lr: its base lr)."""
        slot = trainer.position_of(number)
        return {name: read(trainer, slot, name) for name in self.settings.explore}

    def _ranked(self, values: Mapping[int, float]) -> list[int]:
        return ranked_members(values, self.direction)

    def _exploit_and_explore(self, epoch: int, ranked: list[int], trainer: ArrayTrainer, records: Records) -> None:
        """The running members `ranked` best first: the worst copy the best and explore."""
        if len(ranked) < 2:
            return
        for target, source in records.pairs(ranked, self.settings.movers(len(ranked))):
            trainer.copy_slot(source, target)
            slot = trainer.position_of(target)
            copied = self._explored_now(trainer, target)
            explored = {
                name: how.new_value(copied[name], records.rng, self.settings.resample_probability)
                for name, how in self.settings.explore.items()
            }
            write(trainer, slot, explored)
            exploit = Exploit(
                epoch, target, source, trainer.position_of(source), {n: (copied[n], explored[n]) for n in copied}
            )
            records.exploited(exploit)
            self._write_records(target, records)
            self.emit(PBTExploited(epoch, target, source, exploit.changes))

    def _write_records(self, number: int, records: Records) -> None:
        """A member's schedule and lineage as trial attributes (at its exploits and at the end)."""
        trial = self._by_number(number).trial
        trial.set_user_attr("pbt_schedule", records.schedule[number])
        trial.set_user_attr("pbt_lineage", records.lineage[number])

    def _record_end(self, proposal: Proposal, records: Records, epochs: int) -> None:
        """Everything a member's trial keeps of the run, written once when it ends."""
        self._write_records(proposal.number, records)
        proposal.trial.set_user_attr("pbt_slot_values", records.values[proposal.number])
        proposal.trial.set_user_attr("pbt_roots", records.roots[proposal.number])
        proposal.trial.set_user_attr("epochs_run", epochs)

    def _by_number(self, number: int) -> Proposal:
        return next(p for p in self.proposals if p.number == number)

    # ---------------------------------------------------------------- checkpoints
    def _save(self, trainer: ArrayTrainer, records: Records) -> None:
        if self.path is None:
            return
        state = {
            "trainer": trainer.state_dict(),
            "records": records.state_dict(),
            "trials": {p.number: trial_id(p.trial) for p in self.proposals},
            "identity": self.identity,
        }
        save_checkpoint(self.path, state)

    def _resumed(self) -> tuple[ArrayTrainer, Records] | None:
        """The stopped run of this study continued from its checkpoint (`_pbt_resume`); None when there is
        none, or its members are not as it left them. HftaNasError for a run with other settings."""
        state = load_checkpoint(self.path) if self.path is not None else None
        if state is None:
            return None
        check_same_run(state, self.identity, self.study.study_name)
        if not members_as_left(state, self.study):
            log.warning("the PBT checkpoint %s is of another run; a new population trains", self.path)
            remove_checkpoint(self.path)
            return None
        storage, ids = storage_of(self.study), state["trials"]
        trials = [optuna.Trial(self.study, ids[number]) for number in state["trainer"]["initial_ids"]]
        self.proposals = [self._proposal(trial) for trial in trials]
        for proposal in self.proposals:
            proposal.reported.update(storage.get_trial(trial_id(proposal.trial)).intermediate_values)
        self._check_population()
        trainer = self._trainer()
        trainer.restore(state["trainer"])
        return trainer, Records.from_state(state["records"])

    def _fail_orphans(self, reason: str) -> None:
        """Members of a stopped run that left no checkpoint (or one that cannot continue) are failed."""
        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if MEMBER_ATTR in trial.user_attrs:
                self.ledger.fail(trial, Outcome.FAILED, reason)

    # ------------------------------------------------------------------- the end
    def _failed(self, error: Exception) -> HftaNasError:
        """Training raised: every member is failed (not trained), the checkpoint goes, one line is raised."""
        reason = f"{type(error).__name__}: {error}" if not isinstance(error, HftaNasError) else str(error)
        for proposal in self.proposals:
            if self.ledger.is_running(proposal.trial):
                self.ledger.fail(proposal.trial, Outcome.FAILED, f"not trained: the PBT run stopped on {reason}")
        if self.path is not None:
            remove_checkpoint(self.path)
        return HftaNasError(f"the PBT run stopped: {reason}; its members were failed")

    def _finish(self, trainer: ArrayTrainer, records: Records) -> dict[str, Any]:
        """Tell every member its last value, export the best one, drop the checkpoint; the best's record."""
        finals: dict[int, float] = {}
        for proposal in self.proposals:
            result = trainer.results[proposal.number]
            told = storage_of(self.study).get_trial(trial_id(proposal.trial))
            if told.state == TrialState.COMPLETE:  # told before this run was stopped (and continued)
                finals[proposal.number] = told.value
                continue
            if result.status != "completed" or told.state != TrialState.RUNNING:
                continue  # failed (and told, with its records) when it diverged
            self._record_end(proposal, records, result.epochs)
            value = result.final[self.metric]
            if not math.isfinite(value):
                self.ledger.fail(proposal.trial, Outcome.FAILED, f"non-finite {self.metric} {value}")
                continue
            self.ledger.complete(proposal.trial, [value])
            finals[proposal.number] = value
            self.emit(TrialEnded(proposal.number, "COMPLETE", [value]))
        best = self._export_best(trainer, records, finals)
        # the best member's files could not be written (a full disk): one line, with the checkpoint
        # kept, from which the same command run again (space freed) writes them
        self.export.repair()
        if self.path is not None:
            remove_checkpoint(self.path)
        return best

    @staticmethod
    def _replayable(best: Proposal, root: Proposal, schedule: dict[str, list[float]]) -> Proposal:
        """What the export writes for the best member: its trial, with its root's config and seeds and its
        schedule (a config that keeps one: `hparam_schedule`), which re-train its weights exactly."""
        config = root.candidate.config
        if dataclasses.is_dataclass(config) and hasattr(config, "hparam_schedule"):
            config = dataclasses.replace(config, hparam_schedule=schedule)
        candidate = dataclasses.replace(root.candidate, config=config)
        return Proposal(best.trial, candidate, root.seeds, root.shell, 0)

    def _export_best(self, trainer: ArrayTrainer, records: Records, finals: dict[int, float]) -> dict[str, Any]:
        ranked = self._ranked(finals)
        if not ranked:  # no member ended with a finite value: nothing is best
            return {}
        number = ranked[0]
        proposal, root = self._by_number(number), self._by_number(records.root_now[number])
        self.export.offer(
            self._replayable(proposal, root, records.schedule[number]),
            [finals[number]],
            trainer.array.slot_state_dict(trainer.position_of(number)),
            self.study.study_name,
        )
        best = {
            "number": number,
            "value": finals[number],
            "params": dict(proposal.trial.params),
            "root": root.number,  # whose initial weights, seeds and other hyper-parameters its weights carry
            "seeds": dict(root.seeds),
            "schedule": records.schedule[number],
            "lineage": records.lineage[number],
        }
        if self.out_dir is not None:
            self.export.files.update(write_pbt_files(self.out_dir, best, records, self.metric))
        return best
