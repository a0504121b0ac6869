"""`dmad train`: the loop (loop), what it holds (session, built by build), one DMAD iteration
(step), the checks before anything loads (preflight), process plumbing (launch, ranks, monitor,
env), out-of-memory triage (oom) and `dmad probe` (probe, probe_point)."""
