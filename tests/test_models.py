"""Built-in model families: shapes, config keys, determinism, errors, user factories."""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn

from hfta_nas.errors import HftaNasError
from hfta_nas.models import (
    FAMILIES,
    build_model,
    count_parameters,
    family_defaults,
    load_factory,
    model_factory,
)

MNIST1D = (1, 40)
DIGITS = (1, 8, 8)
TABULAR = (12,)

# Every family with each input shape it accepts.
CASES = [
    ("mlp", TABULAR),
    ("mlp", MNIST1D),
    ("mlp", DIGITS),
    ("cnn1d", MNIST1D),
    ("cnn2d", DIGITS),
    ("bn_cnn", MNIST1D),
    ("bn_cnn", DIGITS),
    ("gru", MNIST1D),
    ("gru", DIGITS),
]


def _count(model: nn.Module, kind: type[nn.Module]) -> int:
    return sum(isinstance(m, kind) for m in model.modules())


def _build(family: str, input_shape=MNIST1D, num_classes: int = 10, **config) -> nn.Module:
    return build_model(family, config, input_shape=input_shape, num_classes=num_classes)


# ----------------------------------------------------------------- defaults
def test_families_listed():
    assert FAMILIES == ("mlp", "cnn1d", "cnn2d", "bn_cnn", "gru")
    assert {family for family, _ in CASES} == set(FAMILIES)


@pytest.mark.parametrize("family,input_shape", CASES)
def test_defaults_forward_and_backward(family, input_shape):
    torch.manual_seed(0)
    model = build_model(family, None, input_shape=input_shape, num_classes=7)
    x = torch.randn(5, *input_shape)
    logits = model(x)
    assert logits.shape == (5, 7)
    logits.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("family", FAMILIES)
def test_family_defaults_is_the_full_config(family):
    defaults = family_defaults(family)
    assert defaults  # every family has keys
    input_shape = TABULAR if family == "mlp" else (DIGITS if family == "cnn2d" else MNIST1D)
    torch.manual_seed(0)
    a = build_model(family, defaults, input_shape=input_shape, num_classes=3)
    torch.manual_seed(0)
    b = build_model(family, {}, input_shape=input_shape, num_classes=3)
    assert repr(a) == repr(b)
    defaults[next(iter(defaults))] = "mutated"  # a copy: the next call is unaffected
    assert family_defaults(family) != defaults


def test_default_values():
    assert family_defaults("mlp") == {"depth": 2, "width": 128, "activation": "relu", "dropout": 0.0, "norm": "none"}
    assert family_defaults("cnn1d")["channels"] == [32, 32, 32] and family_defaults("cnn1d")["kernel_size"] == 5
    assert family_defaults("cnn2d")["channels"] == [16, 32] and family_defaults("cnn2d")["kernel_size"] == 3
    assert family_defaults("bn_cnn")["norm"] == "batch"
    assert family_defaults("gru") == {"hidden": 64, "layers": 1, "bidirectional": False, "dropout": 0.0, "cell": "gru"}


# ---------------------------------------------------------- every key matters
def test_mlp_keys():
    assert _count(_build("mlp", TABULAR, depth=0), nn.Linear) == 1
    assert _count(_build("mlp", TABULAR, depth=3), nn.Linear) == 4
    model = _build("mlp", TABULAR, width=17)
    assert model.fc0.out_features == 17
    assert _count(_build("mlp", TABULAR, activation="gelu"), nn.GELU) == 2
    assert _count(_build("mlp", TABULAR, activation="tanh"), nn.Tanh) == 2
    assert _count(_build("mlp", TABULAR, activation="silu"), nn.SiLU) == 2
    assert _count(_build("mlp", TABULAR), nn.Dropout) == 0  # p == 0: no module at all
    assert _count(_build("mlp", TABULAR, dropout=0.2), nn.Dropout) == 2
    assert _count(_build("mlp", TABULAR, norm="batch"), nn.BatchNorm1d) == 2
    assert _count(_build("mlp", TABULAR, norm="layer"), nn.LayerNorm) == 2
    assert _count(_build("mlp", TABULAR), nn.BatchNorm1d) + _count(_build("mlp", TABULAR), nn.LayerNorm) == 0


@pytest.mark.parametrize("family,input_shape", [("cnn1d", MNIST1D), ("cnn2d", DIGITS), ("bn_cnn", MNIST1D)])
def test_conv_keys(family, input_shape):
    conv = nn.Conv1d if len(input_shape) == 2 else nn.Conv2d
    model = _build(family, input_shape, channels=[4, 6, 8])
    convs = [m for m in model.modules() if isinstance(m, conv)]
    assert [c.out_channels for c in convs] == [4, 6, 8]
    assert _build(family, input_shape, kernel_size=1).conv0.kernel_size[0] == 1
    strided = _build(family, input_shape, stride=2)
    assert strided.conv0.stride[0] == 2 and strided.conv1.stride[0] == 1
    assert _build(family, input_shape, padding="valid").conv0.padding[0] == 0
    assert _build(family, input_shape, padding=2).conv0.padding[0] == 2
    assert _build(family, input_shape, kernel_size=5).conv0.padding[0] == 2  # "same": kernel_size // 2
    assert _count(_build(family, input_shape, activation="silu"), nn.SiLU) == len(family_defaults(family)["channels"])
    assert _count(_build(family, input_shape, pool="max"), (nn.MaxPool1d, nn.MaxPool2d)) > 0
    assert _count(_build(family, input_shape, pool="avg"), (nn.AvgPool1d, nn.AvgPool2d)) > 0
    assert _count(_build(family, input_shape, dropout=0.3), nn.Dropout) > 0
    assert _count(_build(family, input_shape, dropout=0.0), nn.Dropout) == 0
    group = _build(family, input_shape, norm="group", channels=[6, 7])
    assert [m.num_groups for m in group.modules() if isinstance(m, nn.GroupNorm)] == [3, 1]
    assert _count(_build(family, input_shape, norm="batch"), (nn.BatchNorm1d, nn.BatchNorm2d)) > 0
    assert _count(_build(family, input_shape, norm="none"), (nn.BatchNorm1d, nn.BatchNorm2d)) == 0
    assert _count(_build(family, input_shape, head="avg"), (nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d)) == 1
    # Flatten head sees every position; pooling shrinks it.
    assert _build(family, input_shape, pool="max").head.in_features < _build(family, input_shape).head.in_features


def test_bn_cnn_picks_conv_by_rank_and_has_batch_norm():
    assert _count(_build("bn_cnn", MNIST1D), nn.BatchNorm1d) == 2 and _count(_build("bn_cnn", MNIST1D), nn.Conv1d) == 2
    assert _count(_build("bn_cnn", DIGITS), nn.BatchNorm2d) == 2 and _count(_build("bn_cnn", DIGITS), nn.Conv2d) == 2


def test_gru_keys():
    model = _build("gru", MNIST1D, hidden=9, layers=2)
    assert isinstance(model.rnn, nn.GRU) and model.rnn.hidden_size == 9 and model.rnn.num_layers == 2
    assert model.rnn.input_size == 1  # (C, L): L steps of C features
    assert _build("gru", DIGITS).rnn.input_size == 8  # (1, H, W): H steps of W features
    assert _build("gru", (3, 40)).rnn.input_size == 3
    assert isinstance(_build("gru", cell="lstm").rnn, nn.LSTM)
    bi = _build("gru", bidirectional=True, hidden=5)
    assert bi.rnn.bidirectional and bi.head.in_features == 10
    assert _count(_build("gru"), nn.Dropout) == 0
    dropped = _build("gru", dropout=0.25, layers=2)
    assert _count(dropped, nn.Dropout) == 1 and dropped.rnn.dropout == 0.25
    assert _build("gru", dropout=0.25, layers=1).rnn.dropout == 0.0  # nothing between layers


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_bidirectional_head_reads_each_directions_final_state(cell):
    torch.manual_seed(0)
    model = _build("gru", MNIST1D, bidirectional=True, layers=2, hidden=4, cell=cell).eval()
    x = torch.randn(3, *MNIST1D)
    _, state = model.rnn(x.transpose(1, 2))
    h_n = state[0] if cell == "lstm" else state
    final = torch.cat([h_n[-2], h_n[-1]], dim=1)  # last layer: forward, backward
    torch.testing.assert_close(model(x), model.head(final))


def test_eval_mode_is_deterministic_and_dropout_trains():
    torch.manual_seed(0)
    model = _build("mlp", TABULAR, dropout=0.5)
    x = torch.randn(4, *TABULAR)
    model.eval()
    torch.testing.assert_close(model(x), model(x))
    model.train()
    assert not torch.equal(model(x), model(x))


# ----------------------------------------------------- determinism and shapes
@pytest.mark.parametrize("family,input_shape", CASES)
def test_same_seed_same_state_dict(family, input_shape):
    config = {"dropout": 0.1}
    torch.manual_seed(123)
    a = build_model(family, config, input_shape=input_shape, num_classes=4)
    torch.manual_seed(123)
    b = model_factory(family, config, input_shape=input_shape, num_classes=4)()
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key
    torch.manual_seed(7)
    c = build_model(family, config, input_shape=input_shape, num_classes=4)
    assert [(n, p.shape) for n, p in a.named_parameters()] == [(n, p.shape) for n, p in c.named_parameters()]
    assert [(n, b.shape) for n, b in a.named_buffers()] == [(n, b.shape) for n, b in c.named_buffers()]
    assert any(not torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters()))


def test_model_factory_does_not_touch_the_rng():
    torch.manual_seed(0)
    before = torch.get_rng_state()
    factory = model_factory("cnn1d", {"channels": [8]}, input_shape=MNIST1D, num_classes=10)
    assert torch.equal(before, torch.get_rng_state())
    assert "cnn1d" in repr(factory)
    assert factory()(torch.randn(2, *MNIST1D)).shape == (2, 10)


def test_count_parameters():
    model = _build("mlp", (3,), num_classes=2, depth=1, width=4)
    assert count_parameters(model) == (3 * 4 + 4) + (4 * 2 + 2)
    model.head.weight.requires_grad_(False)
    assert count_parameters(model, trainable_only=True) == (3 * 4 + 4) + 2


def test_accepts_tuples_lists_and_numpy_scalars():
    np = pytest.importorskip("numpy")
    model = build_model(
        "cnn1d", {"channels": (4, np.int64(6)), "dropout": np.float64(0.1)}, input_shape=[1, 40], num_classes=3
    )
    assert model.conv1.out_channels == 6


# ----------------------------------------------------------------- the array
@pytest.mark.parametrize("family,input_shape", CASES[2:])
def test_slots_of_an_array_match_models_alone(family, input_shape):
    """Families fuse: each slot of a ModelArray computes what its model computes alone."""
    from hfta_nas import ModelArray

    config = {"norm": "batch"} if family in ("mlp", "cnn1d", "cnn2d") else {}
    factory = model_factory(family, config, input_shape=input_shape, num_classes=5)
    array = ModelArray.from_factory(factory, seeds=[1, 2]).eval()
    x = torch.randn(3, *input_shape)
    fused = array(x, shared_input=True)
    for slot, seed in enumerate([1, 2]):
        torch.manual_seed(seed)
        alone = factory().eval()
        torch.testing.assert_close(fused[slot], alone(x), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------- errors
def test_unknown_family_lists_families():
    with pytest.raises(HftaNasError) as info:
        build_model("resnet", {}, input_shape=DIGITS, num_classes=10)
    assert "resnet" in str(info.value)
    assert all(name in str(info.value) for name in FAMILIES)
    with pytest.raises(HftaNasError, match="mlp, cnn1d"):
        family_defaults("transformer")
    with pytest.raises(HftaNasError, match="Did you mean 'cnn1d'"):
        model_factory("cnn1", {}, input_shape=MNIST1D, num_classes=10)


def test_unknown_key_is_named():
    with pytest.raises(HftaNasError) as info:
        build_model("mlp", {"widht": 64}, input_shape=TABULAR, num_classes=3)
    message = str(info.value)
    assert "'mlp'" in message and "'widht'" in message and "did you mean 'width'" in message
    assert "allowed keys: depth, width, activation, dropout, norm" in message


@pytest.mark.parametrize(
    "family,config,key",
    [
        ("mlp", {"depth": "two"}, "depth"),
        ("mlp", {"depth": True}, "depth"),
        ("mlp", {"width": 12.5}, "width"),
        ("mlp", {"depth": -1}, "depth"),
        ("mlp", {"dropout": 1.0}, "dropout"),
        ("mlp", {"dropout": "0.1"}, "dropout"),
        ("mlp", {"norm": "group"}, "norm"),
        ("cnn1d", {"channels": 32}, "channels"),
        ("cnn1d", {"channels": []}, "channels"),
        ("cnn1d", {"channels": [8, 0]}, "channels[1]"),
        ("cnn1d", {"padding": "full"}, "padding"),
        ("cnn2d", {"pool": "min"}, "pool"),
        ("cnn2d", {"norm": "layer"}, "norm"),
        ("gru", {"bidirectional": "yes"}, "bidirectional"),
        ("gru", {"cell": "rnn"}, "cell"),
        ("gru", {"layers": 0}, "layers"),
    ],
)
def test_bad_value_names_family_and_key(family, config, key):
    input_shape = DIGITS if family == "cnn2d" else MNIST1D
    with pytest.raises(HftaNasError) as info:
        model_factory(family, config, input_shape=input_shape, num_classes=3)
    assert f"'{family}'" in str(info.value) and f"key '{key}'" in str(info.value)


def test_activation_error_lists_allowed_values():
    with pytest.raises(HftaNasError) as info:
        build_model("cnn1d", {"activation": "sigmoid"}, input_shape=MNIST1D, num_classes=3)
    message = str(info.value)
    assert "key 'activation'" in message and "'sigmoid'" in message
    assert all(name in message for name in ("relu", "gelu", "tanh", "silu"))


def test_config_must_be_a_mapping():
    with pytest.raises(HftaNasError, match="mapping"):
        build_model("mlp", [("depth", 2)], input_shape=TABULAR, num_classes=3)


@pytest.mark.parametrize(
    "family,input_shape",
    [
        ("cnn1d", TABULAR),
        ("cnn1d", DIGITS),
        ("cnn2d", MNIST1D),
        ("bn_cnn", TABULAR),
        ("gru", TABULAR),
        ("gru", (3, 8, 8)),
    ],
)
def test_input_shape_of_wrong_rank(family, input_shape):
    with pytest.raises(HftaNasError) as info:
        model_factory(family, {}, input_shape=input_shape, num_classes=3)
    assert f"'{family}'" in str(info.value) and str(input_shape) in str(info.value)


@pytest.mark.parametrize("input_shape,num_classes", [((), 3), ((0, 4), 3), ("1,40", 3), ((1, 40), 0), ((1, 40), 2.0)])
def test_bad_shapes_or_classes(input_shape, num_classes):
    with pytest.raises(HftaNasError):
        build_model("mlp", {}, input_shape=input_shape, num_classes=num_classes)


def test_too_many_pooling_layers_names_the_key():
    with pytest.raises(HftaNasError) as info:
        model_factory("cnn1d", {"channels": [4] * 6, "pool": "max"}, input_shape=(1, 16), num_classes=3)
    assert "key 'pool'" in str(info.value) and "channels" in str(info.value)
    # One fewer fits: 16 -> 8 -> 4 -> 2 -> 1 is four pooled layers.
    assert _build("cnn1d", (1, 16), channels=[4] * 4, pool="max").head.in_features == 4
    with pytest.raises(HftaNasError, match="key 'pool'"):
        model_factory("cnn2d", {"channels": [4] * 4, "pool": "avg"}, input_shape=DIGITS, num_classes=3)


def test_kernel_larger_than_input_without_padding():
    with pytest.raises(HftaNasError, match="kernel_size"):
        model_factory("cnn1d", {"kernel_size": 9, "padding": "valid"}, input_shape=(1, 8), num_classes=3)


# ------------------------------------------------------------ user factories
@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """A cwd holding user model files; sys.path / sys.modules restored afterwards."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    imported_before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - imported_before:
        del sys.modules[name]


def test_load_factory_from_cwd(user_dir):
    (user_dir / "hnas_user_models_ok.py").write_text(
        "import torch\n"
        "def build(num_classes=3):\n"
        "    return torch.nn.Linear(4, num_classes)\n"
        "class Net(torch.nn.Linear):\n"
        "    def __init__(self):\n"
        "        super().__init__(4, 2)\n"
    )
    build = load_factory("hnas_user_models_ok:build")
    assert isinstance(build(num_classes=5), nn.Linear) and build(num_classes=5).out_features == 5
    assert load_factory("hnas_user_models_ok:Net")().out_features == 2
    assert load_factory("hnas_user_models_ok.py:build")().out_features == 3  # by file path


def test_load_factory_missing_module(user_dir):
    with pytest.raises(HftaNasError) as info:
        load_factory("hnas_no_such_module:build")
    assert "hnas_no_such_module" in str(info.value) and str(user_dir) in str(info.value)
    with pytest.raises(HftaNasError, match="does not exist"):
        load_factory("missing_dir/models.py:build")


def test_load_factory_module_with_missing_dependency(user_dir):
    (user_dir / "hnas_user_models_dep.py").write_text("import hnas_not_installed_dep\n")
    with pytest.raises(HftaNasError, match="hnas_not_installed_dep"):
        load_factory("hnas_user_models_dep:build")


def test_load_factory_module_that_raises(user_dir):
    (user_dir / "hnas_user_models_bad.py").write_text("raise RuntimeError('boom')\n")
    with pytest.raises(HftaNasError, match="RuntimeError: boom"):
        load_factory("hnas_user_models_bad:build")


def test_load_factory_missing_function(user_dir):
    (user_dir / "hnas_user_models_nofn.py").write_text("def make():\n    pass\n")
    with pytest.raises(HftaNasError) as info:
        load_factory("hnas_user_models_nofn:build")
    assert "'build'" in str(info.value) and "make" in str(info.value)


def test_load_factory_not_callable(user_dir):
    (user_dir / "hnas_user_models_value.py").write_text("build = 3\n")
    with pytest.raises(HftaNasError, match="not callable"):
        load_factory("hnas_user_models_value:build")


@pytest.mark.parametrize("path", ["hnas_user_models", "hnas_user_models:", ":build", 42])
def test_load_factory_bad_format(path):
    with pytest.raises(HftaNasError, match="module:function"):
        load_factory(path)
