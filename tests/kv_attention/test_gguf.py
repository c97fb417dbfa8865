"""load_gguf and Tokenizer.from_gguf on a tiny Llama GGUF written here by gguf's own writer (no download)."""

import dataclasses

import gguf
import numpy as np
import pytest

import kv_attention as kv
import kv_attention.__main__ as cli

CONFIG = kv.ModelConfig(vocab_size=261, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, rope_theta=500.0,
                        rms_norm_eps=float(np.float32(1e-5)), tie_word_embeddings=True)  # the file's: float32
MERGES = ["Ġ t", "h e", "Ġt he"]
SPECIAL = ["<|im_start|>", "<|im_end|>"]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def byte_chars():
    """GPT-2's printable stand-in of each byte 0..255 (its ``bytes_to_unicode``), in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


TOKENS = byte_chars() + ["Ġt", "he", "Ġthe"] + SPECIAL  # 261


def permute(w, n_heads):
    """llama.cpp's ``convert_hf_to_gguf.py`` ``LlamaModel.permute``: HF's q/k rows to its adjacent-pair layout."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, weights, arch="llama", config=CONFIG, extra=None, pre="smollm"):
    """A GGUF of ``weights`` (HF names) as llama.cpp's converter writes it; the embedding Q8_0, the rest F32."""
    c, names = config, {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    parts = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_context_length(128)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_rope_freq_base(c.rope_theta)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_vocab_size(c.vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(TOKENS)
    writer.add_token_types([1] * (len(TOKENS) - 2) + [3, 3])
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(TOKENS.index("<|im_start|>"))
    writer.add_eos_token_id(TOKENS.index("<|im_end|>"))
    writer.add_chat_template(TEMPLATE)
    for key, value in (extra or {}).items():  # a str, or (value, GGUFValueType); a key written above is replaced
        writer.add_key_value(key, *value) if isinstance(value, tuple) else writer.add_string(key, value)
    for name, w in weights.items():
        if name.startswith("model.layers."):
            _, _, i, *rest = name.split(".")
            part = ".".join(rest[:-1])
            gguf_name = f"blk.{i}.{parts[part]}.weight"
            if part in ("self_attn.q_proj", "self_attn.k_proj"):
                w = permute(w, c.num_attention_heads if part.endswith("q_proj") else c.num_key_value_heads)
        else:
            gguf_name = names.get(name, name)
        if gguf_name == "token_embd.weight":
            qtype = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(gguf_name, gguf.quants.quantize(w, qtype), raw_dtype=qtype)  # [rows, bytes]
        else:
            writer.add_tensor(gguf_name, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """``(path, weights)``: the tiny model's file and the float32 weights written into it."""
    weights = kv.init_weights(CONFIG, seed=3)
    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", weights), weights


def test_load_gguf_gives_the_config_and_the_hf_weights_back(tiny):
    path, written = tiny
    config, weights = kv.load_gguf(path)
    assert config == dataclasses.replace(CONFIG, bos_token_id=TOKENS.index("<|im_start|>"),
                                         eos_token_id=TOKENS.index("<|im_end|>"))  # the tokenizer's, as HF's config
    assert weights.keys() == written.keys()
    for name, w in weights.items():
        assert w.dtype == np.float32 and w.shape == written[name].shape, name
        if name == "model.embed_tokens.weight":  # Q8_0: int8 q times a float16 scale d per 32 values, d = max / 127:
            step = np.abs(written[name]).reshape(-1, 32).max(axis=1) / 127  # within half a step, and 127 q of
            bound = step[:, None] * (0.5 + 127 * 2.0 ** -11)  # d's float16 rounding (a relative 2^-11)
            assert np.all(np.abs(w - written[name]).reshape(-1, 32) <= bound)
        else:  # F32, the q and k rows permuted back exactly
            np.testing.assert_array_equal(w, written[name], err_msg=name)


def rope_adjacent(x, position, theta):
    """llama.cpp's RoPE (``ggml_rope``, normal mode) of one head ``x [D]``: channels 2i and 2i + 1 rotate together."""
    d = x.shape[-1]
    angle = position * theta ** (-np.arange(0, d, 2) / d)
    even, odd = x[0::2], x[1::2]
    out = np.empty_like(x)
    out[0::2], out[1::2] = even * np.cos(angle) - odd * np.sin(angle), even * np.sin(angle) + odd * np.cos(angle)
    return out


def test_the_permutation_is_the_one_that_makes_the_two_ropes_agree(tiny):
    """llama.cpp's adjacent-pair RoPE of the file's q rows, then load_gguf's permutation back, is HF's rotate_half
    RoPE of the loaded q rows: the permutation is not only an inverse, it maps one RoPE onto the other."""
    path, written = tiny
    config, weights = kv.load_gguf(path)
    x = np.random.default_rng(0).standard_normal(config.hidden_size)
    d, position = config.head_dim, 7
    cos, sin = kv.model.rope_tables(np.array([position]), d, config.rope_theta, np.float64)
    for name, heads in (("q_proj", 4), ("k_proj", 2)):
        w_hf = weights[f"model.layers.1.self_attn.{name}.weight"].astype(np.float64)
        w_file = permute(w_hf, heads)  # as the file holds it
        file_heads = (w_file @ x).reshape(heads, d)
        in_file = np.stack([rope_adjacent(h, position, config.rope_theta) for h in file_heads])
        hf = kv.model.apply_rope((w_hf @ x).reshape(1, heads, 1, d), cos, sin).reshape(heads, d)
        back = kv.gguf.unpermute(in_file.reshape(heads * d, 1), heads).reshape(heads, d)
        np.testing.assert_allclose(back, hf, rtol=1e-12, atol=1e-12)


def test_load_gguf_refuses_another_architecture_a_type_it_cannot_read_and_a_non_gguf_file(tmp_path, tiny):
    _, written = tiny
    path = write_gguf(tmp_path / "gpt2.gguf", written, arch="gpt2")
    with pytest.raises(ValueError, match=r"gpt2\.gguf: general\.architecture is 'gpt2'; only 'llama'"):
        kv.load_gguf(path)
    f64 = dict(written, **{"model.norm.weight": written["model.norm.weight"].astype(np.float64)})
    path = write_gguf(tmp_path / "f64.gguf", f64)
    with pytest.raises(ValueError, match=r"f64\.gguf: tensor 'output_norm\.weight' is of quantization type F64, "
                                         "which gguf cannot dequantize"):
        kv.load_gguf(path)
    path = write_gguf(tmp_path / "scaled.gguf", written, extra={"llama.rope.scaling.type": "yarn"})
    with pytest.raises(ValueError, match=r"llama\.rope\.scaling\.type = 'yarn' is not supported"):
        kv.load_gguf(path)
    path = write_gguf(tmp_path / "llama3.gguf", dict(written, **{"rope_freqs.weight": np.ones(4, np.float32)}))
    with pytest.raises(ValueError, match=r"llama3\.gguf: tensor 'rope_freqs\.weight' is not one of a Llama model's"):
        kv.load_gguf(path)  # Llama 3.1's rope scaling factors
    (tmp_path / "text.gguf").write_text("not a model")
    with pytest.raises(ValueError, match=r"text\.gguf: not a readable GGUF file"):
        kv.load_gguf(tmp_path / "text.gguf")


def test_a_path_that_is_not_a_gguf_file_is_named(tmp_path, tiny):
    with pytest.raises(FileNotFoundError, match="missing.gguf"):
        kv.load_gguf(tmp_path / "missing.gguf")
    with pytest.raises(ValueError, match=f"^{tmp_path}: not a GGUF file but a directory$"):
        kv.load_gguf(tmp_path)
    with pytest.raises(ValueError, match="^/dev/null: not a GGUF file but a device, FIFO or socket$"):
        kv.load_gguf("/dev/null")
    data = tiny[0].read_bytes()
    for size in (0, 3, 4, 100, len(data) // 2):  # nothing, part of the magic, the magic alone, cut in a key, a tensor
        (tmp_path / "cut.gguf").write_bytes(data[:size])
        with pytest.raises(ValueError, match=r"cut\.gguf: not a readable GGUF file \("):
            kv.load_gguf(tmp_path / "cut.gguf")


U32, F32 = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32


@pytest.mark.parametrize("extra, message", [
    ({"llama.embedding_length": "32"}, r"llama\.embedding_length = '32' must be a positive integer"),
    ({"llama.block_count": (0, U32)}, r"llama\.block_count = 0 must be a positive integer"),
    ({"llama.attention.head_count": (0, U32)}, r"llama\.attention\.head_count = 0 must be a positive integer"),
    ({"llama.attention.head_count": (5, U32)}, r"llama\.attention\.head_count = 5 does not divide "
                                               r"llama\.embedding_length = 32"),
    ({"llama.attention.head_count_kv": (3, U32)}, r"llama\.attention\.head_count_kv = 3 does not divide "
                                                  r"llama\.attention\.head_count = 4"),
    ({"llama.attention.key_length": (7, U32)}, r"head_dim must be even for RoPE, got 7"),
    ({"llama.rope.freq_base": "500"}, r"llama\.rope\.freq_base = '500' must be a positive number"),
    ({"llama.rope.freq_base": (0.0, F32)}, r"llama\.rope\.freq_base = 0\.0 must be a positive number"),
    ({"llama.attention.layer_norm_rms_epsilon": (-1.0, F32)},
     r"llama\.attention\.layer_norm_rms_epsilon = -1\.0 must be a number >= 0"),
    ({"llama.vocab_size": (0, U32)}, r"llama\.vocab_size = 0 must be a positive integer"),
])
def test_a_metadata_key_of_the_wrong_type_or_an_impossible_value_is_named_with_the_path(tmp_path, tiny, extra,
                                                                                        message):
    path = write_gguf(tmp_path / "bad.gguf", tiny[1], extra=extra)
    with pytest.raises(ValueError, match=rf"^{tmp_path}/bad\.gguf: {message}"):
        kv.load_gguf(path)


def test_python_m_kv_attention_says_in_one_line_what_is_wrong_with_the_model_file(tmp_path, tiny, monkeypatch,
                                                                                  capsys):
    bad = write_gguf(tmp_path / "bad.gguf", tiny[1], extra={"llama.attention.head_count": (0, U32)})
    for path, error in ((tmp_path, "not a GGUF file but a directory"), ("/dev/null", "not a GGUF file but a device"),
                        (bad, "llama.attention.head_count = 0 must be a positive integer")):
        monkeypatch.setattr(cli, "smollm2_path", lambda: str(path))
        assert cli.main(["hi"]) == 1
        out, err = capsys.readouterr()
        assert out == "" and err.startswith(f"python -m kv_attention: {path}: {error}") and err.count("\n") == 1


def test_the_tokenizer_merges_bytes_by_rank_and_matches_special_tokens_whole(tiny):
    tok = kv.Tokenizer.from_gguf(tiny[0])
    ids = TOKENS.index
    assert tok.encode("the the") == [ids("t"), ids("he"), ids("Ġthe")]  # "the": only "h e" applies; " the": all 3
    assert tok.encode("<|im_start|>he") == [ids("<|im_start|>"), ids("he")]
    for text in ("the café 🙂\t\t  2024   ", "naïve ÆØÅ ​ x", "  \n\n  "):
        assert tok.decode(tok.encode(text)) == text
        assert tok.encode(text) == [ids(c) for c in byte_level(text, tok)]
    assert tok.eos_token_id == ids("<|im_end|>")


def byte_level(text, tok):
    """The tokens of ``text`` with the three merges applied by hand to GPT-2's pre-tokens (independent of BPE)."""
    chars, out = byte_chars(), []
    for piece, _ in tok.backend.pre_tokenizer.pre_tokenize_str(text):
        word = list(piece)
        for merge in MERGES:  # rank order: each merge everywhere before the next
            a, b = merge.split(" ")
            i = 0
            while i < len(word) - 1:
                if word[i] == a and word[i + 1] == b:
                    word[i:i + 2] = [a + b]
                i += 1
        out += word
    assert "".join(out) == "".join(chars[b] for b in text.encode())
    return out


def test_apply_chat_template_renders_the_files_own_template(tiny):
    tok = kv.Tokenizer.from_gguf(tiny[0])
    messages = [{"role": "user", "content": "the"}]
    text = tok.apply_chat_template(messages, tokenize=False)
    assert text == "<|im_start|>user\nthe<|im_end|>\n<|im_start|>assistant\n"
    assert tok.apply_chat_template(messages) == tok.encode(text)
    assert tok.apply_chat_template(messages, add_generation_prompt=False, tokenize=False).endswith("<|im_end|>\n")
    with pytest.raises(TypeError, match="messages must be a list of"):
        tok.apply_chat_template("the")


def test_another_pre_tokenizer_is_refused(tmp_path, tiny):
    path = write_gguf(tmp_path / "llama3.gguf", tiny[1], pre="llama-bpe")
    with pytest.raises(ValueError, match=r"llama3\.gguf: tokenizer\.ggml\.model is 'gpt2' and tokenizer\.ggml\.pre "
                                         "'llama-bpe'"):
        kv.Tokenizer.from_gguf(path)
