"""Train CNNs of different widths and kernel sizes as ONE array, each exactly as alone.

    python examples/mixed_sizes.py

Nine architectures of the `cnn1d` family (channels x kernel size) go into one
ModelArray: each slot is padded into the envelope of all nine (the widest
channels, the largest kernel, smaller kernels centred), padded entries stay
exactly zero, and every slot ends where its own model would have ended.
"""

import torch

import hfta_nas
from hfta_nas.data import load_dataset
from hfta_nas.models import model_factory


def main() -> None:
    torch.set_num_threads(1)
    data = load_dataset("mnist1d", num_samples=2000)
    configs = [{"channels": c, "kernel_size": k} for c in ([16, 16], [32, 32], [16, 32]) for k in (3, 5, 7)]
    models = []
    for seed, config in enumerate(configs):
        torch.manual_seed(seed)  # slot `seed`'s initial weights, as its own model would draw them
        models.append(model_factory("cnn1d", config, input_shape=data.input_shape, num_classes=data.num_classes)())

    arr = hfta_nas.ModelArray(models)  # one structure, different sizes: padded into an envelope
    opt = hfta_nas.optim.Adam(arr, lr=3e-3)
    trainer = hfta_nas.ArrayTrainer(arr, opt, data, batch_size=100, data_seeds=range(len(models)))
    results = trainer.fit(epochs=3)  # the first call checks every slot against its own model

    print(arr.padding_cost())  # useful vs executed multiply-adds: what the padding costs
    for slot, config in enumerate(configs):
        print(f"{str(config):45s} val_acc {results[slot].final['val_acc']:.3f}")
    # Slot 0 back as its own, un-padded model:
    own = arr.to_module(
        0, model_factory("cnn1d", configs[0], input_shape=data.input_shape, num_classes=data.num_classes)()
    )
    print("slot 0 as a plain module:", sum(p.numel() for p in own.parameters()), "parameters")


if __name__ == "__main__":
    main()
