"""Journal file vs SQLite: write cost per trial and concurrent safety (4 processes).

Run: python benchmarks/storage.py (writes to /tmp/hfta-nas-storage-bench)."""

import multiprocessing as mp
import time

import optuna

optuna.logging.set_verbosity(optuna.logging.WARNING)


def storage(kind):
    if kind == "sqlite":
        return "sqlite:////tmp/hfta-nas-storage-bench/s.db"
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return JournalStorage(JournalFileBackend("/tmp/hfta-nas-storage-bench/j.log"))


def work(kind, n, name):
    st = optuna.load_study(study_name=name, storage=storage(kind))
    for _ in range(n):
        t = st.ask()
        x = t.suggest_float("x", 0, 1)
        for e in range(10):
            t.report(x * e, e)
            t.set_user_attr("hb", time.time())
        st.tell(t, x)


if __name__ == "__main__":
    import os
    import shutil

    shutil.rmtree("/tmp/hfta-nas-storage-bench", ignore_errors=True)
    os.makedirs("/tmp/hfta-nas-storage-bench")
    for kind in ["journal", "sqlite"]:
        for workers in [1, 4]:
            name = f"{kind}{workers}"
            optuna.create_study(study_name=name, storage=storage(kind), sampler=optuna.samplers.RandomSampler())
            t0 = time.time()
            ps = [mp.Process(target=work, args=(kind, 32 // workers * 0 + 32, name)) for _ in range(workers)]
            [p.start() for p in ps]
            [p.join() for p in ps]
            dt = time.time() - t0
            n = len(optuna.load_study(study_name=name, storage=storage(kind)).trials)
            print(
                f"{kind:8s} workers={workers} trials={n} (expected {32 * workers}) "
                f"exitcodes={[p.exitcode for p in ps]} {dt:.2f}s  {dt / (32 * workers) * 1000:.1f} ms/trial(21 writes)"
            )
