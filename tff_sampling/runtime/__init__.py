"""The runtime: where a run lives and what runs it, below everything that trains.

`tff_context` installs this project's TFF execution context (secure sums simulated, local
workers stopped at exit) and the binaries' signal handling; `context_worker` is that context's
worker, restarted if it dies; `compilation` compiles what it
runs; `workers` and `processes` start TFF worker processes and children that die with their
parent; `run_dir` owns a run's directory (name, marker, lock, resume); `results` reads what a
run wrote (``hparams.json``, ``metrics.csv``) back as a `results.Run`; `files` and `sync`
write files whole and lock them, and `files` gives a binary a temporary directory of its own.
Its modules import only each other and `tff_sampling.validation`, never a layer above.
"""
