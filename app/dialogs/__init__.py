"""Windows and dialogs opened from a panel: the A/B view, close and launch questions, the config
diff and the prompt-set editor."""
