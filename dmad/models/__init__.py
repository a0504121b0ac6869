"""Model loading and construction (imports torch, diffusers, transformers).

teacher: inspect (configs and file headers only) and load a Stable Diffusion 1.x/2.x teacher
         from a diffusers folder or a single .safetensors file; never unpickles.
"""
