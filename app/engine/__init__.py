"""Everything the app runs off its GUI thread: any `dmad` command line in a QProcess (command), `dmad
train` on top of it (process), a run's events.jsonl followed live (follow) and plain functions in a
thread pool (background)."""
