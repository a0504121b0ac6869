"""`dmad train`: the loop (loop), what it holds (session: run-folder I/O and the data stream;
trainer: the method's networks and optimizers; both built by build), checkpoints (saving), control
commands (control), samples (validation), the checks before anything loads (preflight), process
plumbing (launch, ranks, monitor, env), out-of-memory triage (oom) and `dmad probe` (probe,
probe_point). One iteration of a method is its unit's (dmad.methods)."""
