"""Tokenizers built locally, with nothing to download: a byte-level CLIP vocabulary and a
character-level T5 tokenizer. The built-in demo teacher and the tests' tiny pipelines use them."""
from __future__ import annotations


def byte_level_vocab() -> dict[str, int]:
    """GPT-2 / CLIP byte-to-unicode table: 256 printable stand-ins, each alone and word-final."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    chars = [chr(c) for c in cs]
    vocab = {c: i for i, c in enumerate(chars)}
    vocab.update({c + "</w>": 256 + i for i, c in enumerate(chars)})
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    return vocab


_T5_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;:!?'\"-_()[]/&+*=#%@<>"


def tiny_t5_tokenizer(model_max_length: int = 16):
    """A T5TokenizerFast (the tokenizers-backed T5 tokenizer) over single characters, built locally.

    Unigram vocabulary: <pad>=0, </s>=1, <unk>=2, "▁", then every character of _T5_CHARS alone and
    with the "▁" word-start marker. No sentinel tokens (extra_ids=0). Round-trips through
    save_pretrained / from_pretrained(local_files_only=True)."""
    from transformers import T5TokenizerFast

    vocab: list[tuple[str, float]] = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    vocab += [(c, -3.0) for c in _T5_CHARS]
    vocab += [("\u2581" + c, -2.5) for c in _T5_CHARS]
    return T5TokenizerFast(vocab=vocab, extra_ids=0, model_max_length=model_max_length)
