"""What the commands built on the engine share (the search, stability studies, the CLI):
process set-up, option checks, atomic files, epoch progress and out-of-memory halving.

Public names for packages above the engine; they import these, not `hfta_nas._*`.
"""

from hfta_nas._console import command_console, plural
from hfta_nas._files import atomic_write_bytes, atomic_write_text, save_weights
from hfta_nas._progress import EpochProgress
from hfta_nas.training._checkpoint import remove as remove_checkpoint
from hfta_nas.training._checkpoint import remove_empty_folders
from hfta_nas.training._oom import train_in_halves
from hfta_nas.training._run import DTYPES, set_up_command_process
from hfta_nas.training._run import _checked_device as checked_device
from hfta_nas.training._run import _checked_out_dir as checked_out_dir

__all__ = [
    "DTYPES",
    "EpochProgress",
    "atomic_write_bytes",
    "atomic_write_text",
    "checked_device",
    "checked_out_dir",
    "command_console",
    "plural",
    "remove_checkpoint",
    "remove_empty_folders",
    "save_weights",
    "set_up_command_process",
    "train_in_halves",
]
