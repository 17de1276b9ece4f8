"""Tests of posenc.lab.data: the byte corpus, the batch samplers and the synthetic tasks."""

import dataclasses
import hashlib

import pytest
import torch

from posenc.lab.data import (
    Corpus,
    Task,
    associative_recall,
    copy_task,
    eval_windows,
    load_stdlib_corpus,
    passkey_retrieval,
    random_batch,
    stdlib_root,
)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --- the corpus ---------------------------------------------------------------------------------

# Five small top-level files (sorted: a b c d e), plus things the loader must ignore.
FILES = {
    "a.py": b"print('a')\n",
    "b.py": b"x = 1",  # no trailing newline: the loader adds the separator
    "c.py": b"",  # empty file: contributes only the separator
    "d.py": b"def d():\n    return 4\n",
    "e.py": b"# \xc3\xa9 utf-8 bytes kept as bytes\n",
}


@pytest.fixture
def tiny_root(tmp_path):
    for name, blob in FILES.items():
        (tmp_path / name).write_bytes(blob)
    (tmp_path / "notes.txt").write_bytes(b"not python")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "inner.py").write_bytes(b"not top level")
    return tmp_path


def joined(names):
    return b"".join(FILES[n] + b"\n" for n in names)


def as_bytes(t: torch.Tensor) -> bytes:
    return bytes(t.tolist())


def test_corpus_from_root_exact_bytes_and_split(tiny_root):
    corpus = load_stdlib_corpus(val_every=2, root=tiny_root)
    # files 0, 2, 4 in sorted order go to validation
    assert corpus.val_files == ("a.py", "c.py", "e.py")
    assert corpus.train_files == ("b.py", "d.py")
    assert as_bytes(corpus.val) == joined(corpus.val_files)
    assert as_bytes(corpus.train) == joined(corpus.train_files)
    assert corpus.train.dtype == torch.uint8 and corpus.val.dtype == torch.uint8
    assert corpus.train.dim() == 1 and corpus.val.dim() == 1
    assert corpus.root == str(tiny_root)


def test_corpus_fingerprint_is_sha256_of_train_then_val(tiny_root):
    corpus = load_stdlib_corpus(val_every=3, root=tiny_root)
    expected = hashlib.sha256(as_bytes(corpus.train) + as_bytes(corpus.val)).hexdigest()[:16]
    assert corpus.fingerprint == expected
    assert len(corpus.fingerprint) == 16 and int(corpus.fingerprint, 16) >= 0


@pytest.mark.parametrize("val_every", [2, 3, 5])
def test_corpus_val_every_is_respected(tiny_root, val_every):
    corpus = load_stdlib_corpus(val_every=val_every, root=tiny_root)
    names = sorted(FILES)
    assert corpus.val_files == tuple(names[::val_every])
    assert corpus.train_files == tuple(n for i, n in enumerate(names) if i % val_every)


def test_corpus_describe(tiny_root):
    corpus = load_stdlib_corpus(val_every=2, root=tiny_root)
    text = corpus.describe()
    assert text.startswith(f"2 train files ({corpus.train.numel():,} bytes), 3 validation files")
    assert str(tiny_root) in text and corpus.fingerprint in text
    assert "\n" not in text


def test_corpus_is_frozen(tiny_root):
    corpus = load_stdlib_corpus(val_every=2, root=tiny_root)
    assert isinstance(corpus, Corpus)
    with pytest.raises(dataclasses.FrozenInstanceError):
        corpus.fingerprint = "0" * 16


def test_stdlib_corpus_splits_by_file():
    root = stdlib_root()
    corpus = load_stdlib_corpus()
    all_files = sorted(p.name for p in root.glob("*.py"))
    assert corpus.root == str(root)
    assert set(corpus.train_files).isdisjoint(corpus.val_files)
    assert sorted(corpus.train_files + corpus.val_files) == all_files
    assert list(corpus.train_files) == sorted(corpus.train_files)
    assert list(corpus.val_files) == sorted(corpus.val_files)
    assert corpus.val_files == tuple(all_files[::10])  # default val_every=10
    sizes = {p.name: p.stat().st_size + 1 for p in root.glob("*.py")}  # + the newline separator
    assert corpus.train.numel() == sum(sizes[n] for n in corpus.train_files)
    assert corpus.val.numel() == sum(sizes[n] for n in corpus.val_files)


def test_stdlib_corpus_val_every_is_respected():
    a, b = load_stdlib_corpus(val_every=10), load_stdlib_corpus(val_every=4)
    n = len(a.train_files) + len(a.val_files)
    assert len(a.val_files) == -(-n // 10)
    assert len(b.val_files) == -(-n // 4)
    assert a.fingerprint != b.fingerprint  # the split is part of what is fingerprinted


def test_stdlib_corpus_fingerprint_is_stable():
    first = load_stdlib_corpus()
    load_stdlib_corpus.cache_clear()  # force a second read from disk
    second = load_stdlib_corpus()
    assert second is not first
    assert second.fingerprint == first.fingerprint
    assert torch.equal(second.train, first.train) and torch.equal(second.val, first.val)


@pytest.mark.parametrize("val_every", [1, 0, -3, 2.5, "10"])
def test_corpus_rejects_bad_val_every(tiny_root, val_every):
    with pytest.raises(ValueError, match=rf"val_every must be an int >= 2, got {val_every!r}"):
        load_stdlib_corpus(val_every=val_every, root=tiny_root)


def test_corpus_rejects_too_few_files(tiny_root):
    with pytest.raises(ValueError, match=r"holds 5 \.py files; need at least val_every=6"):
        load_stdlib_corpus(val_every=6, root=tiny_root)


# --- random_batch and eval_windows ---------------------------------------------------------------


def test_random_batch_windows_are_shifted_slices(device):
    data = torch.arange(100)  # token id == index, so each window reveals its start
    x, y = random_batch(data, 8, 12, gen(0), device=device)
    assert x.shape == y.shape == (8, 12)
    assert x.dtype == y.dtype == torch.int64
    assert x.device.type == device.type and y.device.type == device.type
    x, y = x.cpu(), y.cpu()
    starts = x[:, 0]
    assert int(starts.min()) >= 0 and int(starts.max()) <= 100 - 12 - 1
    torch.testing.assert_close(x, starts[:, None] + torch.arange(12), rtol=0, atol=0)
    torch.testing.assert_close(y, x + 1, rtol=0, atol=0)  # y[:, t] = data[start + t + 1]


def test_random_batch_on_bytes():
    data = torch.tensor(list(b"hello world, hello bytes"), dtype=torch.uint8)
    x, y = random_batch(data, 4, 5, gen(1))
    assert x.dtype == torch.int64
    full = data.long()
    for row_x, row_y in zip(x, y):
        s = next(i for i in range(data.numel() - 5) if torch.equal(full[i : i + 6], torch.cat([row_x, row_y[-1:]])))
        torch.testing.assert_close(row_y, full[s + 1 : s + 6], rtol=0, atol=0)


def test_random_batch_is_reproducible_and_advances_the_generator(device):
    data = torch.arange(1000) % 256
    a = random_batch(data, 4, 16, gen(7), device=device)
    b = random_batch(data, 4, 16, gen(7), device=device)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    g = gen(7)
    first, second = random_batch(data, 4, 16, g), random_batch(data, 4, 16, g)
    assert not torch.equal(first[0], second[0])
    assert not torch.equal(random_batch(data, 4, 16, gen(8))[0], first[0])


def test_random_batch_reaches_the_last_window():
    data = torch.arange(6)  # seq_len 4: starts 0 and 1 are the only windows
    x, y = random_batch(data, 200, 4, gen(0))
    assert set(x[:, 0].tolist()) == {0, 1}
    assert int(y.max()) == 5


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(data=torch.arange(20).view(4, 5)), r"data must be a 1-D tensor of token ids, got torch.Size\(\[4, 5\]\)"),
        (dict(data=list(range(20))), "data must be a 1-D tensor of token ids, got list"),
        (dict(batch_size=0), "batch_size must be a positive int, got 0"),
        (dict(batch_size=True), "batch_size must be a positive int, got True"),
        (dict(seq_len=-1), "seq_len must be a positive int, got -1"),
        (dict(seq_len=2.0), "seq_len must be a positive int, got 2.0"),
        (dict(seq_len=20), "data has 20 tokens; a window of seq_len=20 needs 21"),
    ],
)
def test_random_batch_bad_inputs(kwargs, message):
    args = dict(data=torch.arange(20), batch_size=2, seq_len=4) | kwargs
    with pytest.raises(ValueError, match=message):
        random_batch(args["data"], args["batch_size"], args["seq_len"], gen())


def test_eval_windows_deterministic_evenly_spaced_and_in_range(device):
    n, T, w = 1000, 32, 9
    data = torch.arange(n)
    x, y = eval_windows(data, T, w, device=device)
    x2, y2 = eval_windows(data, T, w, device=device)
    torch.testing.assert_close((x, y), (x2, y2), rtol=0, atol=0)
    assert x.shape == y.shape == (w, T) and x.dtype == torch.int64
    assert x.device.type == device.type
    x, y = x.cpu(), y.cpu()
    starts = x[:, 0]
    assert int(starts[0]) == 0 and int(starts[-1]) == n - T - 1  # first and last windows covered
    gaps = starts.diff()
    assert int(gaps.min()) >= (n - T - 1) // (w - 1) - 1 and int(gaps.max()) <= (n - T - 1) // (w - 1) + 1
    torch.testing.assert_close(x, starts[:, None] + torch.arange(T), rtol=0, atol=0)
    torch.testing.assert_close(y, x + 1, rtol=0, atol=0)


def test_eval_windows_frozen_starts():
    x, _ = eval_windows(torch.arange(21), 4, 5)
    assert x[:, 0].tolist() == [0, 4, 8, 12, 16]
    x, _ = eval_windows(torch.arange(10), 9, 3)  # only one window fits: all three are it
    assert x[:, 0].tolist() == [0, 0, 0]
    x, _ = eval_windows(torch.arange(50), 4, 1)
    assert x[:, 0].tolist() == [0]


def test_eval_windows_bad_inputs():
    with pytest.raises(ValueError, match="data has 4 tokens; a window of seq_len=4 needs 5"):
        eval_windows(torch.arange(4), 4, 1)
    with pytest.raises(ValueError, match="seq_len must be a positive int, got 0"):
        eval_windows(torch.arange(10), 0, 1)
    with pytest.raises(ValueError, match="data must be a 1-D tensor"):
        eval_windows(torch.arange(10)[None], 4, 1)


def test_eval_windows_num_windows_error_names_num_windows():
    # Regression test: a bad num_windows was once reported as "batch_size must be a positive int".
    with pytest.raises(ValueError, match="num_windows must be a positive int, got 0"):
        eval_windows(torch.arange(10), 4, 0)


def test_eval_windows_stay_in_range_beyond_float32_integers():
    # Regression test: window starts once came from a float32 linspace, which rounded the last
    # start of a corpus above 2**24 tokens past the end of the data (IndexError).
    T = 1
    data = torch.zeros(2**24 + 3 + T + 1, dtype=torch.uint8)  # last valid start = 2**24 + 3
    x, y = eval_windows(data, T, 2)
    assert x.shape == (2, T)


# --- synthetic tasks ------------------------------------------------------------------------------


def full_sequences(task: Task) -> torch.Tensor:
    return torch.cat([task.inputs, task.targets[:, -1:]], dim=1)  # (B, T + 1)


def check_task_layout(task: Task, B: int, T: int):
    assert task.inputs.shape == task.targets.shape == task.mask.shape == (B, T)
    assert task.inputs.dtype == task.targets.dtype == torch.int64
    assert task.mask.dtype == torch.bool
    torch.testing.assert_close(task.inputs[:, 1:], task.targets[:, :-1], rtol=0, atol=0)  # next-token targets


def test_copy_task():
    B, L = 6, 7
    task = copy_task(B, L, gen(0))
    check_task_layout(task, B, 2 * L)
    for row in range(B):
        text = task.text(row)
        assert len(text) == 2 * L + 1 and text[L] == "|"
        first, second = text[:L], text[L + 1 :]
        assert first == second and set(first) <= set("abcdefghijklmnopqrstuvwxyz")
    # the mask covers exactly the copy: the targets at t = L .. 2L-1 are bytes L+1 .. 2L
    expected = torch.zeros(B, 2 * L, dtype=torch.bool)
    expected[:, L:] = True
    assert torch.equal(task.mask, expected)
    torch.testing.assert_close(task.targets[:, L:], task.inputs[:, :L], rtol=0, atol=0)


def test_copy_task_frozen_layout():
    task = copy_task(1, 1, gen(0))
    text = task.text()
    assert len(text) == 3 and text[1] == "|" and text[0] == text[2]
    assert task.mask.tolist() == [[False, True]]


def test_copy_task_reproducible():
    a, b, c = copy_task(3, 5, gen(3)), copy_task(3, 5, gen(3)), copy_task(3, 5, gen(4))
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.mask, b.mask)
    assert not torch.equal(a.inputs, c.inputs)


@pytest.mark.parametrize("num_pairs", [1, 4, 26])
def test_associative_recall(num_pairs):
    B = 8
    task = associative_recall(B, num_pairs, gen(num_pairs))
    check_task_layout(task, B, 2 * num_pairs + 2)
    for row in range(B):
        text = task.text(row)
        body, query = text[: 2 * num_pairs], text[2 * num_pairs :]
        assert len(query) == 3 and query[0] == "|"
        keys, values = body[0::2], body[1::2]
        assert len(set(keys)) == num_pairs and set(keys) <= set("abcdefghijklmnopqrstuvwxyz")
        assert set(values) <= set("0123456789")
        table = dict(zip(keys, values))
        assert query[1] in table
        assert query[2] == table[query[1]]  # the answer is the value paired with the query key
        assert task.targets[row, -1] == ord(table[query[1]])
    expected = torch.zeros(B, 2 * num_pairs + 2, dtype=torch.bool)
    expected[:, -1] = True  # only the last target (the answer) is scored
    assert torch.equal(task.mask, expected)


def test_associative_recall_reproducible():
    a, b = associative_recall(4, 5, gen(11)), associative_recall(4, 5, gen(11))
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)


@pytest.mark.parametrize("length, num_digits", [(200, 5), (300, 3), (97, 8)])
def test_passkey_retrieval(length, num_digits):
    B = 5
    task = passkey_retrieval(B, length, gen(0), num_digits=num_digits)
    check_task_layout(task, B, length - 1)
    for row in range(B):
        text = task.text(row)
        assert len(text) == length
        answer = text[-num_digits:]
        assert answer.isdigit() and len(answer) == num_digits
        assert f"The pass key is {answer}. Remember it. " in text  # the needle holds the answer
        assert text[:-num_digits].endswith(" What is the pass key? The pass key is ")
    expected = torch.zeros(B, length - 1, dtype=torch.bool)
    expected[:, -num_digits:] = True  # the mask covers exactly the digits of the answer
    assert torch.equal(task.mask, expected)
    assert all(chr(c) in "0123456789" for c in task.targets[task.mask].tolist())


def test_passkey_retrieval_minimum_length_and_depths():
    num_digits = 5
    overhead = len("The pass key is . Remember it. ") + len(" What is the pass key? The pass key is ") + 2 * num_digits
    task = passkey_retrieval(2, overhead, gen(0))  # no filler at all
    assert len(task.text(0)) == overhead and task.text(0).startswith("The pass key is ")
    task = passkey_retrieval(32, 400, gen(0))
    depths = {task.text(r).index("The pass key is ") for r in range(32)}
    assert len(depths) > 1  # the needle is hidden at varying depths


@pytest.mark.parametrize("depth", [0, 0.25, 0.5, 1.0])
def test_passkey_retrieval_at_a_fixed_depth(depth):
    """``depth`` puts the needle after round(depth * F) of the F filler bytes, in every row."""
    num_digits, length = 3, 300
    overhead = len("The pass key is . Remember it. ") + len(" What is the pass key? The pass key is ") + 2 * num_digits
    filler = length - overhead
    task = passkey_retrieval(8, length, gen(0), num_digits=num_digits, depth=depth)
    check_task_layout(task, 8, length - 1)
    for row in range(8):
        text = task.text(row)
        assert len(text) == length and text.index("The pass key is ") == round(depth * filler)
        assert f"The pass key is {text[-num_digits:]}. Remember it. " in text
    assert len({task.text(r)[-num_digits:] for r in range(8)}) > 1  # the keys are still random
    at_end = passkey_retrieval(1, length, gen(0), num_digits=num_digits, depth=1.0).text(0)
    assert at_end[:-num_digits].endswith(". Remember it.  What is the pass key? The pass key is ")


@pytest.mark.parametrize("depth", [-0.1, 1.5, "half", True, float("nan")])
def test_passkey_retrieval_bad_depth(depth):
    with pytest.raises(ValueError, match=r"depth must be None \(random\) or a number in \[0, 1\].*got"):
        passkey_retrieval(2, 200, gen(), depth=depth)


def test_passkey_retrieval_too_short():
    overhead = len("The pass key is . Remember it. ") + len(" What is the pass key? The pass key is ") + 2 * 5
    with pytest.raises(ValueError, match=f"length must be at least {overhead} for num_digits=5, got {overhead - 1}"):
        passkey_retrieval(1, overhead - 1, gen())


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: copy_task(0, 3, gen()), "batch_size must be a positive int, got 0"),
        (lambda: copy_task(2, 0, gen()), "length must be a positive int, got 0"),
        (lambda: copy_task(2, True, gen()), "length must be a positive int, got True"),
        (lambda: associative_recall(2, 0, gen()), "num_pairs must be a positive int, got 0"),
        (lambda: associative_recall(2, 27, gen()), "num_pairs must be at most 26 .*got 27"),
        (lambda: associative_recall(-1, 3, gen()), "batch_size must be a positive int, got -1"),
        (lambda: passkey_retrieval(2, 200, gen(), num_digits=0), "num_digits must be a positive int, got 0"),
        (lambda: passkey_retrieval(2, 200.0, gen()), r"length must be a positive int, got 200\.0"),
    ],
)
def test_synthetic_task_bad_inputs(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize(
    "task", [copy_task(2, 4, gen(1)), associative_recall(2, 3, gen(1)), passkey_retrieval(2, 120, gen(1))]
)
def test_task_text_round_trips(task):
    full = full_sequences(task)
    for row in range(full.shape[0]):
        text = task.text(row)
        assert text.encode("latin-1") == bytes(full[row].tolist())
        assert len(text) == task.inputs.shape[1] + 1


def test_task_text_frozen_example():
    task = Task(
        inputs=torch.tensor([list(b"ab|a")]), targets=torch.tensor([list(b"b|a1")]),
        mask=torch.tensor([[False, False, False, True]]),
    )
    assert task.text() == "ab|a1"
