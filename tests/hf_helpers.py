"""The tiny Hugging Face checkpoints the tests of tests/test_hf_model*.py load (their ``models``
fixture, in tests/conftest.py, builds one of each family once).

Nothing is downloaded: tiny random Llama, Qwen2 and Qwen3 models are built by transformers from
small configs (hidden 64, 2 layers, 4 query heads, 2 KV heads, vocabulary 300), saved with
save_pretrained into a temporary folder next to a byte-level BPE tokenizer trained here, and
loaded by minipaged.model.hf. Each family exercises its own switches: Llama with tied
embeddings and Llama 3 rope scaling (original context 64, so prompts of 100+ tokens reach the
stretched frequencies), Qwen2 with random q/k/v biases, Qwen3 with random QK-norm weights and a
head size (32) that is not hidden / heads (16). Every RMSNorm weight is randomised too, so a
swapped norm would show.

Weights are drawn with std 0.1 (transformers' default is 0.02): the logits then spread over a
few units, so the top two tokens of a greedy step differ by far more than fp32 rounding. With
std 0.02 a random model's logits are nearly flat and a greedy comparison would hinge on the
last bits of the arithmetic rather than on the implementation being right.
"""

from __future__ import annotations

import json

import torch
import transformers

CHAT_TEMPLATE = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + "
                 "'<|im_end|>\n' }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CORPUS = ["the paged cache keeps keys and values in blocks of sixteen tokens",
          "a block table maps logical blocks to physical blocks in the pool",
          "copy on write shares the prompt between parallel samples until one writes",
          "when the pool runs out the scheduler preempts the newest request",
          "prefix caching finds full blocks by the hash of their tokens"] * 4


def _tokenizer(bos: bool):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>"]
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=290, special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    if bos:   # Llama 3 style: tokenizer.json itself prepends the begin-of-text token
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return tok


def _build(family: str, path, **overrides):
    cfg_cls, model_cls = {"llama": ("LlamaConfig", "LlamaForCausalLM"),
                          "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
                          "qwen3": ("Qwen3Config", "Qwen3ForCausalLM")}[family]
    tok = _tokenizer(bos=family == "llama")
    kw = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=128, vocab_size=300, max_position_embeddings=512,
              initializer_range=0.1, eos_token_id=tok.token_to_id("<|im_end|>"),
              bos_token_id=None, pad_token_id=None, tie_word_embeddings=False)
    if family == "llama":
        kw.update(tie_word_embeddings=True, rope_theta=500000.0, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    if family == "qwen3":
        kw.update(head_dim=32)
    kw.update(overrides)
    torch.manual_seed({"llama": 0, "qwen2": 1, "qwen3": 2}[family])
    hf = getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(**kw)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(1.0, 0.2)
            elif name.endswith(".bias"):
                p.normal_(0.0, 0.1)
    hf.save_pretrained(path)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
        "bos_token": "<s>" if family == "llama" else None, "chat_template": CHAT_TEMPLATE}))
    return hf


FAMILIES = ("llama", "qwen2", "qwen3")
