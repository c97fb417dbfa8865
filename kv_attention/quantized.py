"""A quantized K/V cache: integer groups of 2, 4 or 8 bits or float8, an exact residual, and attention from the codes.

Keys and values ``[*batch_shape, T, D]`` are held as HF's ``QuantizedCache`` and KIVI (Liu et al. 2024) hold them,
to a contract a test can hold each position to:

*Groups*: ``"channel"`` (KIVI's keys): each channel of each block of ``group_size`` (G) positions; ``"token"``
    (KIVI's values): each position's channels in runs of G.
*Rounding* (integer codes, asymmetric min-max per group): ``scale = (max - min) / (2**nbits - 1)``, ``zero = min``,
    ``code = clip(round((x - min) / scale))``, ``x̂ = code · scale + zero``, so ``|x̂ - x| <= scale / 2`` up to a few
    ULPs. *Range*: ``|x| <= max / 4`` of the dtype, so no step overflows (``update`` refuses more, and NaN/inf).
*Float8* (``nbits=8``, ``format="float8_e4m3fn"`` or ``"float8_e5m2"``): ``scale = max|x| / F`` (F: 448, 57344),
    ``x̂ = fp8(x / scale) · scale``, round to nearest even.
*Residual*: positions enter an exact residual; whenever it holds more than ``residual_length`` (R >= G), its oldest
    G are quantized, once, from their exact values (HF's re-quantizes dequantized values whenever it fills), so the
    state after T positions is the same however they arrived: ``num_quantized = G · ceil(max(0, T - R) / G)``.
*Codes packed* along each position's channels (8 bits one per byte, 4 bits two, 2 bits four); ``nbytes`` counts
    codes, scales, zeros (integer codes only) and the residual.
*Crop* keeps positions as held: to a length in ``[num_quantized, T]``, or a multiple of G below.

``update(k, v)`` returns the dequantized ``K̂``, ``V̂`` (new arrays), which every decode taking a cache attends over;
:func:`attend_quantized` reads the scores from the codes instead. Bad input raises TypeError or ValueError naming
it, and leaves the cache unchanged.
"""

import math
from collections import namedtuple

import numpy as np

from ._validation import as_array, as_flag, as_float_array, as_float_dtype, as_size, check_choice
from .attention import attention_weights
from .cache import Cache, as_batch_shape, check_crop

AXES = ("channel", "token")
# name -> (exponent bits, mantissa bits, finite codes >= 0): the OCP 8-bit floats; e4m3fn's 0x7F is NaN (no inf),
# e5m2's 0x7C.. are inf and NaN (IEEE)
FORMATS = {"float8_e4m3fn": (4, 3, 127), "float8_e5m2": (5, 2, 124)}


def float8_values(name):
    """The finite values >= 0 of float8 format ``name``, ``[n]`` float64, code i value i: from the OCP format (no
    ml_dtypes; the tests compare with it)."""
    exponent_bits, mantissa_bits, finite = FORMATS[name]
    bias = 2 ** (exponent_bits - 1) - 1
    codes = np.arange(128)
    exponent, mantissa = codes >> mantissa_bits, codes & (2**mantissa_bits - 1)
    normal = (1 + mantissa / 2**mantissa_bits) * 2.0 ** (exponent - bias)
    values = np.where(exponent == 0, mantissa * 2.0 ** (1 - bias - mantissa_bits), normal)
    return values[:finite]


def _to_float8(y, values):
    """Codes (uint8) of ``y`` (|y| <= values[-1]) rounded to the nearest float8 value, a tie to the even code."""
    magnitude = np.abs(y)
    upper = np.clip(np.searchsorted(values, magnitude), 1, len(values) - 1)
    lower = upper - 1
    below, above = magnitude - values[lower], values[upper] - magnitude
    code = np.where((above < below) | ((above == below) & (upper % 2 == 0)), upper, lower)
    return (code + 128 * np.signbit(y)).astype(np.uint8)


_Part = namedtuple("_Part", "codes scale zero residual")
"""One tensor's state: packed codes ``[*batch, Q, bytes]``, scale and zero (None for float8)
``[*batch, Q/G, D]`` (channel) or ``[*batch, Q, ceil(D/G)]`` (token), and the exact residual ``[*batch, T - Q, D]``."""


class _Quantizer:
    """The rounding of one tensor (keys or values): its axis, width, bits or float8 format, and dtype."""

    def __init__(self, axis, dim, nbits, group_size, fmt, dtype):
        self.axis, self.dim, self.nbits, self.group_size, self.dtype = axis, dim, nbits, group_size, dtype
        self.format = fmt
        if fmt is not None:
            self.float8 = float8_values(fmt)
            decoded = np.zeros(256)  # code -> value; the codes never written (NaN, inf) stay 0
            decoded[: len(self.float8)], decoded[128 : 128 + len(self.float8)] = self.float8, -self.float8
        else:
            shifts = np.arange(0, 8, nbits)
            decoded = (np.arange(256)[:, None] >> shifts) & (2**nbits - 1)  # byte -> its per_byte codes
        self.table = decoded.reshape(256, -1).astype(dtype)  # [256, per_byte]: unpacking is one lookup
        self.per_byte = 1 if self.format is not None else 8 // nbits
        self.row_bytes = -(-dim // self.per_byte)  # ceil(D·b/8)
        self.n_groups = -(-dim // group_size) if axis == "token" else dim  # scales per position (token) or per block

    def grouped(self, x):
        """``x: [..., Q, D]`` with each group on the last axis: ``[..., Q/G, D, G]`` (channel) or ``[..., Q, n_g, G]``."""
        lead, g = x.shape[:-2], self.group_size
        if self.axis == "channel":
            return x.reshape(lead + (x.shape[-2] // g, g, self.dim)).swapaxes(-1, -2)  # [..., Q/G, D, G]
        pad = self.n_groups * g - self.dim  # the last run repeats its last channel: its min, max and absmax are kept
        x = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)], mode="edge") if pad else x
        return x.reshape(x.shape[:-1] + (self.n_groups, g))  # [..., Q, n_g, G]

    def ungrouped(self, xg):
        """The inverse of :meth:`grouped`: ``[..., Q, D]``."""
        if self.axis == "channel":
            xg = xg.swapaxes(-1, -2)  # [..., Q/G, G, D]
            return xg.reshape(xg.shape[:-3] + (xg.shape[-3] * self.group_size, self.dim))
        return xg.reshape(xg.shape[:-2] + (self.n_groups * self.group_size,))[..., : self.dim]

    def quantize(self, x):
        """``x: [..., Q, D]`` (Q a multiple of G) -> ``(codes, scale, zero)`` as :data:`_Part` holds them."""
        xg = self.grouped(x)  # groups on the last axis
        if self.format is not None:
            fmax = float(self.float8[-1])
            scale = np.abs(xg).max(axis=-1) / fmax
            safe = np.where(scale > 0, scale, 1)[..., None]
            codes = _to_float8(np.clip(xg / safe, -fmax, fmax), self.float8)  # clipped: a rounding past the max
            return self.ungrouped(codes), scale, None
        levels = 2**self.nbits - 1
        lo, hi = xg.min(axis=-1), xg.max(axis=-1)
        with np.errstate(over="ignore"):
            scale = (hi - lo) / levels
        if not np.isfinite(scale).all():
            raise ValueError(f"k or v too large to quantize in {self.dtype}: max - min of a group overflows (or is NaN)")
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = (xg - lo[..., None]) / scale[..., None]
        codes = np.where(scale[..., None] > 0, np.clip(np.rint(ratio), 0, levels), 0).astype(np.uint8)
        return self.pack(self.ungrouped(codes)), scale, lo

    def pack(self, codes):
        """``[..., Q, D]`` uint8 codes < 2**nbits -> ``[..., Q, ceil(D·b/8)]``, channel i in bits (i % per_byte)·b."""
        if self.per_byte == 1:
            return codes
        pad = self.row_bytes * self.per_byte - self.dim
        codes = np.pad(codes, [(0, 0)] * (codes.ndim - 1) + [(0, pad)]) if pad else codes
        codes = codes.reshape(codes.shape[:-1] + (self.row_bytes, self.per_byte))
        shifts = np.arange(0, 8, self.nbits, dtype=np.uint8)
        return np.bitwise_or.reduce(codes << shifts, axis=-1).astype(np.uint8)

    def codes(self, packed):
        """The codes of ``packed: [..., Q, bytes]`` as the dtype, ``[..., Q, D]``: integers, or float8 values."""
        codes = self.table[packed]  # [..., Q, bytes, per_byte]
        return codes.reshape(packed.shape[:-1] + (self.row_bytes * self.per_byte,))[..., : self.dim]

    def expanded(self, per_group):
        """A scale or zero per group -> one per element, ``[..., Q, D]``."""
        if self.axis == "channel":
            return np.repeat(per_group, self.group_size, axis=-2)
        return np.repeat(per_group, self.group_size, axis=-1)[..., : self.dim]

    def dequantize(self, part):
        """``x̂ = code · scale + zero`` of the quantized positions and the residual: ``[..., T, D]``."""
        held = self.codes(part.codes) * self.expanded(part.scale)
        if part.zero is not None:
            held += self.expanded(part.zero)
        return np.concatenate([held, part.residual], axis=-2)


class QuantizedCache(Cache):
    """``[*batch_shape, T, k_dim]`` keys and ``[*batch_shape, T, v_dim]`` values held quantized (the module's contract).

    ``nbits`` 2, 4 or 8; ``format`` None or a float8 format; ``dtype`` that of scales, zeros and the residual (None:
    the first update's, as cache.py's caches).
    A crop inside a quantized block is refused (``can_crop`` False); a failed call is undone exactly.
    """

    can_crop = False

    def __init__(self, batch_shape, k_dim, v_dim, *, nbits=4, group_size=32, residual_length=32,
                 key_axis="channel", value_axis="token", dtype=None, format=None):
        batch_shape = as_batch_shape(batch_shape)
        k_dim, v_dim = as_size("k_dim", k_dim, minimum=1), as_size("v_dim", v_dim, minimum=1)
        group_size = as_size("group_size", group_size, minimum=1)
        residual_length = as_size("residual_length", residual_length, minimum=1)
        if residual_length < group_size:
            raise ValueError(f"residual_length must be >= group_size, got {residual_length} < {group_size}")
        nbits = as_size("nbits", nbits)
        if nbits not in (2, 4, 8):
            raise ValueError(f"nbits must be 2, 4 or 8, got {nbits}")
        if format is not None:
            check_choice("format", format, tuple(FORMATS))
            if nbits != 8:
                raise ValueError(f"format={format!r} takes nbits=8, got nbits={nbits}")
        check_choice("key_axis", key_axis, AXES)
        check_choice("value_axis", value_axis, AXES)
        self.batch_shape, self.k_dim, self.v_dim = batch_shape, k_dim, v_dim
        self.nbits, self.group_size, self.residual_length, self.format = nbits, group_size, residual_length, format
        self.key_axis, self.value_axis = key_axis, value_axis
        self.dtype = None if dtype is None else as_float_dtype(dtype)
        self._quantizers, self._parts = self._empty(np.float64 if dtype is None else self.dtype)  # empty: 0 bytes

    def _empty(self, dtype):
        """The quantizers of ``dtype`` and their parts of no position."""
        quantizers = (_Quantizer(self.key_axis, self.k_dim, self.nbits, self.group_size, self.format, dtype),
                      _Quantizer(self.value_axis, self.v_dim, self.nbits, self.group_size, self.format, dtype))
        parts = []
        for quantizer in quantizers:
            codes = np.zeros(self.batch_shape + (0, quantizer.row_bytes), np.uint8)
            scale = np.zeros(self.batch_shape + (0, quantizer.n_groups), dtype)
            zero = None if quantizer.format is not None else scale.copy()
            parts.append(_Part(codes, scale, zero, np.zeros(self.batch_shape + (0, quantizer.dim), dtype)))
        return quantizers, tuple(parts)

    def __repr__(self):
        kind = self.format or f"{self.nbits}-bit"
        return (f"QuantizedCache(batch_shape={self.batch_shape}, k_dim={self.k_dim}, v_dim={self.v_dim}, {kind}, "
                f"group_size={self.group_size}, residual_length={self.residual_length}, key_axis={self.key_axis!r}, "
                f"value_axis={self.value_axis!r}, dtype={self.dtype}, seq_length={self.get_seq_length()}, "
                f"num_quantized={self.num_quantized})")

    def _check_new(self, k, v, check_finite):
        """``k: [*batch_shape, T_new, k_dim]``, ``v: [*batch_shape, T_new, v_dim]`` as arrays of the cache's dtype."""
        if not isinstance(k, np.ndarray) or not isinstance(v, np.ndarray):
            raise TypeError(f"k and v must be numpy arrays, got {type(k).__name__}, {type(v).__name__}")
        check_finite = as_flag("check_finite", check_finite)
        read = as_float_array if check_finite else as_array
        k, v = read("k", k), read("v", v)
        if k.dtype != v.dtype:
            raise TypeError(f"k and v must both be float32 or both float64, got {k.dtype} and {v.dtype}")
        dtype = k.dtype if self.dtype is None else self.dtype  # None: the first update's
        if not np.can_cast(k.dtype, dtype, casting="safe"):
            raise TypeError(f"k is {k.dtype}, which the cache's {dtype} cannot hold without loss")
        t_new = k.shape[-2] if k.ndim >= 2 else -1
        expected_k, expected_v = self.batch_shape + (t_new, self.k_dim), self.batch_shape + (t_new, self.v_dim)
        if k.shape != expected_k or v.shape != expected_v:
            lead = ", ".join(map(str, self.batch_shape + ("T_new",)))
            raise ValueError(f"k {k.shape} and v {v.shape} do not fit the cache: they must be [{lead}, {self.k_dim}] "
                             f"and [{lead}, {self.v_dim}]")
        if check_finite:
            limit = float(np.finfo(dtype).max) / 4
            for name, array in (("k", k), ("v", v)):
                if array.size and float(np.abs(array).max()) > limit:
                    raise ValueError(f"{name} holds |x| = {float(np.abs(array).max()):.3g}, beyond max / 4 = "
                                     f"{limit:.3g} of {dtype} that a quantized cache holds (the module's Range)")
        return k.astype(dtype, copy=False), v.astype(dtype, copy=False)

    def store(self, k, v, *, check_finite=True):
        """:meth:`update` without returning K̂/V̂ (for :func:`attend_quantized`); returns None."""
        k, v = self._check_new(k, v, check_finite)
        quantizers, old = (self._quantizers, self._parts) if self.dtype is not None else self._empty(k.dtype)
        held = old[0].residual.shape[-2] + k.shape[-2]
        n_new = self.group_size * math.ceil(max(0, held - self.residual_length) / self.group_size)
        parts = []
        for part, quantizer, new in zip(old, quantizers, (k, v)):
            residual = np.concatenate([part.residual, new], axis=-2)  # [..., T - Q + T_new, D]
            if n_new == 0:
                parts.append(part._replace(residual=residual))
                continue
            codes, scale, zero = quantizer.quantize(residual[..., :n_new, :])  # may raise: nothing assigned yet
            parts.append(_Part(np.concatenate([part.codes, codes], axis=-2), np.concatenate([part.scale, scale], axis=-2),
                               None if zero is None else np.concatenate([part.zero, zero], axis=-2),
                               residual[..., n_new:, :].copy()))
        self.dtype, self._quantizers, self._parts = k.dtype, quantizers, tuple(parts)

    def update(self, k, v, layer_idx=0, *, check_finite=True):
        """Store ``k: [*batch_shape, T_new, k_dim]``, ``v: [..., v_dim]``; return ``(K̂, V̂)`` so far (new arrays).
        ``check_finite=False`` skips the scan for NaN/inf and the range."""
        if layer_idx:
            return self.layer(layer_idx).update(k, v, check_finite=check_finite)
        self.store(k, v, check_finite=check_finite)
        return self.dequantize()

    def dequantize(self):
        """``(K̂, V̂)``: every held position as the cache holds it, ``[*batch_shape, T, D]`` each (new arrays)."""
        return tuple(q.dequantize(part) for q, part in zip(self._quantizers, self._parts))

    @property
    def k_cache(self):
        """K̂ ``[*batch_shape, T, k_dim]``, dequantized at each access; None before the first update fixes the dtype."""
        return None if self.dtype is None else self._quantizers[0].dequantize(self._parts[0])

    @property
    def v_cache(self):
        """V̂ ``[*batch_shape, T, v_dim]``, dequantized at each access; None as ``k_cache``."""
        return None if self.dtype is None else self._quantizers[1].dequantize(self._parts[1])

    @property
    def layout(self):
        return self.batch_shape, self.k_dim, self.v_dim, self.dtype  # not dequantized

    def get_seq_length(self, layer_idx=0):
        """Number of positions held, quantized and residual (int)."""
        if layer_idx:
            return self.layer(layer_idx).get_seq_length()
        part = self._parts[0]
        return part.codes.shape[-2] + part.residual.shape[-2]

    @property
    def num_quantized(self):
        """Number of positions held quantized, the first ones (int, a multiple of group_size)."""
        return self._parts[0].codes.shape[-2]

    def crop(self, length):
        """Keep the first ``length`` positions as held (the module's *Crop*); ValueError inside a quantized block."""
        length = check_crop(length, self.get_seq_length())
        held, g = self.num_quantized, self.group_size
        if length < held and length % g:
            raise ValueError(f"crop length {length} cuts a quantized block of group_size={g}: positions 0..{held - 1} are "
                             f"quantized in blocks of {g}; crop to a length in [{held}, {self.get_seq_length()}] or to a "
                             f"multiple of {g}")
        for c in self._more:
            c.crop(length)
        parts = []
        for part, quantizer in zip(self._parts, self._quantizers):
            if length >= held:
                parts.append(part._replace(residual=part.residual[..., : length - held, :].copy()))
                continue
            rows = length // g if quantizer.axis == "channel" else length  # scale rows kept
            parts.append(_Part(part.codes[..., :length, :].copy(), part.scale[..., :rows, :].copy(),
                               None if part.zero is None else part.zero[..., :rows, :].copy(),
                               part.residual[..., :0, :].copy()))
        self._parts = tuple(parts)

    def _snapshot(self, t_new):
        return self.dtype, self._quantizers, self._parts  # never written in place: an update or a crop makes new ones

    def _restore(self, state):
        self.dtype, self._quantizers, self._parts = state

    def _nbytes(self):  # codes, scales, zeros and the residual (the module's formula)
        return sum(a.nbytes for part in self._parts for a in part if a is not None)


def attend_quantized(q, cache, *, check_finite=True):
    """``softmax(q K̂ᵀ / sqrt(D_k)) V̂`` of ``q: [*batch_shape, C, k_dim]`` in the cache's dtype over every position of
    ``cache``, read from its codes: ``[*batch_shape, C, v_dim]``. Block j's scores are ``(q · scale_j) @ codes_jᵀ +
    q @ zero_jᵀ``, group g's output ``(p · scale_g) @ codes_g + p @ zero_g``: ``attend(q, *cache.dequantize())`` up
    to rounding. Needs KIVI's layout and >= 1 position (ValueError).
    """
    if not isinstance(cache, QuantizedCache):
        raise TypeError(f"cache must be a QuantizedCache, got {type(cache).__name__}")
    if (cache.key_axis, cache.value_axis) != ("channel", "token"):
        raise ValueError(f"attend_quantized reads keys per channel and values per token, the cache has key_axis="
                         f"{cache.key_axis!r}, value_axis={cache.value_axis!r}; attend over cache.dequantize() instead")
    if cache.get_seq_length() == 0:
        raise ValueError("attend_quantized needs a cache holding at least one position, got an empty cache")
    check_finite = as_flag("check_finite", check_finite)
    if not isinstance(q, np.ndarray):
        raise TypeError(f"q must be a numpy array, got {type(q).__name__}")
    q = (as_float_array if check_finite else as_array)("q", q)
    if q.dtype != cache.dtype:
        raise TypeError(f"q is {q.dtype} but the cache holds {cache.dtype}")
    if q.ndim < 2 or q.shape[:-2] != cache.batch_shape or q.shape[-1] != cache.k_dim:
        lead = ", ".join(map(str, cache.batch_shape + ("C",)))
        raise ValueError(f"q {q.shape} does not fit the cache: it must be [{lead}, {cache.k_dim}]")
    if q.size == 0:  # C = 0 or a batch axis of 0: empty, as attend gives
        return np.zeros(q.shape[:-1] + (cache.v_dim,), cache.dtype)
    (k_quantizer, v_quantizer), (k_part, v_part) = cache._quantizers, cache._parts
    scores = np.concatenate([_key_scores(q, k_quantizer, k_part), q @ k_part.residual.swapaxes(-1, -2)], axis=-1)
    scores *= 1.0 / math.sqrt(cache.k_dim)  # [..., C, T]
    p, _ = attention_weights(scores, return_lse=False)  # [..., C, T]: attention_forward's softmax; its products read the codes
    held = cache.num_quantized
    return _value_output(p[..., :held], v_quantizer, v_part) + p[..., held:] @ v_part.residual  # [..., C, D_v]


def _key_scores(q, quantizer, part):
    """``q · k̂`` of the quantized positions from per-channel codes: ``q: [..., C, D]`` -> ``[..., C, Q]``."""
    codes = quantizer.codes(part.codes)  # [..., Q, D]
    codes = codes.reshape(codes.shape[:-2] + (-1, quantizer.group_size, quantizer.dim))  # [..., n, G, D]
    scaled = q[..., None, :, :] * part.scale[..., :, None, :]  # [..., n, C, D]
    scores = scaled @ codes.swapaxes(-1, -2)  # [..., n, C, G]
    if part.zero is not None:
        scores += (q @ part.zero.swapaxes(-1, -2)).swapaxes(-1, -2)[..., None]  # Σ_c q_c·zero_c, [..., n, C, 1]
    scores = np.moveaxis(scores, -3, -2)  # [..., C, n, G]
    return scores.reshape(scores.shape[:-2] + (-1,))  # [..., C, Q]


def _value_output(p, quantizer, part):
    """``p @ V̂`` of the quantized positions from per-token codes: ``p: [..., C, Q]`` -> ``[..., C, D_v]``."""
    g, n_groups = quantizer.group_size, quantizer.n_groups
    codes = quantizer.codes(part.codes)  # [..., Q, D]
    pad = n_groups * g - quantizer.dim
    codes = np.pad(codes, [(0, 0)] * (codes.ndim - 1) + [(0, pad)]) if pad else codes  # [..., Q, n_g·G]
    codes = np.moveaxis(codes.reshape(codes.shape[:-1] + (n_groups, g)), -2, -3)  # [..., n_g, Q, G]
    weighted = p[..., None, :, :] * np.moveaxis(part.scale, -1, -2)[..., :, None, :]  # [..., n_g, C, Q]
    out = np.moveaxis(weighted @ codes, -3, -2)  # [..., C, n_g, G]
    if part.zero is not None:
        out += (p @ part.zero)[..., None]  # Σ_s p_s·zero_s per group, [..., C, n_g, 1]
    return out.reshape(out.shape[:-2] + (-1,))[..., : quantizer.dim]  # [..., C, D_v]
