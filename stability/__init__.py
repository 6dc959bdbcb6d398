"""Seed-stability studies: one configuration across many seeds in one array,
with a statistical report (`hfta-nas stability`, `hfta-nas report`).

>>> import stability
>>> done = stability.run_study("stability/configs/mnist1d_cnn.yaml", seeds=32)
>>> done.files["html"]                       # the self-contained report
>>> again = stability.report(stability.StabilityResult.load("runs/stability/mnist1d_cnn/result"), "out/")
"""

from stability._configs import DEFAULT_CONFIG, LabelledConfig, load_config
from stability._design import plan, source_seed
from stability._result import Analysis, StabilityResult
from stability._runner import run_stability
from stability._cli import report as report_command
from stability._cli import stability as stability_command
from stability._study import StudyReport, default_artifact_dir, report, run_study

__all__ = [
    "DEFAULT_CONFIG",
    "Analysis",
    "LabelledConfig",
    "StabilityResult",
    "StudyReport",
    "load_config",
    "default_artifact_dir",
    "plan",
    "report",
    "report_command",
    "run_stability",
    "run_study",
    "source_seed",
    "stability_command",
]
