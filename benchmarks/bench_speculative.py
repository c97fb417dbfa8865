"""Speculative decoding experiment: prompt-lookup drafts on SmolLM2-135M-Instruct, each verified in one forward.

Two prompts, stored here as token ids (:data:`PROMPTS`: the file's chat template around the text in
:data:`PROMPT_TEXT`), each decoded greedily for :data:`NEW_TOKENS` tokens through static caches, one per
layer: ``copy``, whose answer writes out again the passage in the prompt, and ``story``, whose answer copies
nothing. The weights are bench_model's (:func:`bench_model.model_weights`: the real file where it is installed).
Before anything is measured, ``setup_cache`` checks at every point that the commit's prompt lookup gives plain
greedy's tokens, and on the real model that these are :data:`ANSWERS`. Where the file is absent, the drawn
weights decode :data:`STAND_IN`, a prompt that repeats itself, and only the first check is made.

- ``SpeculativeCounts``, exact, per prompt and k (``prompt_lookup_num_tokens``): forwards per generated token
  (1 for plain greedy) and the draft tokens accepted.
- ``SpeculativeRatios``, the copy prompt at k = 10: greedy / prompt lookup, the two whole ``generate`` calls
  (prefill included) timed in turns: the wall-clock speedup. The story's (0.80x [0.80, 0.81] at 226c6e7c,
  docs/results.md#speculative) is not timed per commit: its counts show no forward saved, and its pairs cost 20 s.

A commit without ``prompt_lookup_num_tokens`` skips (NotImplementedError).
"""

import functools
import inspect

import numpy as np

from . import bench_model
from .common import Measured, library_function

# The texts, and their ids in SmolLM2-135M-Instruct's chat template (kv.Tokenizer.from_gguf(file).apply_chat_template
# of one user message, its default system prompt included)
PASSAGE = ("Tom planted a small apple tree behind his house. Every morning he gave it water, and every evening he "
           "sat beside it to read. After three summers the tree gave its first apples, and Tom shared them with every "
           "child on his street.")
PROMPT_TEXT = {"copy": f"{PASSAGE}\n\nWrite the passage above again, exactly as it is.",
               "story": "Write a short story about a robot who learns to paint."}
SYSTEM = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712, 8182, 2,
          198, 1, 4093, 198]  # "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, ...<|im_end|>\n<|im_start|>user\n"
ASSISTANT = [2, 198, 1, 520, 9531, 198]  # "<|im_end|>\n<|im_start|>assistant\n"
PROMPTS = {
    "copy": SYSTEM + [24960, 10641, 253, 1165, 11977, 3187, 2893, 650, 2291, 30, 5081, 5738, 384, 4502, 357, 913, 28,
                      284, 897, 9053, 384, 2643, 19032, 357, 288, 1012, 30, 2550, 1296, 26191, 260, 3187, 4502, 624,
                      808, 13855, 28, 284, 8581, 3600, 601, 351, 897, 811, 335, 650, 7280, 30, 198, 198, 19161, 260,
                      7429, 2120, 1163, 28, 3869, 347, 357, 314, 30] + ASSISTANT,
    "story": SYSTEM + [19161, 253, 1890, 1977, 563, 253, 8085, 617, 17542, 288, 7670, 30] + ASSISTANT,
}
NEW_TOKENS = 16
# The greedy answers on the real file, this library's in float32 (4 December 2026): "Tom planted a small apple tree behind his
# house. Every morning," and "As the AI, AI-powered robot, "Pixel," began its journey of self"
ANSWERS = {
    "copy": [24960, 10641, 253, 1165, 11977, 3187, 2893, 650, 2291, 30, 5081, 5738, 28, 384, 4502, 357],
    "story": [1653, 260, 5646, 28, 5646, 29, 14519, 8085, 28, 476, 64, 32206, 1627, 2585, 624, 3444],
}
STAND_IN = (list(range(100, 140)) * 3)[:-20]  # drawn weights: a prompt whose last tokens came before
DRAFT_LENGTHS = [3, 10]  # k: HF's default is 10
SPEEDUP_K = 10


def prompt_ids(prompt):
    """``[1, T]`` int64: the stored prompt on the real model, else :data:`STAND_IN`."""
    return np.array([PROMPTS[prompt] if bench_model.gguf_path() is not None else STAND_IN])


def model_inputs(prompt):
    """``(config, weights, ids [1, T], caches)`` of the commit: ``caches()`` gives new float32 static caches, one per
    layer, of room for the prompt and NEW_TOKENS. NotImplementedError on a commit without prompt lookup."""
    generate = library_function("generate")
    if "prompt_lookup_num_tokens" not in inspect.signature(generate).parameters:
        raise NotImplementedError("kv_attention's generate has no prompt lookup at this commit")
    c, static, ids = bench_model.CONFIGS[bench_model.MODEL], library_function("StaticCache"), prompt_ids(prompt)

    def caches():
        return bench_model.model_cache(static, (1, c["num_key_value_heads"]), ids.shape[1] + NEW_TOKENS, c["head_dim"],
                                       c["head_dim"], np.float32)

    return bench_model.model_config(), bench_model.model_weights(), ids, caches


@functools.lru_cache(maxsize=None)
def greedy_tokens(prompt):
    """Plain greedy's new tokens, checked against ANSWERS on the real model (AssertionError)."""
    config, weights, ids, caches = model_inputs(prompt)
    tokens = np.asarray(library_function("generate")(config, weights, ids, NEW_TOKENS, cache=caches()))
    tokens = tokens[0, ids.shape[1]:].tolist()
    if bench_model.gguf_path() is not None:
        assert tokens == ANSWERS[prompt], f"greedy answer to {prompt!r} is {tokens}, not the stored {ANSWERS[prompt]}"
    return tokens


def decode(prompt, k=None):
    """A zero-argument call of the commit's ``generate`` of NEW_TOKENS after ``prompt`` through new static caches,
    greedy (k None) or with ``prompt_lookup_num_tokens=k``, checked first to give :func:`greedy_tokens`."""
    config, weights, ids, caches = model_inputs(prompt)
    options = {} if k is None else {"prompt_lookup_num_tokens": k}

    def call():
        return library_function("generate")(config, weights, ids, NEW_TOKENS, cache=caches(), **options)

    if k is not None:  # greedy's own tokens are greedy_tokens' check
        got = np.asarray(call())[0, ids.shape[1]:].tolist()
        assert got == greedy_tokens(prompt), f"generate with {options} on {prompt!r} gave {got}, not greedy's"
    return call


class SpeculativeCounts(Measured):
    """Forwards per generated token and draft tokens accepted, exact, per prompt and k."""

    params = [list(PROMPTS), DRAFT_LENGTHS]
    param_names = ["prompt", "k"]
    version = "1"

    def measure(self, prompt, k):
        config, weights, ids, caches = model_inputs(prompt)
        tokens, stats = library_function("prompt_lookup_generate")(config, weights, ids, NEW_TOKENS, cache=caches(),
                                                                   prompt_lookup_num_tokens=k)
        got = np.asarray(tokens)[0, ids.shape[1]:].tolist()
        assert got == greedy_tokens(prompt), f"prompt lookup k={k} on {prompt!r} gave {got}, not greedy's"
        return {"forwards": stats.num_forwards, "accepted": stats.num_accepted_tokens}

    def track_forwards_per_token(self, measured, prompt, k):
        """Forwards of the model per generated token: the prefill and each verifying forward, over NEW_TOKENS."""
        return self.measured["forwards"] / NEW_TOKENS

    track_forwards_per_token.unit = "forwards/token"

    def track_accepted_tokens(self, measured, prompt, k):
        """Draft tokens the model's own greedy tokens confirmed, over the NEW_TOKENS."""
        return self.measured["accepted"]

    track_accepted_tokens.unit = "tokens"
