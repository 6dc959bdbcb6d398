"""The largest budgets a run takes. Past them a value is a slip of the keyboard (1e9 epochs,
2**70 trials, an array of a million models) that would run until killed, or fail deep inside
torch after the study was written; each is refused in one line before anything is stored."""

MAX_EPOCHS = 1_000_000  # a million passes over the data: years of training for any dataset worth searching
MAX_TRIALS = 10_000_000  # an Optuna storage keeps every trial; ten million fill gigabytes of journal
MAX_ARRAY_SIZE = 4096  # slots per array; throughput stops rising long before (the measured knee is <= 64 here)
MAX_BATCH_SIZE = 2**24  # samples per batch; a larger batch is a typo (1e12 tried to allocate 160 TB)
MAX_STORAGE_PATIENCE_S = 7 * 24 * 3600.0  # how long a worker waits for its storage to come back: a week
DEFAULT_STORAGE_PATIENCE_S = 600.0  # rides out a database restart or failover; a longer outage needs a person
