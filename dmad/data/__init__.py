"""Training data and its checks: aspect buckets, dataset mixing, loading, encoding with the latent
cache (`dmad cache`), and `dmad check-data` (check, check_items, check_fast, check_report).

check*, buckets, mixing and scan are torch-free; loading, encode and latent_cache import torch.
"""
