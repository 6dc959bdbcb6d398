"""Data for model arrays: datasets resident on the device and per-slot data order.

`load_dataset` turns a built-in name, a file or a factory into train / val / test
tensors on the device; `EpochOrder` gives each slot its own shuffling (or one
shared order), and `gather` picks every slot's batch in one index op.
"""

from hfta_nas.data._augment import Augmentation, Augmented, SlotAugmenter
from hfta_nas.data._batches import EpochOrder, gather
from hfta_nas.data._datasets import DATASETS, Dataset, check_source, load_dataset
from hfta_nas.data._splits import SlotSplits, pooled, slot_splits

__all__ = [
    "DATASETS",
    "Augmentation",
    "Augmented",
    "Dataset",
    "EpochOrder",
    "SlotAugmenter",
    "SlotSplits",
    "check_source",
    "gather",
    "load_dataset",
    "pooled",
    "slot_splits",
]
