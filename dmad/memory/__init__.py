"""Memory: scoped readings (framework / device-wide / process, never mixed) and the ledger that
estimates a run's peak before it starts. `dmad probe` measures it (dmad.train.probe): a probe
point runs the training loop, so it lives with training."""
