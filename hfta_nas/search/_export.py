"""The best trial's weights and config: `best_weights.pt` and `best_config.yaml`.

A trial that beats every COMPLETE trial in the storage (other workers' too) is
staged first, `.trials/<number>.pt` and `.trials/<number>.yaml`, each written
atomically; then both are published over the two files users read. The
published pair is always recomputed from the study, not from what this run
remembers: every run starts and ends with `repair`, which publishes the staged
files of the study's best trial where the published ones name another trial
(a kill between the two writes, a worker that exported an older best), drops
staged files of trials that are no longer best, and removes temporary files a
kill left. So after any kill the next run leaves weights and config of one
trial, the best.

A trial is told before it is offered, and a failure to write its files (a full
disk, whatever the exception says) never fails it or the array it trained in:
the first one is logged at once and kept, and `repair` at the run's end raises it
(one line, a non-zero exit) when the published pair is not the study's best.
"""

from __future__ import annotations

import contextlib
import errno
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import optuna
import torch
import yaml
from optuna.trial import FrozenTrial, TrialState

from hfta_nas._files import atomic_write_bytes, atomic_write_text, save_weights
from hfta_nas.errors import HftaNasError
from hfta_nas.search._candidate import Proposal

WEIGHTS, CONFIG, STAGED = "best_weights.pt", "best_config.yaml", ".trials"
log = logging.getLogger(__name__)


class ExportFailed(HftaNasError):
    """The best trial's files could not be written into the output folder."""


class BestExport:
    """Stages and publishes the best trial by the first metric (see the module docstring)."""

    def __init__(
        self, study: optuna.Study, out_dir: Path | None, metrics: list[str], directions: list[str], lock: Any = None
    ) -> None:
        # `lock`: the study's lock; every write into out_dir happens under it, so a temporary file
        # found there by `repair` was left by a process that died, never one being written
        self.study, self.out_dir, self.metrics, self.lock = study, out_dir, metrics, lock or contextlib.nullcontext()
        self.maximize = directions[0] == "maximize"
        self.files: dict[str, str] = {}
        self.failure: ExportFailed | None = None  # the first offer that could not be written
        self.unsaved_best: str | None = None  # why the published pair is not the study's best trial's

    def best_trial(self) -> FrozenTrial | None:
        """The study's best COMPLETE trial by the first metric (the earliest on a tie); where trials
        carry constraints, the best feasible one (None when none is), as Optuna's `best_trial`."""
        done = self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if any(t.constraints for t in done):
            done = [t for t in done if all(v <= 0 for v in t.constraints.values())]
        if not done:
            return None
        key = (lambda t: (-t.values[0], t.number)) if self.maximize else (lambda t: (t.values[0], t.number))
        return min(done, key=key)

    def offer(
        self, proposal: Proposal, values: list[float], weights: Mapping[str, torch.Tensor], study_name: str
    ) -> None:
        """Stage and publish the trial just told COMPLETE if it is the study's best; a failure
        is kept in `failure` (and logged), never raised: the trial is told, its array trains on."""
        best = self.best_trial()
        if self.out_dir is None or best is None or best.number != proposal.number:
            return
        staged = self.out_dir / STAGED
        try:
            with self.lock, _writing(self.out_dir, proposal.number):
                save_weights(dict(weights), staged / f"{proposal.number}.pt")
                text = _config_text(proposal, values, self.metrics, study_name)
                if text is not None:
                    atomic_write_text(staged / f"{proposal.number}.yaml", text)
                self._repair(self.out_dir)
        except ExportFailed as error:  # (a storage that stays unreachable is raised: the search stops)
            if self.failure is None:  # noted at once (a long search goes on), raised when the run ends (`repair`)
                log.warning(
                    "cannot write trial %d's weights to '%s' (%s): training goes on and every trial is told; "
                    "the run ends with an error",
                    proposal.number,
                    self.out_dir,
                    _cause(error.__cause__ or error),
                )
                self.failure = error

    def _best_is_staged(self) -> bool:
        best = self.best_trial()
        return best is None or (self.out_dir is not None and (self.out_dir / STAGED / f"{best.number}.pt").exists())

    def repair(self) -> None:
        """Publish the study's best trial from its staged files where the published pair names
        another; drop other staged trials and temporary files left by a kill. Raises the kept
        `failure` when the study's best could not be staged (a later better trial clears it)."""
        if self.out_dir is None:
            return
        if self.out_dir.is_dir():
            with self.lock, _writing(self.out_dir):
                self._repair(self.out_dir)
        if self.failure is not None and not self._best_is_staged():
            raise self.failure

    def _repair(self, out_dir: Path) -> None:
        for stray in [*out_dir.glob(".*.tmp"), *(out_dir / STAGED).glob(".*.tmp")]:
            stray.unlink(missing_ok=True)
        staged = out_dir / STAGED
        best = self.best_trial()
        if best is None or not (staged / f"{best.number}.pt").exists():
            self._note_published()
            return
        for name, suffix in ((WEIGHTS, ".pt"), (CONFIG, ".yaml")):
            source, target = staged / f"{best.number}{suffix}", out_dir / name
            if not source.exists():
                target.unlink(missing_ok=True)  # a config of another trial must not sit beside these weights
                continue
            data = source.read_bytes()
            if not target.exists() or target.read_bytes() != data:
                atomic_write_bytes(target, data)
        for path in staged.iterdir():
            if path.stem != str(best.number):
                path.unlink(missing_ok=True)
        self._note_published()

    def _note_published(self) -> None:
        """`files` names the published pair as it now stands; what else was written (PBT's plot and
        schedule) stays named. `unsaved_best` says when the study's best trial has no weights here
        (a run that could not write them, a full disk): the pair, if any, is an older trial's."""
        assert self.out_dir is not None
        for kind, name in (("weights", WEIGHTS), ("config", CONFIG)):
            if (self.out_dir / name).exists():
                self.files[kind] = str(self.out_dir / name)
            else:
                self.files.pop(kind, None)
        best, published = self.best_trial(), _published_trial(self.out_dir / CONFIG)
        self.unsaved_best = None
        if best is not None and published != best.number and not (self.out_dir / STAGED / f"{best.number}.pt").exists():
            held = f"the files in '{self.out_dir}' are trial {published}'s" if published is not None else "none is"
            self.unsaved_best = (
                f"trial {best.number}, the study's best, has no weights saved here (its run could not "
                f"write them, wrote them under another --out, or is still writing them); {held}"
            )


def _published_trial(config: Path) -> int | None:
    """The trial number a published config names (its `origin`), None without one."""
    with contextlib.suppress(OSError, yaml.YAMLError, LookupError, AttributeError, TypeError, ValueError):
        return int(yaml.safe_load(config.read_text())["origin"]["trial"])
    return None


@contextlib.contextmanager
def _writing(out_dir: Path, trial: int | None = None) -> Iterator[None]:
    """Any failure to write into out_dir as one ExportFailed line naming its cause (a full disk
    may come as another error than OSError from code this calls); a user's error (HftaNasError,
    StorageUnreachable among them) goes through as it is."""
    try:
        yield
    except HftaNasError:
        raise
    except Exception as error:  # noqa: BLE001 - whatever it is, it must not fail a told trial
        lost = f"trial {trial}'s weights are not saved" if trial is not None else "the files may name an older trial"
        raise ExportFailed(
            f"cannot write the best trial's weights and config to '{out_dir}': {_cause(error)}; every trained "
            f"trial is told in the study, but {lost}; free space or give another --out"
        ) from error


def _cause(error: BaseException) -> str:
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return "no space left on the device (disk full)"
    if isinstance(error, OSError):
        return error.strerror or str(error)
    return f"{type(error).__name__}: {error}"


def _config_text(proposal: Proposal, values: list[float], metrics: list[str], study_name: str) -> str | None:
    """The candidate's config as YAML with where it came from, or None when it has none."""
    origin: dict[str, Any] = {
        "seeds": proposal.seeds,
        "trial": proposal.number,
        "study": study_name,
        "values": dict(zip(metrics, values)),
    }
    config = proposal.candidate.config
    if hasattr(config, "to_yaml"):
        return config.to_yaml(**origin)
    if isinstance(config, Mapping):
        return yaml.safe_dump({**dict(config), "origin": origin}, sort_keys=False)
    return None
