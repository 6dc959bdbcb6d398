#!/bin/sh
# Issue 43's measurements, in one command, for a quiet machine (nothing else running: each JSON records
# the load, and machine.busy says when it was above the cores). About 5-6 hours on this project's 2-core
# CPU; each step writes its own JSON, so a stopped run keeps what finished. Run from the repository root:
#
#     sh benchmarks/issue43_quiet.sh
#
# 1. never slower than plain Optuna: every shipped space at its own budget, 3 seeds (~30 min);
# 2. PBT like for like: pbt, tpe, plain, Ray async and sync, 5 seeds (~30-40 min);
# 3. asking in batches: the shipped pool (16) vs a pool of 6 vs no constant liar, at 48 trials (~1 h);
# 4. where training dominates: the CNN space, 48 trials x 20 epochs on 20,000 samples, 5 seeds (81 min on 2026-11-28).
set -eu
out=benchmarks/results
python -m benchmarks.never_slower --out "$out/never-slower.json"
python -m benchmarks.pbt --out "$out/pbt.json"
python -m benchmarks.ask_batch --n-trials 48 --set training.epochs=15 --pools 6 --out "$out/ask-batch.json"
python -m benchmarks.search --long --out "$out/search-long.json" --plot "$out/search-long.png"
