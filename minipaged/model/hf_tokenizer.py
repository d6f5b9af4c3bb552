"""The tokenizer of a Hugging Face model directory, and its chat template.

What it teaches: the engine never sees text. tokenizer.json (the ``tokenizers`` library) maps
text to ids and says which special tokens to add (Llama 3 prepends <|begin_of_text|>; Qwen and
SmolLM2 add none). Generation ends at any end id of config.json or generation_config.json.
A chat model expects its turns in the markers it was tuned on (``<|im_start|>user ...
<|im_end|>`` for Qwen and SmolLM2): a Jinja template in tokenizer_config.json or
chat_template.jinja, rendered here as transformers' ``apply_chat_template`` does (sandboxed,
trim_blocks and lstrip_blocks; transformers: utils/chat_template_utils.py) and encoded without
adding special tokens again. Same interface as tokenizer.CharTokenizer, plus ``eos_ids``.

Read before: hf.py. Read next: engine.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from minipaged.model.hf import CheckpointError, read_json


def _read_json(path: Path) -> dict:
    return read_json(path) if path.exists() else {}


class HFTokenizer:
    def __init__(self, model_dir: str | Path):
        from tokenizers import Tokenizer

        d = Path(model_dir)
        path = d / "tokenizer.json"
        if not path.exists():
            raise FileNotFoundError(f"{str(d)!r} has no tokenizer.json (the fast-tokenizer "
                                    "file; sentencepiece .model files alone are not read)")
        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as e:      # tokenizers raises a plain Exception for a file it cannot read
            raise CheckpointError(f"{path}: not a tokenizers file ({e})") from None
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.config = _read_json(d / "tokenizer_config.json")
        # a special token is written as a string or as {"content": ...}
        self.special = {k: v.get("content") if isinstance(v, dict) else v
                        for k, v in ((k, self.config.get(k)) for k in ("bos_token", "eos_token"))}
        ends = []                   # an int or a list in either file
        for name in ("config.json", "generation_config.json"):
            v = _read_json(d / name).get("eos_token_id")
            ends += [] if v is None else v if isinstance(v, list) else [v]
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
        from jinja2.sandbox import ImmutableSandboxedEnvironment  # torch depends on it too

        def raise_exception(message):
            raise ValueError(f"the chat template refused the conversation: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
        return env.from_string(self.chat_template).render(
            messages=[{"role": "user", "content": user_text}], add_generation_prompt=True,
            bos_token=self.special["bos_token"] or "", eos_token=self.special["eos_token"] or "")
