"""DMAD Studio engine: distils a diffusion teacher into a 1-4 step student.

Only dmad.config, dmad.events, dmad.runs and dmad.prompts may be imported by the app;
they are torch-free and import fast.
"""
__version__ = "0.1.0"
