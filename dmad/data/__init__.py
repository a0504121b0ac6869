"""Training data and its checks: aspect buckets, dataset mixing, loading, encoding with the latent
cache (`dmad cache`), and `dmad check-data` (check_command, check, check_report, check_fast,
check_items).

check*, buckets, mixing and scan are torch-free; loading, encode and latent_cache import torch.
"""
