"""The tokenizer a GGUF file describes: byte-level BPE (``tokenizer.ggml.model = gpt2``) and its chat template.

Built as transformers builds it from the same file (``integrations/gguf/gguf_tokenizer_mapping.py``), with the
``tokenizers`` package: a BPE over the file's tokens and merges, GPT-2's ByteLevel pre-tokenizer (no prefix space)
and decoder, control tokens (type 3) added as special and user-defined ones (type 4) as added tokens, matched
whole. The chat template is rendered by jinja2 as transformers renders it (``chat_template_utils.py``). What
differs: a pre-tokenizer other than GPT-2's gets a ValueError; digits are not split one by one (llama.cpp's
``smollm``), which agrees where the vocabulary holds single digits only (SmolLM2's).
"""

import json

import numpy as np

from .gguf import read, require

CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types (tokenizer.ggml.token_type)
GPT2_PRE = {None, "default", "gpt2", "smollm", "starcoder"}  # pre-tokenizers that transformers splits by GPT-2's regex


class Tokenizer:
    """Text <-> token ids of a GGUF file's byte-level BPE (the module's contract); ``from_gguf`` builds one."""

    def __init__(self, backend, chat_template=None, special_tokens=None):
        self.backend = backend  # a tokenizers.Tokenizer
        self.chat_template = chat_template
        self.special_tokens = dict(special_tokens or {})  # bos_token, eos_token, ...: the template's variables
        self.eos_token_id = backend.token_to_id(self.special_tokens.get("eos_token") or "")

    @classmethod
    def from_gguf(cls, path):
        """The tokenizer of ``path``; ValueError naming the path for another tokenizer model or pre-tokenizer."""
        tokenizers = require("tokenizers")
        _, fields = read(path)
        model, pre = fields.get("tokenizer.ggml.model"), fields.get("tokenizer.ggml.pre")
        if model != "gpt2" or pre not in GPT2_PRE:
            raise ValueError(f"{path}: tokenizer.ggml.model is {model!r} and tokenizer.ggml.pre {pre!r}; only "
                             f"byte-level BPE ('gpt2') split by GPT-2's regex ({sorted(GPT2_PRE - {None})}) is supported")
        tokens, merges = fields["tokenizer.ggml.tokens"], fields.get("tokenizer.ggml.merges") or []
        backend = tokenizers.Tokenizer(tokenizers.models.BPE(
            vocab={token: i for i, token in enumerate(tokens)}, merges=[tuple(m.split(" ")) for m in merges]))
        backend.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = tokenizers.decoders.ByteLevel()
        types = fields.get("tokenizer.ggml.token_type") or []
        added = [tokenizers.AddedToken(token, normalized=False, special=kind == CONTROL)
                 for token, kind in zip(tokens, types) if kind in (CONTROL, USER_DEFINED)]
        backend.add_special_tokens([t for t in added if t.special])
        backend.add_tokens([t for t in added if not t.special])
        special = {name: tokens[fields[f"tokenizer.ggml.{key}_token_id"]]
                   for name, key in (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"),
                                     ("pad_token", "padding")) if f"tokenizer.ggml.{key}_token_id" in fields}
        return cls(backend, fields.get("tokenizer.chat_template"), special)

    def encode(self, text):
        """Token ids of ``text`` (str), special tokens in it matched whole; none is added."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self.backend.encode(text, add_special_tokens=False).ids

    def __call__(self, text, return_tensors=None):
        """Hugging Face's ``tokenizer(text)``: ``{"input_ids": ids, "attention_mask": ones}``, lists of ints for one
        str (:meth:`encode`'s ids), lists of such lists, unpadded, for a list of str; ``return_tensors="np"``: int64
        ``[B, T]`` arrays (B = 1 for a str; texts of one length: no padding here). TypeError, ValueError otherwise."""
        if return_tensors not in (None, "np"):
            raise ValueError(f"return_tensors must be None or 'np', got {return_tensors!r}")
        if isinstance(text, str):
            ids = self.encode(text)
            batch = {"input_ids": ids, "attention_mask": [1] * len(ids)}
        elif isinstance(text, (list, tuple)) and all(isinstance(t, str) for t in text):
            ids = [e.ids for e in self.backend.encode_batch(list(text), add_special_tokens=False)]
            batch = {"input_ids": ids, "attention_mask": [[1] * len(i) for i in ids]}
        else:
            raise TypeError(f"text must be a str or a list of str, got {text!r:.100}")
        if return_tensors is None:
            return batch
        rows = [ids] if isinstance(text, str) else ids
        if len({len(row) for row in rows}) > 1:
            raise ValueError(f"return_tensors='np' needs texts of one length in tokens, got {[len(r) for r in rows]} "
                             f"(this tokenizer does not pad)")
        ids = np.array(rows, np.int64).reshape(len(rows), len(rows[0]) if rows else 0)  # [B, T]
        return {"input_ids": ids, "attention_mask": np.ones_like(ids)}

    def decode(self, ids, skip_special_tokens=False):
        """The text of token ids ``ids``: an int, or one sequence of ints in [0, vocab size) (a list, a 1-D array);
        TypeError for several sequences (:meth:`batch_decode`), as Hugging Face's."""
        if np.ndim(ids) > 1:
            raise TypeError(f"ids must be one sequence of token ids, got shape {np.shape(ids)}: batch_decode decodes "
                            f"several")
        ids = [int(i) for i in np.atleast_1d(ids)]
        size = self.backend.get_vocab_size()
        if any(not 0 <= i < size for i in ids):
            raise ValueError(f"ids must lie in [0, {size}), got {min(ids)}..{max(ids)}")
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def batch_decode(self, sequences, skip_special_tokens=False):
        """:meth:`decode` of each sequence of ``sequences`` (``[B, T]``, or a list of lists): a list of str."""
        return [self.decode(ids, skip_special_tokens) for ids in sequences]

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
        """``messages`` (``[{"role": ..., "content": ...}, ...]``) rendered by the file's chat template: token ids,
        or with ``tokenize=False`` the text. ValueError where the file has no template; jinja2's TemplateError for a
        conversation the template refuses (its ``raise_exception``)."""
        if self.chat_template is None:
            raise ValueError("this tokenizer has no chat template (the file holds no tokenizer.chat_template)")
        if not isinstance(messages, (list, tuple)) or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages):
            raise TypeError(f"messages must be a list of {{'role': str, 'content': str}} dicts, got {messages!r:.100}")
        text = self._template().render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                       **self.special_tokens)
        return self.encode(text) if tokenize else text

    def _template(self):
        jinja2 = require("jinja2")
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise jinja2.TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
        env.globals["raise_exception"] = raise_exception
        return env.from_string(self.chat_template)
