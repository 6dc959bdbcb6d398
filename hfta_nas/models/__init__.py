"""Built-in model families configurable by a dict, and loading of user factories.

```pycon
>>> from hfta_nas.models import build_model, model_factory, family_defaults
>>> model = build_model("cnn1d", {"channels": [32, 32], "pool": "max"}, input_shape=(1, 40), num_classes=10)
>>> factory = model_factory("mlp", {"depth": 3}, input_shape=(12,), num_classes=3)  # validated now
>>> family_defaults("gru")
{'hidden': 64, 'layers': 1, 'bidirectional': False, 'dropout': 0.0, 'cell': 'gru'}
```

Search spaces sample the config keys by name; every family is a classifier
mapping [N, *input_shape] to logits [N, num_classes], and its parameter shapes
depend only on the config and shapes, so models of one config fuse into one
array. A model that is not a built-in family comes from `load_factory`.
"""

from hfta_nas.models._families import FAMILIES, build_model, count_parameters, family_defaults, model_factory
from hfta_nas.models._loading import load_factory
from hfta_nas.models._resolve import resolve_model

__all__ = [
    "FAMILIES",
    "build_model",
    "count_parameters",
    "family_defaults",
    "load_factory",
    "model_factory",
    "resolve_model",
]
