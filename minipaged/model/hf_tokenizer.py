"""The tokenizer of a Hugging Face model directory, and its chat template.

What it teaches: the engine never sees text. A real tokenizer (byte-level BPE for Llama 3,
Qwen and SmolLM2) maps text to ids through the ``tokenizers`` library and tokenizer.json, which
also says which special tokens to add (Llama 3 prepends <|begin_of_text|>; Qwen and SmolLM2
add nothing). Generation ends at any of the model's end-of-sequence ids: config.json and
generation_config.json may each give one or a list (Llama 3.2 Instruct lists three).

A chat model expects its conversation wrapped in the markers it was tuned on
(``<|im_start|>user ... <|im_end|>`` for Qwen and SmolLM2). The wrapping is a Jinja template
shipped with the model, in tokenizer_config.json ("chat_template") or chat_template.jinja;
``chat_prompt`` renders it the way transformers' ``apply_chat_template`` does (a sandboxed
Jinja environment with trim_blocks and lstrip_blocks; transformers: utils/chat_template_utils.py)
and the result is tokenized without adding special tokens again (the template wrote them).

The same interface as tokenizer.CharTokenizer: ``encode(text, bos=True)``, ``decode(ids)``,
``vocab_size``, ``eos_id`` (the first end id; beam search uses it) and ``eos_ids`` (all of them).

Read before: hf.py. Read next: engine.py.
"""

from __future__ import annotations

import json
from pathlib import Path


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def _token_text(tok) -> str | None:
    """tokenizer_config.json writes a special token as a string or as {"content": ...}."""
    return tok.get("content") if isinstance(tok, dict) else tok


def _as_ids(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


class HFTokenizer:
    def __init__(self, model_dir: str | Path):
        from tokenizers import Tokenizer

        d = Path(model_dir)
        path = d / "tokenizer.json"
        if not path.exists():
            raise FileNotFoundError(f"{str(d)!r} has no tokenizer.json (the fast-tokenizer "
                                    "file; sentencepiece .model files alone are not read)")
        self._tok = Tokenizer.from_file(str(path))
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.config = _read_json(d / "tokenizer_config.json")
        self.special = {k: _token_text(self.config.get(k)) for k in ("bos_token", "eos_token")}
        ends = _as_ids(_read_json(d / "config.json").get("eos_token_id"))
        ends += _as_ids(_read_json(d / "generation_config.json").get("eos_token_id"))
        if not ends and self.special["eos_token"] is not None:
            tid = self._tok.token_to_id(self.special["eos_token"])
            ends = [] if tid is None else [tid]
        self.eos_ids = frozenset(ends)
        self.eos_id = ends[0] if ends else None
        template = self.config.get("chat_template")
        if isinstance(template, list):   # named templates: [{"name": ..., "template": ...}]
            template = {t["name"]: t["template"] for t in template}.get("default")
        if template is None and (d / "chat_template.jinja").exists():
            template = (d / "chat_template.jinja").read_text()
        self.chat_template: str | None = template

    def encode(self, text: str, *, bos: bool = True) -> list[int]:
        """Token ids of ``text``; ``bos`` adds the special tokens tokenizer.json asks for."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self._tok.encode(text, add_special_tokens=bos).ids

    def decode(self, ids, *, skip_special: bool = True) -> str:
        return self._tok.decode([int(t) for t in ids], skip_special_tokens=skip_special)

    def chat_prompt(self, user_text: str) -> str:
        """``user_text`` as one user turn of a conversation, ready for the assistant's answer."""
        if self.chat_template is None:
            raise ValueError("this model has no chat template (none in tokenizer_config.json "
                             "or chat_template.jinja): run it without --chat")
        try:
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError as e:
            raise ValueError("chat templates need jinja2: pip install 'minipaged[hf]'") from e

        def raise_exception(message):
            raise ValueError(f"the chat template refused the conversation: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
        return env.from_string(self.chat_template).render(
            messages=[{"role": "user", "content": user_text}], add_generation_prompt=True,
            bos_token=self.special["bos_token"] or "", eos_token=self.special["eos_token"] or "")
