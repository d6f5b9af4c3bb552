"""A character-level tokenizer: every printable ASCII character is one token.

What it teaches: the engine only ever sees integer token ids; this file is the whole map between
text and ids for the tiny model. Character level keeps the model small (100 ids) and means any
printable prompt has tokens, even characters the training corpus never used, so a user can type
anything and get a (possibly silly) completion rather than an error.

The vocabulary, in id order:

    0 <pad>   never produced; fills nothing in this project but keeps id 0 meaningless
    1 <bos>   prepended to every prompt, so position 0 is always the same token
    2 <eos>   the model emits it when a completion ends; generation stops there
    3 '\\t', 4 '\\n', then ' ' (5) ... '~' (99): the 95 printable ASCII characters

Read next: corpus.py (the text the model learns from), then decoder.py.
"""

from __future__ import annotations

import string

PAD, BOS, EOS = 0, 1, 2
SPECIALS = ("<pad>", "<bos>", "<eos>")
# '\t' and '\n' first, then chr(32) .. chr(126) in ASCII order.
CHARS = "\t\n" + "".join(chr(c) for c in range(32, 127))
VOCAB_SIZE = len(SPECIALS) + len(CHARS)  # 100

_CHAR_TO_ID = {ch: i + len(SPECIALS) for i, ch in enumerate(CHARS)}
_ID_TO_TEXT = SPECIALS + tuple(CHARS)
assert set(CHARS) >= set(string.digits + string.ascii_letters + string.punctuation + " \n")


class CharTokenizer:
    """Maps text to token ids and back; ``encode`` rejects characters outside printable ASCII."""

    vocab_size = VOCAB_SIZE
    pad_id, bos_id, eos_id = PAD, BOS, EOS
    eos_ids = frozenset({EOS})

    def encode(self, text: str, *, bos: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        ids = [BOS] if bos else []
        for i, ch in enumerate(text):
            tid = _CHAR_TO_ID.get(ch)
            if tid is None:
                raise ValueError(
                    f"text[{i}] = {ch!r} is not a printable ASCII character (nor tab/newline); "
                    "the character-level vocabulary covers chr(32)..chr(126), '\\t' and '\\n'")
            ids.append(tid)
        return ids

    def decode(self, ids, *, skip_special: bool = True) -> str:
        out = []
        for tid in map(int, ids):
            if not 0 <= tid < VOCAB_SIZE:
                raise ValueError(f"token id {tid} is out of range [0, {VOCAB_SIZE})")
            if not (skip_special and tid < len(SPECIALS)):
                out.append(_ID_TO_TEXT[tid])
        return "".join(out)


TOKENIZER_API = ("encode", "decode", "vocab_size", "eos_id", "eos_ids")  # HFTokenizer's too


def check_tokenizer(tokenizer: object) -> object:
    """``tokenizer``, or a CharTokenizer for None; a TypeError for an object without the API."""
    missing = [a for a in TOKENIZER_API if not hasattr(tokenizer, a)]
    if tokenizer is not None and missing:
        lacks = f" without {', '.join(missing)}" if len(missing) < len(TOKENIZER_API) else ""
        raise TypeError(f"tokenizer={tokenizer!r:.60} must be a tokenizer (with "
                        f"{', '.join(TOKENIZER_API)}), got {type(tokenizer).__name__}{lacks}")
    return CharTokenizer() if tokenizer is None else tokenizer


def prompt_ids(tokenizer, prompt, i: int, max_seq_len: int) -> list[int]:
    """prompts[i] as token ids, shorter than max_seq_len: a str is encoded (with <bos>), a list
    of ints is taken as the ids themselves (tokenized elsewhere, e.g. a chat template)."""
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt)
    elif not isinstance(prompt, (list, tuple)) or not prompt or any(
            isinstance(t, bool) or not isinstance(t, int) for t in prompt):
        raise TypeError(f"prompts[{i}] must be a str or a non-empty list of token ids (ints), "
                        f"got {prompt!r:.60}")
    else:
        ids = list(prompt)
    if (bad := next((t for t in ids if not 0 <= t < tokenizer.vocab_size), None)) is not None:
        raise ValueError(f"prompts[{i}] holds token id {bad}, outside [0, {tokenizer.vocab_size})")
    if len(ids) >= max_seq_len:
        raise ValueError(f"prompts[{i}] has {len(ids)} tokens (with any special tokens); expected "
                         f"at most {max_seq_len - 1}, one less than max_seq_len={max_seq_len}")
    return ids


def encode_prompts(tokenizer, prompts, max_seq_len: int) -> tuple[list[str], list[list[int]]]:
    """(text, token ids) of each prompt; ``prompts`` is one str or a non-empty list of them (or
    of token-id lists, whose text is decoded with the special tokens shown)."""
    if isinstance(prompts, str):
        prompts = [prompts]
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError(f"prompts must be a non-empty list of strings, got {prompts!r:.80}")
    ids = [prompt_ids(tokenizer, p, i, max_seq_len) for i, p in enumerate(prompts)]
    return [p if isinstance(p, str) else tokenizer.decode(p, skip_special=False)
            for p in prompts], ids
