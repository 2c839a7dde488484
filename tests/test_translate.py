"""Translation on real-world input: blank, multi-break, unknown, over-long and badly encoded
lines; streaming, Ctrl-C, broken pipes and fail-fast model loading in ``aiayn translate``.

Everything runs on a smoke model: a sentencepiece model trained on 1,000 + 1,000 Multi30k training
sentences and a tiny randomly initialised Transformer (2+2 layers, d_model 32, ``max_positions=64``
so the long-line policies trigger on short lines), saved as a real bundle for the CLI.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

import aiayn as aiayn_package

from aiayn.checkpoint import CheckpointError, save_model
from aiayn.cli.main import app
from aiayn.config.schema import EOS_ID, UNK_ID, EvalConfig, TokenizerConfig, model_preset
from aiayn.data.readers import read_lines
from aiayn.inference.search import beam_search, greedy_decode
from aiayn.inference.runtimes import DecodeOptions, EagerDecoder
from aiayn.model import Transformer
from aiayn.inference.text import InputError, clean_line, read_input, split_long
from aiayn.tokenizer import Tokenizer, train_tokenizer
from aiayn.inference.translator import Translator
from support.host_speed import scaled
from support.model_wrappers import LogitBias
from support.text_cases import BREAKERS

REPO = Path(__file__).resolve().parents[1]
GREEDY = DecodeOptions(beam_size=1, max_len_b=5)
BEAM = DecodeOptions(beam_size=2, max_len_b=5)
#: Deadlines that only bound a hang: the tests wait on events (a line, a file, a process state).
HANG_S = 300
UNKNOWN = ["😀", "🚲", "☃", "\u0f00", "\U00010348", "\ufffd"]
SENTENCES = [
    "A man rides a bike.",
    "Two dogs play in the snow.",
    "A woman in a red dress is walking down the street.",
    "Children are playing soccer in a park.",
]


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def bundle(multi30k_mirror, tmp_path_factory) -> Path:
    """A model bundle directory: spm.model (vocab 500), model.safetensors, model.json."""
    d = tmp_path_factory.mktemp("bundle")
    text = d / "text.txt"
    lines = read_lines(multi30k_mirror / "train.en.gz")[:1000] + read_lines(multi30k_mirror / "train.de.gz")[:1000]
    text.write_text("\n".join(lines) + "\n", encoding="utf-8")
    spm_path = train_tokenizer([text], d / "spm", TokenizerConfig(vocab_size=500))
    tok = Tokenizer.load(spm_path)
    torch.manual_seed(0)
    cfg = model_preset("tiny", vocab_size=tok.vocab_size, d_model=32, n_heads=2, d_ff=64, n_layers=2,
                       max_positions=64, attention_backend="sdpa")  # fmt: skip
    model = Transformer(cfg)
    with torch.no_grad():
        model.tgt_embed.weight[EOS_ID] *= 4.0  # EOS likelier: short, varied outputs
    save_model(d / "model.safetensors", model.state_dict())
    (d / "model.json").write_text(json.dumps({"model": cfg.model_dump(mode="json")}), encoding="utf-8")
    text.unlink()
    (d / "spm.vocab").unlink()
    return d


@pytest.fixture(scope="module")
def translator(bundle) -> Translator:
    return Translator.from_dir(bundle, device="cpu")


@pytest.fixture(autouse=True)
def _outside_a_project(tmp_path, monkeypatch):
    """`aiayn translate` decodes with ./params.yaml's evaluate block; pytest runs in the repository (the main job's
    params.yaml): each test runs in an empty folder of its own."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture()
def warnings_seen():
    """Warnings logged on the ``aiayn`` logger during the test (the CLI turns propagation off)."""
    records: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("aiayn")
    handler, level = Collect(logging.WARNING), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield records
    logger.removeHandler(handler)
    logger.setLevel(level)


def cli(*args: str, input: bytes | None = None):
    return CliRunner().invoke(app, ["translate", *args], input=input)


def env() -> dict[str, str]:
    src = Path(aiayn_package.__file__).resolve().parents[1]  # the aiayn under test
    return {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1", "LC_ALL": "C"}


def aiayn(*args: str) -> list[str]:
    return [sys.executable, "-c", "import torch; torch.set_num_threads(1); from aiayn.cli.main import app; app()", *args]


def long_line(n_sentences: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(SENTENCES) for _ in range(n_sentences))


# --------------------------------------------------------------------------- 1. blank lines


def test_blank_lines_give_empty_lines(translator):
    out = translator.translate(["A dog runs.", "", "   ", "\t \u2028", "Two men."], GREEDY)
    assert len(out) == 5
    assert out[1:4] == ["", "", ""]
    assert out[0] and out[4]


def test_cli_blank_lines(bundle):
    r = cli("--model-dir", str(bundle), "--beam-size", "1", input=b"A dog runs.\n\nTwo men.\n   \n")
    assert r.exit_code == 0, r.output
    lines = r.stdout.split("\n")
    assert lines[-1] == "" and len(lines) == 5
    assert lines[1] == "" and lines[3] == "" and lines[0] and lines[2]


# --------------------------------------------------------------------------- 2. only \n ends a line


def test_cli_line_breakers_stay_inside_lines(bundle):
    data = "A dog\u2028runs.\nA man\x0crides\ra bike.\nTwo\u0085men\u2029walk.\r\n".encode()
    r = cli("--model-dir", str(bundle), "--beam-size", "1", input=data)
    assert r.exit_code == 0, r.output
    assert r.stdout.count("\n") == 3 and all(r.stdout.split("\n")[:3])
    for line in r.stdout.split("\n")[:3]:
        assert not any(ch in line for ch in BREAKERS), line


# --------------------------------------------------------------------------- 3. unknown input / output


@pytest.mark.parametrize("decoder", ["greedy", "beam"])
def test_unk_is_never_generated(translator, decoder):
    favour = LogitBias(translator.decoder.model, {UNK_ID: 1e4})  # UNK would win every slot
    src = torch.tensor([[10, 11, 12, EOS_ID], [20, 21, EOS_ID, 0]])
    if decoder == "greedy":
        out = greedy_decode(favour, src, max_len_b=4)
    else:
        out = beam_search(favour, src, beam_size=3, max_len_b=4)
    assert all(out) and not any(UNK_ID in o for o in out)
    text = Translator(translator.tokenizer, EagerDecoder(favour)).translate(["A dog runs.", "Two men."], GREEDY if decoder == "greedy" else BEAM)
    assert len(text) == 2 and not any("\u2047" in t for t in text)


def test_unknown_characters_are_dropped_counted_and_warned_once(translator, warnings_seen):
    lines = ["A dog 😀 runs ☃.", "☃ ☃", "A man rides a bike.", "🚲 A woman \u0f00 walks.", "\u2047?"]
    prep = translator.prepare(lines, GREEDY)
    assert prep.report.unknown_lines == 4
    assert prep.report.unknown_chars["☃"] == 3 and prep.report.unknown_chars["😀"] == 1
    assert not any(UNK_ID in u for u in prep.units)
    assert prep.spans[1][0] == prep.spans[1][1]  # nothing left to translate on line 2
    unknown_warnings = [r for r in warnings_seen if "does not know" in r.getMessage()]
    assert len(unknown_warnings) == 1 and unknown_warnings[0].getMessage().startswith("4 of 5 input line(s)")
    out = translator.translate(lines, GREEDY)
    assert len(out) == 5 and out[1] == "" and not any("\u2047" in t for t in out)
    # the known part of a line is translated as if the unknown characters were not there
    assert translator.translate(["A dog 😀 runs."], GREEDY) == translator.translate(["A dog runs."], GREEDY)


def test_surrogates_and_replacement_characters_do_not_crash(translator):
    out = translator.translate(["a\udcff\udcfe dog", "\ufffd"], GREEDY)  # stdin under surrogateescape
    assert len(out) == 2 and out[1] == ""


# --------------------------------------------------------------------------- 4. long lines


def test_limit_derives_from_the_model(translator):
    assert translator.decoder.model.max_side_tokens == 64
    # int(1.0 * n + 10) <= 63 -> n <= 53; the position table alone would allow 64
    assert translator.max_source_tokens(DecodeOptions(max_len_a=1.0, max_len_b=10)) == 53
    assert translator.max_source_tokens(DecodeOptions(max_len_a=0.0, max_len_b=10)) == 64
    assert translator.max_source_tokens(DecodeOptions(max_len_a=2.0, max_len_b=1)) == 31
    with pytest.raises(ValueError, match="leave no room"):
        translator.max_source_tokens(DecodeOptions(max_len_a=1.0, max_len_b=63))


def test_long_error_names_line_and_length(translator):
    limit = translator.max_source_tokens(GREEDY)
    lines = ["A dog.", long_line(12), "ok", long_line(15, seed=1)]
    n = len(translator.tokenizer.encode([lines[1]])[0]) + 1
    assert n > limit
    with pytest.raises(InputError, match=rf"input line 2 has {n} tokens .* at most {limit} .*1 more line"):
        translator.prepare(lines, GREEDY, long="error")
    with pytest.raises(InputError):
        translator.translate(lines, GREEDY)  # "error" is the library default
    assert EvalConfig().long_policy == "error" and EvalConfig().device == "auto"


def test_long_truncate_warns_per_line(translator, warnings_seen):
    lines = [long_line(12), "A dog.", long_line(15, seed=1)]
    prep = translator.prepare(lines, GREEDY, long="truncate")
    limit = prep.report.limit
    assert len(prep.units[0]) == limit and len(prep.units[2]) == limit
    assert [r.getMessage().split(":")[0] for r in warnings_seen] == ["input line 1", "input line 3"]
    assert len(translator.translate(lines, GREEDY, long="truncate")) == 3


def test_long_split_at_sentence_boundaries(translator):
    text = long_line(20)
    limit = translator.max_source_tokens(GREEDY)
    prep = translator.prepare(["A dog.", text], GREEDY, long="split")
    a, b = prep.spans[1]
    assert b - a > 1 and all(len(u) <= limit for u in prep.units)
    pieces = split_long(text, lambda t: len(translator.tokenizer.encode([t])[0]), limit - 1)
    assert " ".join(pieces) == text and all(p.endswith(".") for p in pieces)
    out = translator.translate(["A dog.", text], GREEDY, long="split")
    assert len(out) == 2 and out[1]


def test_cli_long_policies(bundle, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("A dog.\n" + long_line(12) + "\nTwo men.\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    r = cli(str(src), "-o", str(out), "--model-dir", str(bundle), "--beam-size", "1", "--long", "error")
    assert r.exit_code == 2 and "input line 2 has" in r.stderr and not out.exists()
    assert len(r.stderr.strip().splitlines()) == 1
    r = cli(str(src), "--model-dir", str(bundle), "--beam-size", "1")  # default: split
    assert r.exit_code == 0, r.output
    assert r.stdout.count("\n") == 3 and all(r.stdout.split("\n")[:3])
    r = cli(str(src), "--model-dir", str(bundle), "--beam-size", "1", "--long", "truncate")
    assert r.exit_code == 0 and r.stdout.count("\n") == 3


# --------------------------------------------------------------------------- 5. streaming


def test_chunks_come_in_input_order(translator):
    model = translator.decoder.model
    translator.decoder.model = model.double()
    try:
        lines = [SENTENCES[i % 4] if i % 5 else "" for i in range(40)]
        lines[7] = lines[7] + " " + " ".join(SENTENCES)
        prep = translator.prepare(lines, GREEDY, long="split")
        assert prep.spans[7][1] - prep.spans[7][0] > 1
        chunks = list(translator.translate_prepared(prep, GREEDY, chunk_tokens=50))
        assert len(chunks) > 3
        streamed = [line for chunk in chunks for line in chunk]
        assert streamed == translator.translate(lines, GREEDY, long="split")
        assert [i for i, t in enumerate(streamed) if not t] == [i for i in range(40) if i % 5 == 0]
    finally:
        translator.decoder.model = model.float()


def _big_input(path: Path, n: int) -> None:
    path.write_text("".join(f"{SENTENCES[i % 4]}\n" for i in range(n)), encoding="utf-8")


def _one_page_stdout() -> None:
    """Run in the child before exec (``preexec_fn``), when its stdout is already the pipe and nothing is
    written yet: the pipe shrinks to one page, so the child cannot run ahead of the test. 3000 lines
    translate to 500+ KB here, so until the test reads, the child is translating or blocked in a write:
    running, whatever the host's speed."""
    import fcntl

    fcntl.fcntl(1, fcntl.F_SETPIPE_SZ, 4096)


def _ctrl_c_ready_child() -> None:
    """``preexec_fn`` of the Ctrl-C tests: the default SIGINT disposition (a shell that starts jobs in the
    background, ``make test &`` or some CI runners, hands them SIGINT ignored, and Python then installs
    no Ctrl-C handler) and a one-page stdout pipe (``_one_page_stdout``)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    _one_page_stdout()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _state(pid: int) -> str:
    """The process state letter of ``/proc/<pid>/stat`` (R, S, T, Z, ...)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _interrupt_while_running(proc: subprocess.Popen) -> None:
    """Ctrl-C to ``proc`` at a moment it is certainly still running: stopped (SIGSTOP) first, so it
    cannot finish between the check and the signal; then SIGINT, held until SIGCONT resumes it."""
    proc.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + HANG_S
    while (state := _state(proc.pid)) not in ("T", "t", "Z"):
        assert time.monotonic() < deadline, f"the child did not stop (state {state})"
        time.sleep(0.01)
    assert state != "Z" and proc.poll() is None, "the translation ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGCONT)


def test_cli_pipe_to_head_exits_quietly(bundle, tmp_path):
    """``aiayn translate big.txt | head -n 3``: the reader leaves after three lines while the child still
    has most of its output to write (its stdout pipe is one page: ``_one_page_stdout``), and the child
    exits 141, quietly. That lines arrive before the translation ends is checked by the Ctrl-C test:
    it interrupts after the first line and finds far fewer than 3000 written."""
    src = tmp_path / "big.txt"
    _big_input(src, 3000)
    cmd = aiayn("translate", str(src), "--model-dir", str(bundle), "--beam-size", "4", "--max-tokens", "64")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env(), bufsize=0,
                            preexec_fn=_one_page_stdout)
    first = [proc.stdout.readline() for _ in range(3)]  # like `| head -n 3`
    assert proc.poll() is None  # it cannot have written its 500+ KB into a one-page pipe nobody reads
    proc.stdout.close()
    _, err = proc.communicate(timeout=HANG_S)
    err, rc = err.decode(), proc.returncode
    assert all(first) and "Traceback" not in err and "BrokenPipe" not in err, err
    assert rc == 141, err


@pytest.mark.parametrize("to_file", [False, True])
def test_cli_ctrl_c_exits_130_and_says_what_was_written(bundle, tmp_path, to_file):
    """Ctrl-C while the translation is under way (the first line read from stdout, or the first chunk in
    the temporary output file: an event, not a pause), delivered while the child certainly still runs
    (``_interrupt_while_running``): exit 130, one line saying what was written. To stdout that is a
    prefix of the 3000 lines, far from all of them: the output was streamed, not written at the end."""
    src = tmp_path / "big.txt"
    _big_input(src, 3000)
    out = tmp_path / "out.txt"
    cmd = aiayn("translate", str(src), "--model-dir", str(bundle), "--beam-size", "4", "--max-tokens", "64",
                *(["-o", str(out)] if to_file else []))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env(), bufsize=0,
                            preexec_fn=_ctrl_c_ready_child)
    try:
        if to_file:
            deadline = time.monotonic() + HANG_S
            # the first chunk is in the temporary sibling: translating, with more to come
            while not any(_size(p) for p in tmp_path.glob(".out.txt.*.tmp")):
                assert proc.poll() is None, proc.stderr.read().decode()
                assert time.monotonic() < deadline, "no chunk was written to the temporary output"
                time.sleep(0.05)
        else:
            assert proc.stdout.readline()  # translation under way
        _interrupt_while_running(proc)
        stdout, err = proc.communicate(timeout=HANG_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = err.decode()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    if to_file:
        assert f"nothing written to {out}" in err
        assert not out.exists() and not list(tmp_path.glob(".out.txt.*"))
    else:
        n = stdout.decode().count("\n") + 1  # + the line read above
        assert f"interrupted; {n} line(s) written to stdout" in err
        assert n < 3000, f"all {n} lines were written before Ctrl-C: not streamed"


# --------------------------------------------------------------------------- 6. bad bytes


def test_invalid_utf8_names_line_and_byte(bundle, tmp_path, warnings_seen):
    data = b"A dog.\nA m\xffan\xfe rides.\n"
    with pytest.raises(InputError, match=r"line 2, byte 3 of the line \(offset 10\): invalid UTF-8 b'\\xff'"):
        read_input(data, source="x.txt")
    assert read_input(data, errors="replace") == ["A dog.", "A m\ufffdan\ufffd rides."]
    assert [r.getMessage()[:60] for r in warnings_seen] == [
        "2 invalid UTF-8 sequence(s) replaced by U+FFFD (the first at <stdin>: line 2, byte 3"[:60]]
    src = tmp_path / "bad.txt"
    src.write_bytes(data)
    r = cli(str(src), "--model-dir", str(bundle), "--beam-size", "1")
    assert r.exit_code == 2 and f"{src}: line 2, byte 3 of the line" in r.stderr and r.stdout == ""
    r = cli("--model-dir", str(bundle), "--beam-size", "1", input=data)
    assert r.exit_code == 2 and "<stdin>: line 2" in r.stderr
    r = cli(str(src), "--model-dir", str(bundle), "--beam-size", "1", "--encoding-errors", "replace")
    assert r.exit_code == 0 and r.stdout.count("\n") == 2


# --------------------------------------------------------------------------- 7. fail fast on the model


@pytest.mark.parametrize("damage", ["bad json", "no model key", "bad field", "no weights", "wrong weights"])
def test_broken_bundle_is_one_clear_error(bundle, tmp_path, damage):
    broken = tmp_path / "model"
    broken.mkdir()
    for name in ("model.json", "model.safetensors", "spm.model"):
        (broken / name).write_bytes((bundle / name).read_bytes())
    meta = json.loads((bundle / "model.json").read_text())
    if damage == "bad json":
        (broken / "model.json").write_text('{"model": {"d_model": 32,')
    elif damage == "no model key":
        (broken / "model.json").write_text(json.dumps({"step": 1}))
    elif damage == "bad field":
        (broken / "model.json").write_text(json.dumps({"model": {**meta["model"], "n_heads": 5, "colour": 1}}))
    elif damage == "no weights":
        (broken / "model.safetensors").unlink()
    else:
        (broken / "model.json").write_text(json.dumps({"model": {**meta["model"], "d_ff": 80}}))
    r = cli("--model-dir", str(broken), input=b"A dog.\n")
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("aiayn translate: error: ") and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "KeyError" not in r.output and "Traceback" not in r.output
    with pytest.raises((CheckpointError, FileNotFoundError)):
        Translator.from_dir(broken)


def test_model_is_loaded_before_stdin_is_read(bundle, tmp_path):
    """stdin stays open (a pipe nobody writes to): the error must come without waiting for it."""
    broken = tmp_path / "model"
    broken.mkdir()
    (broken / "spm.model").write_bytes((bundle / "spm.model").read_bytes())
    (broken / "model.json").write_text("{not json")
    proc = subprocess.Popen(aiayn("translate", "--model-dir", str(broken)), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env())
    try:
        rc = proc.wait(timeout=60)
    finally:
        proc.kill()
        proc.stdin.close()
    err = proc.stderr.read().decode()
    assert rc == 2 and err.startswith(f"aiayn translate: error: {broken / 'model.json'}: not valid JSON"), err
    assert len(err.strip().splitlines()) == 1


def test_missing_model_is_still_a_clear_error(tmp_path):
    r = cli("--model-dir", str(tmp_path / "nope"), input=b"A dog.\n")
    assert r.exit_code == 2 and "model.json not found: train a model first" in r.stderr


def test_device_argument(bundle):
    assert Translator.from_dir(bundle, device="cpu").device.type == "cpu"
    auto = Translator.from_dir(bundle)  # "auto"
    assert auto.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            Translator.from_dir(bundle, device="cuda")
        r = cli("--model-dir", str(bundle), "--device", "cuda", input=b"A dog.\n")
        assert r.exit_code == 2 and "CUDA is not available" in r.stderr
    with pytest.raises(ValueError, match="unknown device"):
        Translator.from_dir(bundle, device="tpu9")


# --------------------------------------------------------------------------- 8b. n-best, scores, interactive, serving bundle


def test_cli_nbest_and_scores(bundle, translator):
    src = ["A dog runs.", "", "Two men walk in the snow."]
    data = "".join(f"{s}\n" for s in src).encode()
    beam = DecodeOptions(beam_size=2, max_len_b=5)
    want = next(translator.translate_prepared_nbest(translator.prepare(src, beam, long="split"), beam, n_best=2))
    r = cli("--model-dir", str(bundle), "--beam-size", "2", "--max-len-b", "5", "--nbest", "2", "--scores", input=data)
    assert r.exit_code == 0, r.output
    rows = [line.split("\t") for line in r.stdout.splitlines()]
    assert [int(k) for k, _, _ in rows] == [0, 0, 1, 2, 2]  # 2 hypotheses per line, one for the blank line
    got = [(int(k), float(score), text) for k, score, text in rows]
    expected = [(k, h.score, h.text) for k, hyps in enumerate(want) for h in hyps]
    assert [(k, t) for k, _, t in got] == [(k, t) for k, _, t in expected]
    assert [sc for _, sc, _ in got] == pytest.approx([sc for _, sc, _ in expected], abs=1e-6)
    plain = cli("--model-dir", str(bundle), "--beam-size", "2", "--max-len-b", "5", input=data)
    scored = cli("--model-dir", str(bundle), "--beam-size", "2", "--max-len-b", "5", "--scores", input=data)
    assert [line.split("\t")[1] for line in scored.stdout.splitlines()] == plain.stdout.splitlines()
    assert [t for k, _, t in got if k != 1][::2] == [x for x in plain.stdout.splitlines() if x]  # rank 0 = the 1-best
    bad = cli("--model-dir", str(bundle), "--beam-size", "2", "--nbest", "3", input=data)
    assert bad.exit_code == 2 and "--nbest 3 needs --beam-size 3 or more" in bad.stderr


@pytest.mark.parametrize("terminal", [False, True])
def test_cli_interactive_translates_each_line_as_it_is_entered(bundle, translator, terminal):
    """A pipe kept open with --interactive, or a terminal (a pty: interactive by default): each line's
    translation arrives before the next line is written, a bad line gets an empty line and goes on."""
    import pty
    import select

    cmd = aiayn("translate", "--model-dir", str(bundle), "--beam-size", "1", "--max-len-b", "5",
                *([] if terminal else ["--interactive"]))
    if terminal:
        master, slave = pty.openpty()
        proc = subprocess.Popen(cmd, stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env())
        os.close(slave)
        send = lambda b: os.write(master, b)  # noqa: E731
    else:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env())
        send = lambda b: (proc.stdin.write(b), proc.stdin.flush())  # noqa: E731

    def line() -> str:
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        assert ready, "no translation while the input stays open"
        return proc.stdout.readline().decode()

    try:
        got = []
        for text in ("A dog runs.", "Two men."):
            send(f"{text}\n".encode())
            got.append(line())
        send(b"A m\xffan.\n")
        got.append(line())
        send(b"\x04" if terminal else b"")  # Ctrl-D on a terminal; else close the pipe
        if not terminal:
            proc.stdin.close()
        rc = proc.wait(timeout=60)
    finally:
        proc.kill()
        if terminal:
            os.close(master)
    err = proc.stderr.read().decode()
    assert got == [t + "\n" for t in translator.translate(["A dog runs.", "Two men."], GREEDY)] + ["\n"], err
    assert rc == 0 and "line 3: error: <stdin line 3>: line 1, byte 3" in err, err
    assert ("Ctrl-D ends" in err) == terminal


def test_cli_bundle_translates_as_the_service_does(bundle, translator, tmp_path):
    from types import SimpleNamespace

    from support import tiny
    from aiayn.inference.load import BundlePredictor

    ct2 = tiny.ct2_bundle(tmp_path, SimpleNamespace(model=bundle), translator.tokenizer,
                          DecodeOptions(beam_size=2, max_len_b=5))
    src = ["A dog runs.", "", "Two men walk in the snow."]
    r = cli("--bundle", str(ct2), input="".join(f"{s}\n" for s in src).encode())
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines() == BundlePredictor(ct2).translate(src)  # the bundle's own decoding options
    r = cli("--bundle", str(ct2), "--checkpoint", str(bundle / "model.safetensors"), input=b"A dog.\n")
    assert r.exit_code == 2 and "exclude each other" in r.stderr
    r = cli("--bundle", str(tmp_path / "nope"), input=b"A dog.\n")
    assert r.exit_code == 2 and "not a serving bundle" in r.stderr


# --------------------------------------------------------------------------- 9. property test


def _random_line(rng: random.Random, vocab: list[str]) -> str:
    kind = rng.random()
    if kind < 0.1:
        return ""
    if kind < 0.2:
        return "".join(rng.choice([" ", "\t", *BREAKERS]) for _ in range(rng.randint(1, 5)))
    n = rng.randint(1, 400) if kind > 0.8 else rng.randint(1, 30)
    words = []
    for _ in range(n):
        r = rng.random()
        if r < 0.75:
            words.append(rng.choice(vocab))
        elif r < 0.85:
            words.append(rng.choice(UNKNOWN) * rng.randint(1, 3))
        elif r < 0.9:
            words.append(rng.choice([".", ",", ";", "!", "?", "-", "\u2047"]))
        else:  # any code point (surrogates included)
            words.append("".join(chr(rng.randint(1, 0x2FFFF)) for _ in range(rng.randint(1, 4))))
    seps = [" "] * 20 + BREAKERS + ["  ", "\t"]
    return "".join(w + rng.choice(seps) for w in words).strip(" ")


@pytest.mark.parametrize("long", ["split", "truncate"])
def test_property_random_unicode_lines(translator, long):
    rng = random.Random(1234)
    vocab = " ".join(SENTENCES).replace(".", "").split() + ["Hund", "Straße", "café", "naïve", "ﬁsh", "ＡＢＣ"]
    lines = [_random_line(rng, vocab) for _ in range(40)]
    lines = [ln.replace("\n", " ") for ln in lines]  # the caller's split: one item per line
    out = translator.translate(lines, GREEDY, long=long)
    assert len(out) == len(lines)
    for src, hyp in zip(lines, out):
        assert "\u2047" not in hyp and "\n" not in hyp and not any(ch in hyp for ch in BREAKERS)
        if not clean_line(src).strip():
            assert hyp == ""


# --------------------------------------------------------------------------- acceptance: 2,000 defective lines


def test_cli_2000_defective_lines_in_order(bundle, translator, tmp_path):
    rng = random.Random(7)
    vocab = " ".join(SENTENCES).replace(".", "").split()
    kinds = ["plain", "blank", "spaces", "breakers", "unknown", "long", "bad-bytes", "crlf"]
    chunks, expect_blank = [], []
    for i in range(2000):
        kind = kinds[i % len(kinds)] if i % 3 else rng.choice(kinds)
        text = " ".join(rng.choice(vocab) for _ in range(rng.randint(2, 12))) + "."
        if kind == "blank":
            text = ""
        elif kind == "spaces":
            text = " \t "
        elif kind == "breakers":
            text = text.replace(" ", rng.choice(BREAKERS), 2)
        elif kind == "unknown":
            text = f"{rng.choice(UNKNOWN)} {text} {rng.choice(UNKNOWN)}"
        elif kind == "long":
            text = long_line(rng.randint(10, 30), seed=i)
        raw = text.encode()
        if kind == "bad-bytes":
            raw = raw[:3] + b"\xff\xfe" + raw[3:]
        chunks.append(raw + (b"\r\n" if kind == "crlf" else b"\n"))
        expect_blank.append(kind in ("blank", "spaces"))
    src = tmp_path / "defects.txt"
    src.write_bytes(b"".join(chunks))
    out = tmp_path / "out.txt"
    args = ["translate", str(src), "-o", str(out), "--model-dir", str(bundle), "--beam-size", "1",
            "--max-len-b", "5", "--device", "cpu"]
    strict = subprocess.run(aiayn(*args), capture_output=True, env=env(), timeout=300)
    first_bad = next(i for i, c in enumerate(chunks) if b"\xff" in c) + 1
    assert strict.returncode == 2 and f"line {first_bad}, byte 3 of the line".encode() in strict.stderr
    assert not out.exists()
    bound = scaled(60)  # how long 2,000 lines may take: written for the fastest host, times the host factor
    t0 = time.perf_counter()
    r = subprocess.run(aiayn(*args, "--encoding-errors", "replace"), capture_output=True, env=env(),
                       timeout=bound + HANG_S)
    seconds = time.perf_counter() - t0
    err = r.stderr.decode()
    assert r.returncode == 0, err
    assert "Traceback" not in err
    assert len([ln for ln in err.splitlines() if "does not know" in ln]) == 1, err
    hyps = out.read_bytes().decode("utf-8").split("\n")
    assert hyps[-1] == "" and len(hyps) == 2001
    hyps = hyps[:-1]
    assert [not h for h in hyps] == expect_blank
    assert not any("\u2047" in h for h in hyps)
    # Same order as the input: equal to the in-process path with the same chunking (same batches).
    lines = read_input(src.read_bytes(), errors="replace")
    options = DecodeOptions(beam_size=1, max_len_b=5)
    prep = translator.prepare(lines, options, long="split")
    assert hyps == [h for c in translator.translate_prepared(prep, options, chunk_tokens=options.max_tokens) for h in c]
    assert seconds < bound, f"{seconds:.1f} s (bound {bound:.0f} s)"


# --------------------------------------------------------------------------- the evaluate stage


def test_evaluate_stage_uses_device_and_long_policy(bundle, tmp_path, monkeypatch):
    import shutil

    from aiayn.config.schema import params_from_dict
    from aiayn.stages import Layout
    from aiayn.stages import evaluate as evaluate_stage

    monkeypatch.setenv("AIAYN_TRACKING", "off")
    layout = Layout(tmp_path)
    shutil.copytree(bundle, layout.model)
    layout.prepared.mkdir(parents=True)
    (layout.prepared / "t.en").write_text("A dog runs.\nTwo men walk.\n", encoding="utf-8")
    (layout.prepared / "t.de").write_text("Ein Hund rennt.\nZwei Männer gehen.\n", encoding="utf-8")
    params = params_from_dict({"data": {"test_splits": ["t"]},
                               "evaluate": {"beam_size": 2, "max_len_b": 5, "device": "cpu"}})
    assert params.evaluate.long_policy == "error"
    evaluate_stage.run(params, layout)
    scores = json.loads((layout.eval / "scores.json").read_text())
    assert scores["device"] == "cpu" and scores["decode"]["long_policy"] == "error"
    assert (layout.eval / "t.hyp.de").read_text(encoding="utf-8").count("\n") == 2

    (layout.prepared / "t.en").write_text("A dog runs.\n" + long_line(12) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match="input line 2 has"):
        evaluate_stage.run(params, layout)  # a benchmark never changes silently
    split = params.model_copy(update={"evaluate": params.evaluate.model_copy(update={"long_policy": "split"})})
    evaluate_stage.run(split, layout)
    assert (layout.eval / "t.hyp.de").read_text(encoding="utf-8").count("\n") == 2


def test_cli_decodes_with_the_evaluate_block_of_params_yaml(bundle, tmp_path, monkeypatch):
    """Without decoding flags, `aiayn translate` on the model folder decodes as the evaluate stage did: the
    ``evaluate`` block of ``--params`` (default ``./params.yaml``); flags still win over it."""
    data = b"A dog runs.\nTwo men walk in the snow.\nA girl in a red coat plays with a ball on the beach.\n"
    flags = cli("--model-dir", str(bundle), "--beam-size", "2", "--len-penalty", "1.0", "--max-len-b", "3", input=data)
    built_in = cli("--model-dir", str(bundle), input=data)
    assert flags.exit_code == 0 and built_in.exit_code == 0 and flags.stdout != built_in.stdout  # the test can fail
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"evaluate": {"beam_size": 2, "len_penalty": 1.0, "max_len_b": 3}}))
    given = cli("--model-dir", str(bundle), "--params", str(params), input=data)
    assert given.exit_code == 0, given.output
    assert given.stdout == flags.stdout
    monkeypatch.chdir(tmp_path)  # ./params.yaml, as in a project
    assert cli("--model-dir", str(bundle), input=data).stdout == flags.stdout
    wins = cli("--model-dir", str(bundle), "--max-len-b", "50", "--beam-size", "4", "--len-penalty", "0.6", input=data)
    assert wins.stdout == built_in.stdout
    params.write_text("evaluate: {beam_size: 0}\n")
    bad = cli("--model-dir", str(bundle), input=data)
    assert bad.exit_code == 2 and "beam_size" in bad.stderr
