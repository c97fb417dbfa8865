"""The independent references every test compares against, and the inputs drawn for them.

Nothing here imports kv_attention: each expectation is written from its
definition, loop by loop in float64 where it can be (Python's ``math.exp``, one
query and one key at a time), so a bug in the library cannot also be in its reference.
"""

import math

import numpy as np

SINGLE = ("no_cache", "concat", "preallocated")  # strategies of x: [T, D_model]
BATCHED = ("sequential", "batched")  # strategies of x: [B, T, D_model]


def attends(t, s, window=None, n_sink=0):
    """Whether position t attends to position s, as the issue defines it.

    s <= t, and either t - s < window (the window counts the current key: W = 1 is
    itself alone) or s < n_sink (a sink); without a window every s <= t.
    """
    if s > t:
        return False
    return window is None or t - s < window or s < n_sink


def naive_causal_attention(x, w_q, w_k, w_v, window=None, n_sink=0):
    """Position by position, in float64 with Python's math.exp: shares no code with kv_attention.

    x: [T, D_model] or [B, T, D_model] -> [T, D_v] or [B, T, D_v] (float64).
    With ``window``/``n_sink``, position t attends to the keys :func:`attends` allows.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 3:
        return np.stack([naive_causal_attention(seq, w_q, w_k, w_v, window, n_sink) for seq in x]).reshape(
            x.shape[:2] + (np.shape(w_v)[1],)
        )
    w_q, w_k, w_v = (np.asarray(w, dtype=np.float64) for w in (w_q, w_k, w_v))
    t_len, d_k = x.shape[0], w_q.shape[1]
    out = np.zeros((t_len, w_v.shape[1]))
    for t in range(t_len):
        q = x[t] @ w_q
        keys = [j for j in range(t + 1) if attends(t, j, window, n_sink)]
        scores = [float(np.dot(q, x[j] @ w_k)) / math.sqrt(d_k) for j in keys]
        top = max(scores)
        weights = [math.exp(s - top) for s in scores]
        total = sum(weights)
        for weight, j in zip(weights, keys):
            out[t] += (weight / total) * (x[j] @ w_v)
    return out


def naive_attend(q, k, v, valid=None):
    """One query row at a time with Python's math.exp over its valid keys (all, by default); zeros if none.

    q: [..., T_q, D_k], k: [..., S, D_k], v: [..., S, D_v], valid: [..., S] bool -> [..., T_q, D_v] (float64).
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    valid = np.ones(k.shape[:-1], dtype=bool) if valid is None else np.asarray(valid)
    out = np.zeros(q.shape[:-1] + v.shape[-1:])
    for lead in np.ndindex(q.shape[:-2]):
        keys = [s for s in range(k.shape[-2]) if valid[lead][s]]
        for t in range(q.shape[-2]):
            scores = [float(np.dot(q[lead][t], k[lead][s])) / math.sqrt(q.shape[-1]) for s in keys]
            weights = [math.exp(score - max(scores)) for score in scores]
            for s, weight in zip(keys, weights):
                out[lead][t] += weight / sum(weights) * v[lead][s]
    return out


def problem(t_len, batch=None, d_model=4, d_k=3, d_v=5, seed=0, dtype=np.float64):
    """Inputs drawn here (not by kv_attention.make_problem), with D_model, D_k, D_v all different."""
    rng = np.random.default_rng(seed)
    shape = (t_len, d_model) if batch is None else (batch, t_len, d_model)
    x = rng.standard_normal(shape)
    weights = [rng.standard_normal((d_model, d)) / math.sqrt(d_model) for d in (d_k, d_k, d_v)]
    return tuple(a.astype(dtype) for a in (x, *weights))


def strategy_problem(name, t_len, batch=3, **kwargs):
    """A problem shaped for strategy ``name``: batched strategies get ``batch`` sequences."""
    return problem(t_len, batch if name in BATCHED else None, **kwargs)


# Multi-head attention: n_heads = 6, n_kv_heads = 2 by default.

def heads_problem(t_len, batch=3, *, n_heads=6, n_kv_heads=2, d_model=5, head_dim=3, d_out=4, seed=0,
                  dtype=np.float64):
    """(x, w_q, w_k, w_v, w_o), drawn here, with D_model, head_dim and D_out all different."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((t_len, d_model) if batch is None else (batch, t_len, d_model))
    widths = (n_heads * head_dim, n_kv_heads * head_dim, n_kv_heads * head_dim)
    w_q, w_k, w_v = (rng.standard_normal((d_model, w)) / math.sqrt(d_model) for w in widths)
    w_o = rng.standard_normal((n_heads * head_dim, d_out)) / math.sqrt(n_heads * head_dim)
    return tuple(a.astype(dtype) for a in (x, w_q, w_k, w_v, w_o))


def naive_head(x, w_q, w_k, w_v, h, n_heads, n_kv_heads, kv_of=None):
    """Query head h alone, by the loop-by-loop single-head reference: ``[..., T, D_head]``.

    K/V head of h: ``h // (n_heads // n_kv_heads)``, or ``kv_of(h)`` when given.
    """
    d = w_q.shape[1] // n_heads
    j = h // (n_heads // n_kv_heads) if kv_of is None else kv_of(h)
    kv_cols = slice(j * d, (j + 1) * d)
    return naive_causal_attention(x, w_q[:, h * d : (h + 1) * d], w_k[:, kv_cols], w_v[:, kv_cols])


def naive_multi_head(x, w_q, w_k, w_v, w_o, n_heads, n_kv_heads):
    """Every head by :func:`naive_head`, concatenated in head order, then ``@ w_o``."""
    per_head = [naive_head(x, w_q, w_k, w_v, h, n_heads, n_kv_heads) for h in range(n_heads)]
    return np.concatenate(per_head, axis=-1) @ np.asarray(w_o, dtype=np.float64)


# Ragged batches: the schedule, the solo outputs and the block counts.

def schedule(lengths, start_steps=None):
    """``{step: [(sequence, position), ...]}`` for every step with a sequence in the batch."""
    start_steps = start_steps or [0] * len(lengths)
    steps = {}
    for seq, (length, start) in enumerate(zip(lengths, start_steps)):
        for position in range(length):
            steps.setdefault(start + position, []).append((seq, position))
    return dict(sorted(steps.items()))


def solo_outputs(seqs, w_q, w_k, w_v):
    """Each sequence decoded alone by the naive loop-by-loop reference: a list of ``[T_i, D_v]``."""
    return [naive_causal_attention(seq, w_q, w_k, w_v) for seq in seqs]


def blocks_per_step(lengths, start_steps, block_size):
    """Blocks held at each scheduled step, after its tokens are written: sum of ceil((position + 1) / block_size)."""
    return [
        sum(math.ceil((position + 1) / block_size) for _, position in rows)
        for rows in schedule(lengths, start_steps).values()
    ]


def sequences(rng, lengths, d_model=4):
    return [rng.standard_normal((n, d_model)) for n in lengths]


def weights(rng, d_model=4, d_k=3, d_v=5):
    return [rng.standard_normal((d_model, d)) / np.sqrt(d_model) for d in (d_k, d_k, d_v)]


# Serving: each request alone, by the naive reference.

def serve_reference(token_ids, prompt_len, embedding, w_q, w_k, w_v):
    """The outputs a request must get: ``naive_causal_attention(embedding[token_ids])`` from the last prompt position on.

    ``[len(token_ids) - prompt_len + 1, D_v]`` float64: the last prompt position and every decoded one.
    """
    x = np.asarray(embedding, dtype=np.float64)[np.asarray(token_ids, dtype=np.int64)]  # [L, D_model]
    return naive_causal_attention(x, w_q, w_k, w_v)[prompt_len - 1 :]


# Attention states: each query row's softmax and log-sum-exp, in Python floats.

def naive_attention_state(q, k, v):
    """``(out, lse)`` of ``q: [..., T_q, D_k]`` over ``k: [..., S, D_k]``, ``v: [..., S, D_v]``, one row at a time.

    Scores q·k / sqrt(D_k) as Python floats; lse = top + log(fsum(exp(s - top))) with
    math.exp and math.log; out = the weighted sum of the value rows. A row with no key
    (S = 0) gives zeros and -inf. float64 whatever the inputs.
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    lead, t_q, d_k = q.shape[:-2], q.shape[-2], q.shape[-1]
    out = np.zeros(lead + (t_q, v.shape[-1]))
    lse = np.full(lead + (t_q,), -math.inf)
    for index in np.ndindex(*lead):
        for t in range(t_q):
            scores = [float(np.dot(q[index][t], key)) / math.sqrt(d_k) for key in k[index]]
            if not scores:
                continue
            top = max(scores)
            weights = [math.exp(s - top) for s in scores]
            total = math.fsum(weights)
            lse[index + (t,)] = top + math.log(total)
            for weight, value in zip(weights, v[index]):
                out[index + (t,)] += (weight / total) * value
    return out, lse


def naive_attention(q, k, v):
    """The ``out`` of :func:`naive_attention_state`: ``[..., T_q, D_v]``."""
    return naive_attention_state(q, k, v)[0]


def attention_problem(lead, t_q, s_len, d_k=5, d_v=3, seed=0, scale=1.0, dtype=np.float64):
    """``(q, k, v)`` drawn here: ``[*lead, T_q, D_k]``, ``[*lead, S, D_k]``, ``[*lead, S, D_v]``, q scaled by ``scale``."""
    rng = np.random.default_rng(seed)
    lead = tuple(lead)
    q = rng.standard_normal(lead + (t_q, d_k)) * scale
    k = rng.standard_normal(lead + (s_len, d_k))
    v = rng.standard_normal(lead + (s_len, d_v))
    return tuple(a.astype(dtype) for a in (q, k, v))


# The quantized KV cache (issue 22): each group rounded by the contract, one Python float at a time.

def _float8_values(format_name):
    """Every finite value of a float8 format, with whether its bit pattern is even: ``[(value, even)]``."""
    import ml_dtypes  # the format's bit patterns only; the rounding below is written here

    values = np.arange(256, dtype=np.uint8).view(getattr(ml_dtypes, format_name)).astype(np.float64)
    return [(float(v), bits % 2 == 0) for bits, v in enumerate(values) if math.isfinite(v)]


def _nearest_float8(y, table):
    """``y`` rounded to the nearest value of ``table``, a tie to the even bit pattern (round half to even)."""
    best = min(abs(value - y) for value, _ in table)
    ties = [(value, even) for value, even in table if abs(value - y) == best]
    return next((value for value, even in ties if even), ties[0][0])


def _quantized_group(values, nbits, format_name):
    """``(x̂, scale)`` of one group of Python floats by the contract's rounding."""
    if format_name is not None:
        table = _float8_values(format_name)
        scale = max(abs(v) for v in values) / max(value for value, _ in table)
        if scale == 0.0:
            return [0.0] * len(values), 0.0
        return [_nearest_float8(v / scale, table) * scale for v in values], scale
    levels = 2**nbits - 1
    lo, hi = min(values), max(values)
    scale = (hi - lo) / levels
    if scale == 0.0:
        return [lo] * len(values), 0.0
    return [min(max(round((v - lo) / scale), 0), levels) * scale + lo for v in values], scale


def quantized_reference(x, nbits, group_size, residual_length, axis, format_name=None):
    """``(x̂, scale)``, ``[..., T, D]`` each: what a quantized cache holds after the T positions of ``x``, and each
    element's group scale (0 in the residual).

    The first ``Q = G·ceil(max(0, T - R) / G)`` positions are quantized in groups
    (``"channel"``: channel c of positions jG..jG+G-1; ``"token"``: position t's channels
    in runs of G), the rest held exactly. float64.
    """
    x = np.asarray(x, dtype=np.float64)
    t_len, dim, g = x.shape[-2], x.shape[-1], group_size
    held = g * math.ceil(max(0, t_len - residual_length) / g)
    if axis == "channel":
        groups = [(slice(j, j + g), c) for j in range(0, held, g) for c in range(dim)]
    else:
        groups = [(t, slice(c, c + g)) for t in range(held) for c in range(0, dim, g)]
    out, scales = x.copy(), np.zeros_like(x)
    for lead in np.ndindex(x.shape[:-2]):
        for rows, cols in groups:
            values = [float(v) for v in np.ravel(x[lead][rows, cols])]
            rounded, scale = _quantized_group(values, nbits, format_name)
            out[lead][rows, cols] = np.reshape(rounded, np.shape(x[lead][rows, cols]))
            scales[lead][rows, cols] = scale
    return out, scales


# A Llama-architecture forward, position by position and head by head: shares no code with kv_attention.model.

def _rms(x, weight, eps):
    return weight * x / math.sqrt(math.fsum(float(e) ** 2 for e in x) / len(x) + eps)


def _rotate(x, position, theta):
    """x [D] rotated as Hugging Face pairs its channels: (x_i, x_{i + D/2}) by the angle p · theta^(-2i/D)."""
    half, out = len(x) // 2, np.empty(len(x))
    for i in range(half):
        angle = position * theta ** (-2.0 * i / len(x))
        c, s = math.cos(angle), math.sin(angle)
        out[i], out[i + half] = x[i] * c - x[i + half] * s, x[i + half] * c + x[i] * s
    return out


def naive_llama_forward(config, weights, input_ids, window=None, kv_hook=None):
    """Logits ``[B, T, vocab_size]`` (float64) of ``input_ids [B, T]``, one position, head and key at a time.

    ``config`` has LlamaConfig's field names; ``weights`` Hugging Face's state-dict names.
    ``window``: a query at t attends to keys t - window < s <= t (HF's sliding window).
    ``kv_hook(k, v)`` maps one layer's rotated keys and values ``[H_kv, T, D]`` before
    attention (a quantized cache's round trip, say).
    """
    w = {name: np.asarray(a, dtype=np.float64) for name, a in weights.items()}
    n_heads, n_kv, d, eps = config.num_attention_heads, config.num_key_value_heads, config.head_dim, config.rms_norm_eps
    group = n_heads // n_kv
    head = w["model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight"]
    logits = []
    for ids in np.asarray(input_ids):
        t_len = len(ids)
        x = np.array([w["model.embed_tokens.weight"][i] for i in ids])  # [T, D_model]
        for layer in range(config.num_hidden_layers):
            p = f"model.layers.{layer}."
            h = np.array([_rms(row, w[p + "input_layernorm.weight"], eps) for row in x])
            q = [[_rotate(w[p + "self_attn.q_proj.weight"][j * d:(j + 1) * d] @ h[t], t, config.rope_theta)
                  for t in range(t_len)] for j in range(n_heads)]
            k = np.array([[_rotate(w[p + "self_attn.k_proj.weight"][j * d:(j + 1) * d] @ h[t], t, config.rope_theta)
                           for t in range(t_len)] for j in range(n_kv)])  # [H_kv, T, D]
            v = np.array([[w[p + "self_attn.v_proj.weight"][j * d:(j + 1) * d] @ h[t] for t in range(t_len)]
                          for j in range(n_kv)])  # [H_kv, T, D]
            if kv_hook is not None:
                k, v = kv_hook(k, v)
            heads = np.zeros((t_len, n_heads * d))
            for j in range(n_heads):
                for t in range(t_len):
                    keys = [s for s in range(t + 1) if attends(t, s, window)]
                    scores = [float(np.dot(q[j][t], k[j // group][s])) / math.sqrt(d) for s in keys]
                    top = max(scores)
                    weights_ = [math.exp(s - top) for s in scores]
                    total = math.fsum(weights_)
                    for weight, s in zip(weights_, keys):
                        heads[t, j * d:(j + 1) * d] += weight / total * v[j // group][s]
            x = x + heads @ w[p + "self_attn.o_proj.weight"].T
            h = np.array([_rms(row, w[p + "post_attention_layernorm.weight"], eps) for row in x])
            gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
            silu = np.vectorize(lambda g: g / (1.0 + math.exp(-g)))(gate)
            x = x + (silu * up) @ w[p + "mlp.down_proj.weight"].T
        x = np.array([_rms(row, w["model.norm.weight"], eps) for row in x])
        logits.append(x @ head.T)
    return np.array(logits)
