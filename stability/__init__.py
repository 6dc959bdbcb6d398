"""Seed-stability studies: one configuration across many seeds in one array,
with a statistical report (`hfta-nas stability`, `hfta-nas report`).

```pycon
>>> import hfta_nas.stability as stability
>>> done = stability.run_study("stability/configs/mnist1d_cnn.yaml", seeds=32)
>>> done.files["html"]                       # the self-contained report
>>> again = stability.report(stability.StabilityResult.load("runs/stability/mnist1d_cnn/result"), "out/")
```

The public names load on first use (PEP 562): `import hfta_nas.stability` alone costs
nothing, and the click commands (`stability_command`, `report_command`) come
without the engine, statistics or plots, so `hfta-nas stability --help` answers
at once.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the names below are, for type checkers and editors
    from ._cli import report as report_command
    from ._cli import stability as stability_command
    from ._configs import DEFAULT_CONFIG, LabelledConfig, load_config
    from ._design import plan, source_seed
    from ._formats import FAIL_MARGIN
    from ._result import Analysis, StabilityResult
    from ._robust import (
        dkw_half_width,
        iqm,
        median_interval,
        performance_profile,
        stratified_bootstrap,
        wrong_units,
    )
    from ._runner import run_stability
    from ._sequential import bernoulli_cs, hedged_cs, median_cs, running_median_cs
    from ._stats import (
        bootstrap_interval,
        clopper_pearson,
        crossed_mean_interval,
        failure_rate,
        find_modes,
        grid_decomposition,
        mode_threshold,
        prob_greater,
        prob_greater_interval,
        seeds_to_see_failure,
        studentized_gaps,
        t_interval,
        variance_interval,
        welch_interval,
    )
    from ._study import StudyReport, default_artifact_dir, report, run_study
    from ._tracking import StabilityTracking

# public name -> (module, its name there)
_PUBLIC = {
    "DEFAULT_CONFIG": ("hfta_nas.stability._configs", "DEFAULT_CONFIG"),
    "LabelledConfig": ("hfta_nas.stability._configs", "LabelledConfig"),
    "load_config": ("hfta_nas.stability._configs", "load_config"),
    "plan": ("hfta_nas.stability._design", "plan"),
    "source_seed": ("hfta_nas.stability._design", "source_seed"),
    "Analysis": ("hfta_nas.stability._result", "Analysis"),
    "StabilityResult": ("hfta_nas.stability._result", "StabilityResult"),
    "run_stability": ("hfta_nas.stability._runner", "run_stability"),
    "FAIL_MARGIN": ("hfta_nas.stability._formats", "FAIL_MARGIN"),
    "dkw_half_width": ("hfta_nas.stability._robust", "dkw_half_width"),
    "iqm": ("hfta_nas.stability._robust", "iqm"),
    "median_interval": ("hfta_nas.stability._robust", "median_interval"),
    "performance_profile": ("hfta_nas.stability._robust", "performance_profile"),
    "stratified_bootstrap": ("hfta_nas.stability._robust", "stratified_bootstrap"),
    "wrong_units": ("hfta_nas.stability._robust", "wrong_units"),
    "bernoulli_cs": ("hfta_nas.stability._sequential", "bernoulli_cs"),
    "hedged_cs": ("hfta_nas.stability._sequential", "hedged_cs"),
    "median_cs": ("hfta_nas.stability._sequential", "median_cs"),
    "running_median_cs": ("hfta_nas.stability._sequential", "running_median_cs"),
    "bootstrap_interval": ("hfta_nas.stability._stats", "bootstrap_interval"),
    "prob_greater": ("hfta_nas.stability._stats", "prob_greater"),
    "prob_greater_interval": ("hfta_nas.stability._stats", "prob_greater_interval"),
    "t_interval": ("hfta_nas.stability._stats", "t_interval"),
    "clopper_pearson": ("hfta_nas.stability._stats", "clopper_pearson"),
    "failure_rate": ("hfta_nas.stability._stats", "failure_rate"),
    "find_modes": ("hfta_nas.stability._stats", "find_modes"),
    "mode_threshold": ("hfta_nas.stability._stats", "mode_threshold"),
    "seeds_to_see_failure": ("hfta_nas.stability._stats", "seeds_to_see_failure"),
    "studentized_gaps": ("hfta_nas.stability._stats", "studentized_gaps"),
    "variance_interval": ("hfta_nas.stability._stats", "variance_interval"),
    "welch_interval": ("hfta_nas.stability._stats", "welch_interval"),
    "crossed_mean_interval": ("hfta_nas.stability._stats", "crossed_mean_interval"),
    "grid_decomposition": ("hfta_nas.stability._stats", "grid_decomposition"),
    "report_command": ("hfta_nas.stability._cli", "report"),
    "stability_command": ("hfta_nas.stability._cli", "stability"),
    "StudyReport": ("hfta_nas.stability._study", "StudyReport"),
    "default_artifact_dir": ("hfta_nas.stability._study", "default_artifact_dir"),
    "report": ("hfta_nas.stability._study", "report"),
    "run_study": ("hfta_nas.stability._study", "run_study"),
    "StabilityTracking": ("hfta_nas.stability._tracking", "StabilityTracking"),
}

__all__ = [
    "DEFAULT_CONFIG",
    "FAIL_MARGIN",
    "Analysis",
    "LabelledConfig",
    "StabilityResult",
    "StabilityTracking",
    "StudyReport",
    "load_config",
    "default_artifact_dir",
    "plan",
    "report",
    "bootstrap_interval",
    "prob_greater",
    "prob_greater_interval",
    "report_command",
    "run_stability",
    "run_study",
    "source_seed",
    "stability_command",
    "t_interval",
    "clopper_pearson",
    "failure_rate",
    "find_modes",
    "mode_threshold",
    "seeds_to_see_failure",
    "studentized_gaps",
    "variance_interval",
    "welch_interval",
    "crossed_mean_interval",
    "grid_decomposition",
    "bernoulli_cs",
    "hedged_cs",
    "median_cs",
    "running_median_cs",
    "dkw_half_width",
    "iqm",
    "median_interval",
    "performance_profile",
    "stratified_bootstrap",
    "wrong_units",
]


def __getattr__(name: str) -> Any:
    """Import a public name's module the first time the name is asked for (then it is a plain global)."""
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _PUBLIC[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
