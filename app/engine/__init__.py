"""Everything the app runs off its GUI thread: the engine's commands in a QProcess (process), a run's
events.jsonl followed live (follow) and plain functions in a thread pool (background)."""
