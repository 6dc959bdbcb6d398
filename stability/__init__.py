"""Seed-stability studies: one configuration across many seeds in one array,
with a statistical report (`hfta-nas stability`, `hfta-nas report`).

```pycon
>>> import stability
>>> done = stability.run_study("stability/configs/mnist1d_cnn.yaml", seeds=32)
>>> done.files["html"]                       # the self-contained report
>>> again = stability.report(stability.StabilityResult.load("runs/stability/mnist1d_cnn/result"), "out/")
```

The public names load on first use (PEP 562): `import stability` alone costs
nothing, and the click commands (`stability_command`, `report_command`) come
without the engine, statistics or plots, so `hfta-nas stability --help` answers
at once.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the names below are, for type checkers and editors
    from stability._cli import report as report_command
    from stability._cli import stability as stability_command
    from stability._configs import DEFAULT_CONFIG, LabelledConfig, load_config
    from stability._design import plan, source_seed
    from stability._result import Analysis, StabilityResult
    from stability._runner import run_stability
    from stability._stats import (
        bootstrap_interval,
        clopper_pearson,
        failure_rate,
        find_modes,
        mode_threshold,
        prob_greater,
        prob_greater_interval,
        seeds_to_see_failure,
        studentized_gaps,
        t_interval,
        variance_interval,
    )
    from stability._study import StudyReport, default_artifact_dir, report, run_study
    from stability._tracking import StabilityTracking

# public name -> (module, its name there)
_PUBLIC = {
    "DEFAULT_CONFIG": ("stability._configs", "DEFAULT_CONFIG"),
    "LabelledConfig": ("stability._configs", "LabelledConfig"),
    "load_config": ("stability._configs", "load_config"),
    "plan": ("stability._design", "plan"),
    "source_seed": ("stability._design", "source_seed"),
    "Analysis": ("stability._result", "Analysis"),
    "StabilityResult": ("stability._result", "StabilityResult"),
    "run_stability": ("stability._runner", "run_stability"),
    "bootstrap_interval": ("stability._stats", "bootstrap_interval"),
    "prob_greater": ("stability._stats", "prob_greater"),
    "prob_greater_interval": ("stability._stats", "prob_greater_interval"),
    "t_interval": ("stability._stats", "t_interval"),
    "clopper_pearson": ("stability._stats", "clopper_pearson"),
    "failure_rate": ("stability._stats", "failure_rate"),
    "find_modes": ("stability._stats", "find_modes"),
    "mode_threshold": ("stability._stats", "mode_threshold"),
    "seeds_to_see_failure": ("stability._stats", "seeds_to_see_failure"),
    "studentized_gaps": ("stability._stats", "studentized_gaps"),
    "variance_interval": ("stability._stats", "variance_interval"),
    "report_command": ("stability._cli", "report"),
    "stability_command": ("stability._cli", "stability"),
    "StudyReport": ("stability._study", "StudyReport"),
    "default_artifact_dir": ("stability._study", "default_artifact_dir"),
    "report": ("stability._study", "report"),
    "run_study": ("stability._study", "run_study"),
    "StabilityTracking": ("stability._tracking", "StabilityTracking"),
}

__all__ = [
    "DEFAULT_CONFIG",
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
