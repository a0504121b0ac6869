"""The app's data, without widgets: metric series, the samples index, run scans, the config document
and diff, data-check reports, presets, probe results and the thumbnail cache."""
