"""The one-call Python API behind `hfta-nas stability` and `hfta-nas report`.

>>> import hfta_nas.stability as stability
>>> done = stability.run_study("stability/configs/mnist1d_cnn.yaml", seeds=32, out_dir="runs/stability/cnn")
>>> done.analysis.summary.query("metric == 'test_acc'")[["config", "mean", "ci_low", "ci_high"]]
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hfta_nas.errors import HftaNasError
from hfta_nas.search import artifact_folder
from hfta_nas.search_spaces import ResolvedConfig

from ._configs import LabelledConfig, label_for, load_config
from ._design import check_design, parse_vary
from ._export import FORMATS, PLOT_FORMATS, write_report
from ._formats import FAIL_MARGIN, MAX_SEEDS_UNTIL
from ._result import DEFAULT_VARY, METRICS, Analysis, StabilityResult
from ._rounds import Question, check_question, parse_until, run_rounds


@dataclass
class StudyReport:
    """What a study produced: raw result, statistics, files written, where it is stored."""

    result: StabilityResult
    analysis: Analysis
    out_dir: Path
    files: dict[str, list[Path]]
    studies: dict[str, str] = field(default_factory=dict)  # config label -> Optuna study name
    artifacts: list[str] = field(default_factory=list)  # artifact ids of the attached report
    artifact_dir: Path | None = None


# A bound on the seeds of one study: far more than an array holds, and a list that still fits in memory.
MAX_SEEDS = 100_000


def check_run_options(seeds: Any, metric: str, measured: Sequence[str] = ()) -> None:
    """HftaNasError for a seed count or metric that would fail only after training, when the
    study is stored (`measured`: what every config records, user metrics such as val_top2
    included; empty: any standard metric)."""
    if isinstance(seeds, bool) or not isinstance(seeds, int) or not 1 <= seeds <= MAX_SEEDS:
        raise HftaNasError(f"--seeds must be an integer from 1 to {MAX_SEEDS:,}, got {seeds!r}.")
    known = list(measured) or list(METRICS)
    if metric not in known:  # what every seed's training records
        close = difflib.get_close_matches(metric, known, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise HftaNasError(f"--metric: unknown metric '{metric}'{hint}; expected one of {', '.join(known)}.")


def check_fail_below(threshold: float | None, metric: str) -> None:
    """HftaNasError for a --fail-below the metric cannot use: a metric better lower (a loss, an
    error), or an accuracy threshold outside [0, 1] (accuracies are fractions: 0.6, not 60)."""
    if threshold is None:
        return
    if not math.isfinite(threshold):
        raise HftaNasError(f"--fail-below must be a finite number, got {threshold}.")
    if metric.endswith(("_loss", "_rmse", "_mae", "_error", "_err")):
        raise HftaNasError(
            f"--fail-below counts seeds below a value, but {metric} is better lower; use a metric to maximise."
        )
    if metric.endswith("_acc") and not 0 <= threshold <= 1:
        hint = f" (did you mean {threshold / 100:g}?)" if 1 < threshold <= 100 else ""
        raise HftaNasError(f"--fail-below {threshold:g}: accuracies are fractions from 0 to 1{hint}.")


def measured_by_every_config(configs: Sequence[LabelledConfig]) -> list[str]:
    """The metrics every config records (a classification config has no test_r2), in METRICS order."""
    per_config = [
        {name for split in ("train", "val", "test") for name in item.config.objective().metric_names(split)}
        for item in configs
    ]
    common = set.intersection(*per_config) if per_config else set()
    return [*(m for m in METRICS if m in common), *sorted(common - set(METRICS))]


def metric_for(configs: Sequence[LabelledConfig], metric: str) -> str:
    """`metric`, except that the default test_acc is test_rmse when every config is a regression."""
    if metric == "test_acc" and configs and all(item.config.kind == "regression" for item in configs):
        return "test_rmse"  # test_acc is not measured for regression
    return metric


def run_study(
    configs: str | Path | ResolvedConfig | LabelledConfig | Sequence[str | Path | ResolvedConfig | LabelledConfig],
    *,
    seeds: int = 32,
    vary: str | Sequence[str] = DEFAULT_VARY,
    decompose: bool | str | None = None,
    base_seed: int = 0,
    device: str = "cpu",
    dtype: str = "float32",
    array_size: int | None = None,
    storage: str | None = None,
    store: bool = True,
    out_dir: str | Path | None = None,
    formats: Sequence[str] = FORMATS,
    plot_formats: Sequence[str] = PLOT_FORMATS,
    metric: str = "test_acc",
    bootstrap_seed: int = 0,
    artifact_dir: str | Path | None = None,
    earlier: Sequence[StabilityResult] = (),
    on_event: Callable[[str, dict[str, Any]], None] | None = None,
    fail_below: float | None = None,
    fail_margin: float = FAIL_MARGIN,
    until: str | Question | None = None,
    max_seeds: int = MAX_SEEDS_UNTIL,
) -> StudyReport:
    """Train each configuration across `seeds` seeds, analyse, write the report, store it.

    `configs`: config files, ResolvedConfigs or LabelledConfigs (one or several);
    `storage`: an Optuna storage URL or journal path (default runs/hfta-nas.journal;
    `store=False` keeps nothing in a storage); `earlier`: results of earlier studies
    to compare with, reused without retraining (with no configuration to train, only they are
    compared: nothing is trained and no storage is opened). `metric` test_acc (the default) is
    test_rmse for regression configs. `fail_below`: a seed whose `metric` is below it counts
    as gone wrong in the failure rate; without it, one worse than its study's median by more than
    `fail_margin` of the median does. `until` ("median±0.5%", "mean±0.01", "fail<0.1", or
    "decided median" / "decided" (the mean) for a comparison): train rounds of `seeds` seeds until it is answered or
    `max_seeds` (see stability/_rounds.py); it needs the storage, where the rounds resume.
    """
    from hfta_nas.search import open_storage

    from ._runner import run_stability

    labelled = _labelled(configs)
    if not labelled and earlier:
        return _report_earlier(
            list(earlier),
            out_dir,
            formats=formats,
            plot_formats=plot_formats,
            metric=metric,
            bootstrap_seed=bootstrap_seed,
            artifact_dir=artifact_dir,
            fail_below=fail_below,
        )
    metric = metric_for(labelled, metric)
    check_run_options(seeds, metric, measured_by_every_config(labelled))
    check_fail_below(fail_below, metric)
    vary = parse_vary(vary)
    check_design(seeds, vary=vary, decompose=decompose)  # before anything is stored
    _check_sources(labelled, vary)
    question = _question(until, metric, labelled, seeds, max_seeds, store=store, decompose=decompose)
    opened, location = open_storage(storage) if store else (None, "")
    train = lambda n: run_stability(  # noqa: E731 (the same study, with n seeds)
        labelled,
        n_seeds=n,
        vary=vary,
        decompose=decompose,
        base_seed=base_seed,
        device=device,
        dtype=dtype,
        array_size=array_size,
        storage=opened,
        storage_location=location,
        bootstrap_seed=bootstrap_seed,
        on_event=on_event,
    )
    if question is None:
        result, stores = train(seeds)
    else:
        result, stores = run_rounds(
            question,
            train,
            round_seeds=seeds,
            max_seeds=max_seeds,
            metric=metric,
            fail_below=fail_below,
            on_event=on_event,
        )
    if earlier:
        result = StabilityResult.combine([result, *earlier])
    out = (
        Path(out_dir)
        if out_dir is not None
        else Path("runs") / "stability" / "-vs-".join(item.label.replace(" ", "") for item in labelled)
    )
    artifacts = Path(artifact_dir) if artifact_dir is not None else (default_artifact_dir(location) if store else None)
    return report(
        result,
        out,
        formats=formats,
        plot_formats=plot_formats,
        metric=metric,
        bootstrap_seed=bootstrap_seed,
        stores=stores,
        artifact_dir=artifacts,
        fail_below=fail_below,
        fail_margin=fail_margin,
    )


def _question(
    until: str | Question | None,
    metric: str,
    labelled: Sequence[LabelledConfig],
    seeds: int,
    max_seeds: int,
    *,
    store: bool,
    decompose: bool | str | None,
) -> Question | None:
    """`until` parsed and checked before anything trains (None: a study of `seeds` seeds)."""
    if until is None:
        return None
    question = until if isinstance(until, Question) else parse_until(until)
    if not store:
        raise HftaNasError("--until runs rounds that resume the stored study; it needs a storage.")
    if decompose:
        raise HftaNasError("--until runs the main design in rounds; run --decompose as a study of its own.")
    if isinstance(max_seeds, bool) or not isinstance(max_seeds, int) or not 1 <= max_seeds <= MAX_SEEDS:
        raise HftaNasError(f"--max-seeds must be an integer from 1 to {MAX_SEEDS:,}, got {max_seeds!r}.")
    check_question(question, metric, n_configs=len(labelled), round_seeds=seeds, max_seeds=max_seeds)
    return question


def report(
    result: StabilityResult,
    out_dir: str | Path,
    *,
    formats: Sequence[str] = FORMATS,
    plot_formats: Sequence[str] = PLOT_FORMATS,
    metric: str = "test_acc",
    bootstrap_seed: int | None = None,
    stores: dict[str, Any] | None = None,
    artifact_dir: Path | None = None,
    fail_below: float | None = None,
    fail_margin: float = FAIL_MARGIN,
) -> StudyReport:
    """Analyse a result and write its report (and raw data, for `hfta-nas report`) to `out_dir`."""
    from ._analysis import analyse

    check_fail_below(fail_below, metric)
    known = set(result.curves["metric"]) | {c for c in result.seeds.columns if c.endswith(("_acc", "_loss"))}
    if metric not in known:
        raise HftaNasError(f"unknown metric '{metric}'; the results have {', '.join(sorted(known))}.")
    out = Path(out_dir)
    try:
        result.save(out / "result")
    except OSError as error:
        raise HftaNasError(f"cannot write the report folder '{out}': {error.strerror or error}") from None
    thresholds = None if fail_below is None else {metric: fail_below}
    analysis = analyse(result, bootstrap_seed=bootstrap_seed, fail_below=thresholds, fail_margin=fail_margin)
    files = write_report(result, analysis, out, formats=formats, plot_formats=plot_formats, metric=metric)
    attached = []
    html = next((p for p in files.get("html", []) if Path(p).suffix == ".html"), None)
    if html is not None and artifact_dir is not None:
        attached = [store.attach(Path(html), artifact_dir) for store in (stores or {}).values()]
    studies = {label: s.name for label, s in (stores or {}).items()} or dict(result.metadata.get("studies", {}))
    return StudyReport(result, analysis, out, files, studies, attached, artifact_dir)


def _report_earlier(
    earlier: list[StabilityResult],
    out_dir: str | Path | None,
    *,
    metric: str,
    artifact_dir: str | Path | None,
    **options: Any,
) -> StudyReport:
    """The report of stored results alone (`stability compare REPORT1 REPORT2`): their per-seed
    results side by side, analysed as a study of them all would be; nothing trained."""
    result = StabilityResult.combine(earlier) if len(earlier) > 1 else earlier[0]
    measured = {m for m in ("test_acc", "test_rmse") if m in result.seeds and result.seeds[m].notna().any()}
    if metric == "test_acc" and measured == {"test_rmse"}:
        metric = "test_rmse"  # regression results: test_acc is not measured (as `metric_for` does for configs)
    labels = [str(label).replace(" ", "") for label in dict.fromkeys(result.seeds["config"])]
    out = Path(out_dir) if out_dir is not None else Path("runs") / "stability" / "-vs-".join(labels)
    artifacts = Path(artifact_dir) if artifact_dir is not None else None
    return report(result, out, metric=metric, artifact_dir=artifacts, **options)


def default_artifact_dir(location: str) -> Path:
    """Where reports are stored as Optuna artifacts: beside a journal or SQLite file; runs/artifacts for servers."""
    return artifact_folder(location) or Path("runs") / "artifacts"


def _check_sources(labelled: Sequence[LabelledConfig], vary: Sequence[str]) -> None:
    """Import each configuration's model factory and data function (if any) before the
    storage is opened: a misspelt module must not leave an empty study behind; a split
    to vary needs validation data."""
    from hfta_nas.data import check_source
    from hfta_nas.models import FAMILIES, load_factory

    for item in labelled:
        try:
            if isinstance(item.config.model, str) and item.config.model not in FAMILIES:
                load_factory(item.config.model)
            check_source(item.config.dataset)
        except HftaNasError as error:
            raise HftaNasError(f"configuration '{item.label}': {error}") from None
        if "split" in vary and not item.config.data.get("val_fraction"):
            raise HftaNasError(
                f"configuration '{item.label}': --vary split re-draws the train/validation split, "
                "but its data has no validation samples (data.val_fraction: 0)."
            )


def _labelled(configs: Any) -> list[LabelledConfig]:
    items = list(configs) if isinstance(configs, (list, tuple)) else [configs]
    labelled: list[LabelledConfig] = []
    for item in items:
        if isinstance(item, LabelledConfig):
            labelled.append(item)
        elif isinstance(item, ResolvedConfig):
            labelled.append(LabelledConfig(f"config{len(labelled) + 1}", item))
        else:
            labelled.append(LabelledConfig(label_for(item, [c.label for c in labelled]), load_config(item)))
    return labelled
