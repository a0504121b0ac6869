"""DMAD Studio engine: distils a diffusion teacher into a 1-4 step student.

The app imports only dmad.contract and dmad.errors (pyproject.toml, import-linter contracts);
they are torch-free and import fast.
"""
__version__ = "0.1.0"
