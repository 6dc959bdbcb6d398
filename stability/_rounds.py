"""Studies that stop when they are decided: `--until` and `--until-decided`.

A study runs its seeds in rounds, one array of `--seeds` seeds each, and after
every round asks its question of all the seeds so far through an anytime-valid
confidence sequence (`_sequential.py`): looking after each round does not
inflate the error, so it stops as soon as the answer is there, or at
`--max-seeds`. Each round re-runs the study with more seeds; the stored seeds
are reused (they are deterministic by index), so nothing trains twice and a
killed study resumes where it stopped.

The questions (`parse_until`), each at 95% confidence:
- `mean±X`, `median±X`: the metric's mean (median) known to ±X. Accuracies
  are fractions in [0, 1] and the sequences use them as they are (X = 0.005 or
  0.5%, half a point); a metric with no known bounds is refused.
- `fail<Y`: the failure rate bounded below Y, or shown above it. A seed fails
  when its training failed or, with --fail-below, its metric is below that.
- decided (`compare --until-decided [mean|median]`): each pair of
  configurations A, B has a paired difference A - B (same seeds) whose mean
  (median) is known to exclude 0. Differences of accuracies lie in [-1, 1]; the
  mean's sequence maps them to [0, 1] as (d + 1) / 2. With k pairs each is
  asked at 5%/k (Bonferroni), so all hold at once.

Knowing only that accuracies lie in [0, 1], a mean cannot be pinned down fast:
any seed might land at 0, so the bet against a candidate mean m is capped at
1/m and the interval shrinks by about log(1/alpha) / t whatever the spread
(benchmarks/stopping.py: seeds of sd 2 points never pin the mean to ±1 point
within 256 seeds; their median takes 71 on average). A median's interval is
made of order statistics and shrinks with the spread: ask `median±X` and
`--until-decided median` unless the mean itself is the question.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from hfta_nas.errors import HftaNasError

from ._sequential import ALPHA, bernoulli_cs, hedged_cs, running_median_cs

_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(%?)"
_PRECISION = re.compile(rf"^\s*(mean|median)\s*(?:±|\+-|\+/-)\s*{_NUMBER}\s*$")
_FAILURES = re.compile(rf"^\s*fail(?:ures?)?\s*<\s*{_NUMBER}\s*$")
_FORMS = "mean±X, median±X or fail<Y (e.g. median±0.5%, fail<0.1)"


@dataclass(frozen=True)
class Question:
    """What a study runs until: kind "precision" (bound: the half-width, a fraction), "fail" (bound:
    the rate) or "decided"; statistic: "mean" or "median" (precision, decided); text: as written."""

    kind: str
    statistic: str | None
    bound: float | None
    text: str


def decided(statistic: str = "mean") -> Question:
    """`--until-decided [mean|median]`: each pair's paired difference known to exclude 0."""
    if statistic not in ("mean", "median"):
        raise HftaNasError(f"--until-decided takes mean or median, got {statistic!r}.")
    return Question("decided", statistic, None, f"decided ({statistic})")


def parse_until(text: str) -> Question:
    """`--until`'s value as a Question ("decided", "decided median": `decided`, for run_study's
    until); HftaNasError (one line) for anything else."""
    words = text.split()
    if words[:1] == ["decided"] and len(words) <= 2:
        return decided(*words[1:])
    precision, failures = _PRECISION.match(text), _FAILURES.match(text)
    if precision:
        kind, number, percent = precision.groups()
        value = float(number) / (100 if percent else 1)
        if not 0 < value < 0.5:
            hint = f" (did you mean {number}%?)" if not percent and value >= 0.5 else ""
            raise HftaNasError(
                f"--until {text}: the half-width is a fraction of the [0, 1] scale, above 0 and below 0.5{hint}."
            )
        return Question("precision", kind, value, text.strip())
    if failures:
        number, percent = failures.groups()
        value = float(number) / (100 if percent else 1)
        if not 0 < value < 1:
            hint = f" (did you mean {number}%?)" if not percent and value >= 1 else ""
            raise HftaNasError(f"--until {text}: the failure rate's bound is between 0 and 1 exclusive{hint}.")
        return Question("fail", None, value, text.strip())
    raise HftaNasError(f"--until: expected {_FORMS}, got {text!r}.")


def check_question(question: Question, metric: str, *, n_configs: int, round_seeds: int, max_seeds: int) -> None:
    """HftaNasError, before anything trains, for a question this study cannot answer."""
    if question.kind != "fail" and not metric.endswith("_acc"):
        raise HftaNasError(
            f"--until {question.text}: the confidence sequences need a metric bounded in [0, 1] "
            f"(an accuracy), and {metric} is not; ask fail<Y with --fail-below instead."
        )
    if question.kind == "decided" and n_configs < 2:
        raise HftaNasError("--until-decided compares configurations: give at least two.")
    if not 1 <= round_seeds <= max_seeds:
        raise HftaNasError(f"--max-seeds ({max_seeds}) must be at least --seeds, the seeds of a round ({round_seeds}).")


@dataclass
class Answer:
    """One look's answer for one configuration (or pair): its bounds and whether it decides."""

    subject: str
    low: float
    high: float
    n: int
    decided: bool
    text: str


def answer(question: Question, seeds: pd.DataFrame, metric: str, fail_below: float | None) -> list[Answer]:
    """The question asked of every seed so far (rows of seeds.csv), one Answer per configuration
    (per pair, for "decided"); seeds in index order, which does not depend on their values."""
    main = seeds[seeds["design"] == "all"].sort_values("seed_index")
    labels = list(dict.fromkeys(main["config"]))
    if question.kind == "decided":
        pairs = list(itertools.combinations(labels, 2))
        return [_decided(main, a, b, question.statistic, metric, ALPHA / len(pairs)) for a, b in pairs]
    rows = {label: main[main["config"] == label] for label in labels}
    if question.kind == "fail":
        return [_failure_rate(label, rows[label], question.bound, metric, fail_below) for label in labels]
    return [_precision(label, rows[label], question, metric) for label in labels]


def _precision(label: str, rows: pd.DataFrame, question: Question, metric: str) -> Answer:
    values = _completed(rows, metric)
    low, high = _bounds(values, question.statistic, ALPHA, lowest=0.0)
    half = (high - low) / 2
    decided = half <= question.bound + 1e-12  # accuracies are multiples of 1/n_test: ties with X are exact
    text = (
        f"{label}: {question.statistic} {metric} in [{_pct(low)}, {_pct(high)}] over {len(values)} seeds, "
        f"±{_pct(half)} ({'≤' if decided else '>'} ±{_pct(question.bound)} asked)"
    )
    return Answer(label, low, high, len(values), decided, text)


def _failure_rate(label: str, rows: pd.DataFrame, bound: float, metric: str, fail_below: float | None) -> Answer:
    failed = rows["status"] != "completed"
    if fail_below is not None:
        failed |= ~(rows[metric] >= fail_below)  # NaN (no value) counts as failed
    low, high = bernoulli_cs(int(failed.sum()), len(rows))
    verdict = "below" if high < bound else "not below" if low >= bound else "undecided against"
    text = (
        f"{label}: failure rate in [{_pct(low)}, {_pct(high)}] ({int(failed.sum())} of {len(rows)} seeds failed): "
        f"{verdict} {_pct(bound)}"
    )
    return Answer(label, low, high, len(rows), verdict != "undecided against", text)


def _decided(main: pd.DataFrame, a: str, b: str, statistic: str, metric: str, alpha: float) -> Answer:
    """A - B over the seeds both completed, in seed order; decided once the sequence excludes 0."""
    paired = main.pivot_table(index="seed_index", columns="config", values=metric, aggfunc="first")
    both = paired[[a, b]].dropna().sort_index() if {a, b} <= set(paired.columns) else pd.DataFrame()
    differences = (both[a] - both[b]).to_numpy() if len(both) else np.zeros(0)
    low, high = _bounds(np.clip(differences, -1, 1), statistic, alpha, lowest=-1.0)
    decided = low > 0 or high < 0
    verdict = f"{a} better" if low > 0 else f"{b} better" if high < 0 else "undecided"
    bounds = f"[{_pct(low, sign=True)}, {_pct(high, sign=True)}]"
    text = f"{a} - {b}: {statistic} {metric} in {bounds} over {len(differences)} pairs: {verdict}"
    return Answer(f"{a} vs {b}", low, high, len(differences), decided, text)


def _bounds(values: np.ndarray, statistic: str, alpha: float, lowest: float) -> tuple[float, float]:
    """The sequence's interval after `values` (in [lowest, 1]) for their mean or median; the mean's
    maps [lowest, 1] linearly to [0, 1] and back."""
    if statistic == "median":
        return running_median_cs(values, alpha, lowest, 1.0)
    if not len(values):
        return lowest, 1.0
    width = 1.0 - lowest
    lows, highs = hedged_cs((values - lowest) / width, alpha=alpha)
    return lowest + width * float(lows[-1]), lowest + width * float(highs[-1])


def _completed(rows: pd.DataFrame, metric: str) -> np.ndarray:
    values = rows.loc[rows["status"] == "completed", metric].to_numpy(dtype=np.float64)
    return np.clip(values[np.isfinite(values)], 0.0, 1.0)


def _pct(value: float, sign: bool = False) -> str:
    return f"{100 * value:{'+' if sign else ''}.2f}%"


Train = Callable[[int], tuple[Any, dict[str, Any]]]  # seeds -> (StabilityResult, stores)


def run_rounds(
    question: Question,
    train: Train,
    *,
    round_seeds: int,
    max_seeds: int,
    metric: str,
    fail_below: float | None = None,
    on_event: Callable[[str, dict[str, Any]], None] | None = None,
) -> tuple[Any, dict[str, Any]]:
    """Rounds of `round_seeds` more seeds each (`train(n)` runs the study with n seeds, reusing the
    stored ones) until `question` is answered or `max_seeds`; the result's metadata records every look."""
    on_event = on_event or (lambda kind, info: None)
    looks: list[dict[str, Any]] = []
    arrays: list[dict[str, Any]] = []
    seconds, trained, n = 0.0, 0, 0
    while True:
        n = min(n + round_seeds, max_seeds)
        result, stores = train(n)
        arrays += result.metadata.get("arrays", [])
        seconds += result.metadata.get("seconds") or 0.0
        trained += len(result.seeds) - result.metadata.get("reused_seeds", 0)
        answers = answer(question, result.seeds, metric, fail_below)
        decided = all(a.decided for a in answers)
        looks.append({"seeds": n, "decided": decided, "answers": [asdict(a) for a in answers]})
        on_event("round", {"round": len(looks), "seeds": n, "answers": answers, "decided": decided})
        if decided or n >= max_seeds:
            break
    result.metadata.update(arrays=arrays, seconds=seconds, reused_seeds=len(result.seeds) - trained)
    result.metadata["sequential"] = {
        "question": question.text,
        "confidence": 1 - ALPHA,
        "method": "anytime-valid confidence sequences (hfta_nas.stability._sequential)",
        "round_seeds": round_seeds,
        "max_seeds": max_seeds,
        "decided": decided,
        "rounds": looks,
    }
    return result, stores
