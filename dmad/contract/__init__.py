"""The contract between the engine, the app and users' own scripts: the run config, the event
protocol, prompt sets, dataset lists, the run folder and its logs, resource paths and JSON files.

Torch-free, and the only part of dmad (with dmad.errors) that the app imports.
"""
