"""One module per tab of the main window: Config, Data, Training, Samples, Runs, Memory (and its
probe)."""
