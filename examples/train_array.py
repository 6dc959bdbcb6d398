"""Quick start: train 8 CNNs on MNIST-1D as ONE fused array, each with its own
seed and learning rate, and print every slot's accuracy.

    python examples/train_array.py
"""

import torch

import hfta_nas
from hfta_nas.data import load_dataset
from hfta_nas.models import model_factory

torch.set_num_threads(1)  # small models on a shared CPU: one thread is fastest
data = load_dataset("mnist1d")  # generated offline, no download
factory = model_factory(
    "cnn1d", {"channels": [32, 32], "pool": "max"}, input_shape=data.input_shape, num_classes=data.num_classes
)

seeds = list(range(8))
lrs = [3e-4, 1e-3, 3e-3, 1e-2] * 2  # one learning rate per slot
array = hfta_nas.ModelArray.from_factory(factory, seeds=seeds)  # slot b = factory() after manual_seed(seeds[b])
optimizer = hfta_nas.optim.AdamW(array, lr=lrs, weight_decay=0.01)
schedule = hfta_nas.optim.LRSchedule(optimizer, "cosine", t_max=6, warmup_steps=1)
trainer = hfta_nas.ArrayTrainer(array, optimizer, data, batch_size=100, data_seeds=seeds, schedule=schedule)
results = trainer.fit(epochs=6)

for slot, result in results.items():
    print(
        f"slot {slot}: seed {seeds[slot]}, lr {lrs[slot]:.0e} -> val acc {result.final['val_acc']:.3f}, test "
        f"acc {result.final['test_acc']:.3f}"
    )

best = max(results, key=lambda s: results[s].final["val_acc"])
model = array.to_module(best, factory())  # a plain nn.Module, ready for torch.save
print(f"best slot {best}: {sum(p.numel() for p in model.parameters())} parameters")
