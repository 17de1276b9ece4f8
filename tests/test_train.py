"""Tests of posenc.lab.train: the learning-rate schedule, the training loop and the evaluation."""

import math

import pytest
import torch
from torch import nn

from posenc.lab.data import eval_windows
from posenc.lab.lm import LMConfig, TinyLM, next_token_loss
from posenc.naive import BinaryPE
from posenc.lab.train import EvalResult, TrainConfig, TrainResult, evaluate, evaluate_lengths, lr_at, train

TINY = dict(d_model=32, n_layer=1, n_head=2, max_len=32)


def tiny_lm(position="nope") -> TinyLM:
    return TinyLM(LMConfig(**TINY), position)


def random_bytes(n: int = 2000, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).to(torch.uint8)


def repetitive_bytes() -> torch.Tensor:
    return torch.tensor(list(b"abcd" * 500), dtype=torch.uint8)


def quick_cfg(**kwargs) -> TrainConfig:
    return TrainConfig(**(dict(steps=8, batch_size=4, seq_len=16, warmup_steps=2, progress=False) | kwargs))


# --- TrainConfig ---------------------------------------------------------------------------------


def test_train_config_defaults_are_valid():
    cfg = TrainConfig()
    assert cfg.steps == 300 and cfg.warmup_steps == 30 and 0 < cfg.min_lr_ratio < 1
    TrainConfig(steps=5, warmup_steps=0)
    TrainConfig(steps=5, warmup_steps=5, min_lr_ratio=0.0, grad_clip=0.0)
    TrainConfig(steps=5, warmup_steps=5, min_lr_ratio=1.0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(steps=0), "TrainConfig.steps must be a positive int, got 0"),
        (dict(steps=10.0), r"TrainConfig.steps must be a positive int, got 10\.0"),
        (dict(batch_size=True), "TrainConfig.batch_size must be a positive int, got True"),
        (dict(seq_len=-4), "TrainConfig.seq_len must be a positive int, got -4"),
        (dict(steps=10, warmup_steps=11), r"TrainConfig.warmup_steps must be an int in 0..steps=10, got 11"),
        (dict(steps=10, warmup_steps=-1), r"TrainConfig.warmup_steps must be an int in 0..steps=10, got -1"),
        (dict(steps=10, warmup_steps=2.0), r"TrainConfig.warmup_steps must be an int in 0..steps=10, got 2\.0"),
        (dict(lr=0.0), r"TrainConfig.lr must be > 0, got 0\.0"),
        (dict(lr=float("nan")), "TrainConfig.lr must be > 0, got nan"),
        (dict(min_lr_ratio=1.5), r"TrainConfig.min_lr_ratio must be in \[0, 1\], got 1\.5"),
        (dict(min_lr_ratio=-0.1), r"TrainConfig.min_lr_ratio must be in \[0, 1\], got -0\.1"),
        (dict(grad_clip=-1.0), r"TrainConfig.grad_clip must be >= 0, got -1\.0"),
    ],
)
def test_train_config_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**kwargs)


# --- lr_at ---------------------------------------------------------------------------------------


def closed_form_lr(step: int, steps: int, warmup: int, lr: float, ratio: float) -> float:
    """Warmup then cosine decay, written as cos^2 (0.5 * (1 + cos x) = cos^2(x / 2))."""
    if step < warmup:
        return lr * (step + 1) / warmup
    span = steps - warmup - 1
    frac = (step - warmup) / span if span > 0 else 0.0
    return ratio * lr + (1 - ratio) * lr * math.cos(math.pi * frac / 2) ** 2


@pytest.mark.parametrize(
    "steps, warmup, lr, ratio", [(100, 10, 3e-3, 0.1), (101, 10, 1.0, 0.0), (7, 0, 0.5, 0.5), (5, 5, 2.0, 0.1)]
)
def test_lr_at_matches_closed_form(steps, warmup, lr, ratio):
    cfg = TrainConfig(steps=steps, warmup_steps=warmup, lr=lr, min_lr_ratio=ratio)
    for step in range(steps):
        assert lr_at(step, cfg) == pytest.approx(closed_form_lr(step, steps, warmup, lr, ratio), rel=1e-12, abs=1e-15)


def test_lr_at_frozen_values():
    cfg = TrainConfig(steps=101, warmup_steps=10, lr=1.0, min_lr_ratio=0.1)
    assert lr_at(0, cfg) == pytest.approx(0.1)  # lr / warmup_steps at the first step
    assert lr_at(4, cfg) == pytest.approx(0.5)
    assert lr_at(9, cfg) == pytest.approx(1.0)  # last warmup step reaches the peak
    assert lr_at(10, cfg) == pytest.approx(1.0)  # decay starts at the peak
    assert lr_at(55, cfg) == pytest.approx(0.55)  # half-way through the decay: mean of peak and floor
    assert lr_at(100, cfg) == pytest.approx(0.1)  # last step: min_lr_ratio * lr


def test_lr_at_shape_of_the_schedule():
    cfg = TrainConfig(steps=60, warmup_steps=12, lr=3e-3, min_lr_ratio=0.2)
    lrs = [lr_at(s, cfg) for s in range(cfg.steps)]
    warm, decay = lrs[:12], lrs[12:]
    assert all(a < b for a, b in zip(warm, warm[1:]))
    assert all(a >= b for a, b in zip(decay, decay[1:]))
    assert max(lrs) == pytest.approx(cfg.lr) and min(lrs[12:]) == pytest.approx(0.2 * cfg.lr)
    assert all(0 < v <= cfg.lr * (1 + 1e-12) for v in lrs)  # lr * 12 / 12 may round one ulp up


def test_lr_at_edge_configurations():
    assert lr_at(0, TrainConfig(steps=1, warmup_steps=0, lr=0.5)) == pytest.approx(0.5)
    flat = TrainConfig(steps=20, warmup_steps=0, lr=0.5, min_lr_ratio=1.0)
    assert [lr_at(s, flat) for s in range(20)] == pytest.approx([0.5] * 20)
    all_warmup = TrainConfig(steps=4, warmup_steps=4, lr=1.0)
    assert [lr_at(s, all_warmup) for s in range(4)] == pytest.approx([0.25, 0.5, 0.75, 1.0])


@pytest.mark.parametrize("step", [-1, 10, 11])
def test_lr_at_rejects_steps_outside_the_run(step):
    with pytest.raises(ValueError, match=rf"step must be in 0..9, got {step}"):
        lr_at(step, TrainConfig(steps=10, warmup_steps=2))


# --- TrainResult ---------------------------------------------------------------------------------


def naive_running_mean(values, window):
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1) : i + 1]
        out.append(sum(chunk) / len(chunk))
    return out


@pytest.mark.parametrize("window", [1, 3, 20, 100])
def test_smoothed_matches_naive_running_mean(window):
    losses = torch.rand(57, generator=torch.Generator().manual_seed(0), dtype=torch.float64).mul(5).tolist()
    got = TrainResult(losses=losses).smoothed(window)
    torch.testing.assert_close(
        torch.tensor(got, dtype=torch.float64), torch.tensor(naive_running_mean(losses, window), dtype=torch.float64),
        rtol=1e-12, atol=1e-12,
    )


def test_smoothed_frozen_values_and_default_window():
    assert TrainResult(losses=[1.0, 3.0, 5.0, 7.0]).smoothed(2) == pytest.approx([1.0, 2.0, 4.0, 6.0])
    assert TrainResult(losses=[]).smoothed() == []
    losses = list(map(float, range(30)))
    assert TrainResult(losses=losses).smoothed() == pytest.approx(naive_running_mean(losses, 20))


@pytest.mark.parametrize("window", [0, -1])
def test_smoothed_rejects_a_non_positive_window(window):
    # Regression test: window=0 once died with ZeroDivisionError and window=-1 with IndexError.
    with pytest.raises(ValueError, match="window"):
        TrainResult(losses=[1.0, 2.0, 3.0]).smoothed(window)


# --- train ---------------------------------------------------------------------------------------


def test_train_is_bit_for_bit_repeatable_on_cpu():
    data, cfg = random_bytes(), quick_cfg()
    a, b = tiny_lm(), tiny_lm()
    ra, rb = train(a, data, cfg), train(b, data, cfg)
    assert ra.losses == rb.losses  # exact float equality
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(pa, pb), name
    assert len(ra.losses) == cfg.steps and all(math.isfinite(v) for v in ra.losses)
    assert ra.lrs == [lr_at(s, cfg) for s in range(cfg.steps)]
    assert ra.seconds > 0


def test_train_seed_changes_the_data_order():
    data = random_bytes()
    ra = train(tiny_lm(), data, quick_cfg(seed=0))
    rb = train(tiny_lm(), data, quick_cfg(seed=1))
    assert ra.losses != rb.losses


def test_train_changes_the_parameters():
    model, before = tiny_lm(), tiny_lm()
    train(model, random_bytes(), quick_cfg(steps=3))
    assert not torch.equal(model.tok.weight, before.tok.weight)


def test_train_reduces_loss_on_an_easy_sequence(device):
    model = tiny_lm().to(device)
    cfg = quick_cfg(steps=40, warmup_steps=4, lr=1e-2)
    result = train(model, repetitive_bytes(), cfg)
    smooth = result.smoothed(5)
    assert result.losses[0] > 4.0  # about ln(256) = 5.5 at initialisation
    assert smooth[-1] < 0.5 * result.losses[0]
    assert next(model.parameters()).device.type == device.type
    after = evaluate(model, repetitive_bytes(), 16, num_windows=4)
    assert after.loss < 0.5 * result.losses[0]


def test_train_accepts_any_logits_module():
    class Bigram(nn.Module):  # no ``config``: no max_len check
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.table = nn.Embedding(256, 256)

        def forward(self, idx):
            return self.table(idx)  # (B, T, V)

    result = train(Bigram(), repetitive_bytes(), quick_cfg(steps=20, lr=5e-2, weight_decay=0.0))
    assert result.losses[-1] < result.losses[0]


def test_train_rejects_seq_len_beyond_max_len():
    with pytest.raises(ValueError, match=r"cfg.seq_len=33 exceeds the model's max_len=32"):
        train(tiny_lm(), random_bytes(), quick_cfg(seq_len=33))


def test_train_rejects_data_too_short():
    with pytest.raises(ValueError, match="data has 10 tokens; a window of seq_len=16 needs 17"):
        train(tiny_lm(), random_bytes(10), quick_cfg())


# --- evaluate ------------------------------------------------------------------------------------


def test_evaluate_shapes_and_mean(device):
    model = tiny_lm().to(device)
    res = evaluate(model, random_bytes(), 16, num_windows=6, batch_size=4)
    assert isinstance(res, EvalResult)
    assert res.seq_len == 16 and res.num_windows == 6
    assert res.loss_per_position.shape == (16,) and res.loss_per_position.dtype == torch.float32
    assert res.loss_per_position.device.type == "cpu"
    assert isinstance(res.loss, float)
    assert res.loss == pytest.approx(float(res.loss_per_position.double().mean()), rel=1e-6)
    assert res.loss == pytest.approx(math.log(256), rel=0.05)  # an untrained byte model is near uniform


def test_evaluate_matches_hand_computation(device):
    model = tiny_lm().double().to(device)
    data, T, n = random_bytes(1500, seed=3), 20, 7
    res = evaluate(model, data, T, num_windows=n, batch_size=3)  # batches of 3, 3, 1
    x, y = eval_windows(data, T, n, device=device)
    with torch.no_grad():
        expected = next_token_loss(model(x), y, reduction="none").mean(0).cpu()  # (T,)
    torch.testing.assert_close(res.loss_per_position, expected.float(), rtol=1e-6, atol=1e-6)
    assert res.loss == pytest.approx(float(expected.mean()), rel=1e-6)


def test_evaluate_does_not_depend_on_batch_size():
    model, data = tiny_lm(), random_bytes()
    a = evaluate(model, data, 16, num_windows=10, batch_size=10)
    b = evaluate(model, data, 16, num_windows=10, batch_size=3)
    c = evaluate(model, data, 16, num_windows=10, batch_size=64)
    torch.testing.assert_close(a.loss_per_position, b.loss_per_position, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a.loss_per_position, c.loss_per_position, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("training", [True, False])
def test_evaluate_restores_the_training_flag(training):
    model = tiny_lm()
    model.train(training)
    evaluate(model, random_bytes(), 8, num_windows=2)
    assert model.training is training
    assert all(m.training is training for m in model.modules())


def test_evaluate_restores_the_training_flag_when_the_model_raises():
    # Regression test: evaluate() once restored the training flag only when the model did not raise.
    model = TinyLM(LMConfig(d_model=8, n_layer=1, n_head=2, max_len=8), BinaryPE(8, num_bits=3))  # positions 0..7
    model.train()
    with pytest.raises(ValueError, match="only covers positions 0..7"):
        evaluate(model, random_bytes(), 16, num_windows=2)
    assert model.training


def test_evaluate_bad_inputs():
    model = tiny_lm()
    with pytest.raises(ValueError, match="batch_size must be a positive int, got 0"):
        evaluate(model, random_bytes(), 8, batch_size=0)
    with pytest.raises(ValueError, match="data has 8 tokens; a window of seq_len=8 needs 9"):
        evaluate(model, random_bytes(8), 8)


def test_evaluate_lengths_one_result_per_length(device):
    model = tiny_lm().to(device)
    data = random_bytes(3000)
    lengths = [8, 32, 96]  # 96 is beyond max_len=32: fine for NoPE
    results = evaluate_lengths(model, data, lengths, num_windows=3, batch_size=2)
    assert list(results) == lengths
    for n, res in results.items():
        assert res.seq_len == n and res.num_windows == 3
        assert res.loss_per_position.shape == (n,)
        assert torch.isfinite(res.loss_per_position).all()
    single = evaluate(model, data, 96, num_windows=3, batch_size=2)
    torch.testing.assert_close(results[96].loss_per_position, single.loss_per_position, rtol=1e-6, atol=1e-6)


def test_evaluate_lengths_accepts_any_iterable_of_ints():
    model = tiny_lm()
    results = evaluate_lengths(model, random_bytes(), (n for n in (torch.tensor(4), 12)), num_windows=2)
    assert list(results) == [4, 12] and all(type(k) is int for k in results)


# --- penalties and frozen parameters -------------------------------------------------------------


def test_train_penalty_is_added_to_the_loss_and_recorded_apart():
    from posenc.absolute import l2_penalty

    data = repetitive_bytes()
    plain, zero, shrunk = tiny_lm("learned"), tiny_lm("learned"), tiny_lm("learned")
    r_plain = train(plain, data, quick_cfg())
    r_zero = train(zero, data, quick_cfg(), penalty=lambda: 0.0 * l2_penalty(zero.position.table()))
    assert r_zero.losses == r_plain.losses and r_zero.penalties == [0.0] * 8 and r_plain.penalties == [0.0] * 8
    for a, b in zip(plain.parameters(), zero.parameters()):
        assert torch.equal(a, b)  # a zero penalty changes nothing, bit for bit

    r = train(shrunk, data, quick_cfg(lr=1e-2), penalty=lambda: 10.0 * l2_penalty(shrunk.position.table()))
    norm0 = tiny_lm("learned").position.table().detach().pow(2).sum().item()
    assert r.penalties[0] == pytest.approx(10.0 * norm0, rel=1e-5)  # recorded before the first update
    assert shrunk.position.table().norm() < 0.7 * plain.position.table().norm()
    assert r.losses[0] == r_plain.losses[0]  # the recorded loss excludes the penalty


def test_train_leaves_frozen_parameters_unchanged():
    model = tiny_lm("learned")
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith("position."))
    train(model, repetitive_bytes(), quick_cfg())
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]) != name.startswith("position."), name


def test_train_penalty_validation():
    model = tiny_lm()
    with pytest.raises(TypeError, match="penalty must be a callable returning a scalar tensor, or None, got float"):
        train(model, repetitive_bytes(), quick_cfg(), penalty=0.5)
    with pytest.raises(TypeError, match=r"penalty must return a scalar tensor, got shape \(2,\)"):
        train(model, repetitive_bytes(), quick_cfg(), penalty=lambda: torch.ones(2))
    with pytest.raises(TypeError, match="penalty must return a scalar tensor, got float"):
        train(model, repetitive_bytes(), quick_cfg(), penalty=lambda: 1.0)


# --- synthetic tasks ---------------------------------------------------------------------------

class _CopyOracle(torch.nn.Module):
    """Predicts every answer byte of the copy task by reading it ``length + 1`` positions back."""

    def __init__(self, length: int):
        super().__init__()
        self.length = length
        self.dummy = torch.nn.Parameter(torch.zeros(()))

    def forward(self, x):
        logits = torch.full((*x.shape, 256), -30.0)
        back = torch.roll(x, shifts=self.length, dims=1)  # target t = input t + 1 - (length + 1)
        logits.scatter_(-1, back.unsqueeze(-1), 30.0)
        return logits + 0 * self.dummy


def _copy(length):
    from posenc.lab.data import copy_task
    return lambda batch_size, generator: copy_task(batch_size, length, generator)


def test_task_accuracy_of_an_oracle_and_of_a_blind_model():
    from posenc.lab.train import task_accuracy
    acc = task_accuracy(_CopyOracle(6), _copy(6), num_examples=40, batch_size=16)
    assert acc.token_accuracy == 1.0 and acc.exact_match == 1.0 and acc.answer_loss < 1e-6
    blind = TinyLM(LMConfig(d_model=16, n_layer=1, n_head=2, max_len=12), "nope")
    acc = task_accuracy(blind, _copy(6), num_examples=40)
    assert 0.0 <= acc.exact_match <= acc.token_accuracy < 0.5


def test_train_task_scores_only_the_answer_and_learns_to_copy():
    from posenc.lab.train import task_accuracy, train_task
    model = TinyLM(LMConfig(d_model=32, n_layer=2, n_head=2, max_len=8), "rope")
    result = train_task(model, _copy(4), TrainConfig(steps=200, batch_size=32, warmup_steps=10, progress=False))
    # the first loss is the answer tokens' cross-entropy at initialisation: about ln(256), not the mean over all bytes
    assert abs(result.losses[0] - math.log(256)) < 0.5
    assert task_accuracy(model, _copy(4), num_examples=128).token_accuracy > 0.9


def test_train_task_bad_inputs():
    from posenc.lab.train import train_task
    model = TinyLM(LMConfig(d_model=16, n_layer=1, n_head=2, max_len=8), "nope")
    cfg = TrainConfig(steps=1, batch_size=2, warmup_steps=0, progress=False)
    with pytest.raises(TypeError, match="task must be a callable"):
        train_task(model, "copy", cfg)
    with pytest.raises(TypeError, match="must return a posenc.lab.data.Task"):
        train_task(model, lambda b, g: torch.zeros(b, 8), cfg)
    with pytest.raises(ValueError, match="the task's sequence length=10 exceeds the model's max_len=8"):
        train_task(model, _copy(5), cfg)
    with pytest.raises(ValueError, match="num_examples must be a positive int"):
        from posenc.lab.train import task_accuracy
        task_accuracy(model, _copy(2), num_examples=0)
    with pytest.raises(TypeError, match="data must be a 1-D tensor"):
        train(model, torch.zeros(4, 4, dtype=torch.long), cfg)


@pytest.mark.parametrize("masked", [False, True])
def test_each_process_of_a_sharded_step_takes_its_rows_and_their_mean_loss_is_the_batch_loss(masked):
    """shard=(rank, world_size): the first step's loss (before any update) of each of 4 processes,
    averaged, is the one-process loss of the whole batch, also when rows score different numbers of
    tokens; DistributedDataParallel averages the gradients the same way (tests/test_distributed.py)."""
    from posenc.lab.data import Task
    from posenc.lab.train import train_task

    def uneven(batch_size, generator):  # row i scores i + 1 tokens
        x = torch.randint(0, 256, (batch_size, 9), generator=generator)
        mask = torch.arange(8)[None, :] >= 7 - torch.arange(batch_size)[:, None]
        return Task(inputs=x[:, :-1], targets=x[:, 1:], mask=mask)

    cfg = quick_cfg(steps=1, batch_size=8, warmup_steps=0)
    run = (lambda m, shard: train_task(m, uneven, cfg, shard=shard)) if masked else \
        (lambda m, shard: train(m, random_bytes(), cfg, shard=shard))
    whole = run(tiny_lm(), (0, 1)).losses[0]
    shares = [run(tiny_lm(), (rank, 4)).losses[0] for rank in range(4)]
    assert len(set(shares)) == 4  # each process sees other rows
    assert sum(shares) / 4 == pytest.approx(whole, rel=1e-6)


# --- the experiments protocol: curves, the position parameters' step size, nested windows ---------


def test_the_curve_is_measured_at_the_steps_asked_and_leaves_training_unchanged():
    data, cfg = random_bytes(), quick_cfg()
    plain_model, curved_model = tiny_lm("learned"), tiny_lm("learned")
    calls = []

    def measure(m):
        calls.append(m.training)
        torch.rand(3)  # a measure that draws from the global RNG must not disturb training
        return {"val_loss": evaluate(m, data, 16, num_windows=4).loss}

    plain = train(plain_model, data, cfg)
    curved = train(curved_model, data, cfg, curve_at=[8, 2, 5], measure=measure)
    assert plain.losses == curved.losses
    assert [p["step"] for p in curved.curve] == [2, 5, 8] and calls == [False] * 3
    final = evaluate(curved_model, data, 16, num_windows=4).loss
    assert curved.curve[-1]["val_loss"] == final  # the last point is the trained model


@pytest.mark.parametrize("kwargs,match", [
    (dict(curve_at=[0], measure=lambda m: {}), "curve_at must hold steps in 1..8"),
    (dict(curve_at=[9], measure=lambda m: {}), "curve_at must hold steps in 1..8"),
    (dict(curve_at=[2]), "needs a measure"),
    (dict(measure=3), "measure must be callable"),
])
def test_curve_arguments_are_checked(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        train(tiny_lm(), random_bytes(), quick_cfg(), **kwargs)


def test_position_parameters_move_at_their_own_step_size():
    # Adam moves a parameter about one learning rate per step whatever its gradient's scale; the
    # multiplier scales the position method's learning rate and no other
    from posenc.lab.train import param_groups

    data = random_bytes()
    base, fast = tiny_lm("learned"), tiny_lm("learned")
    pos0, tok0 = base.position.table().detach().clone(), base.tok.weight.detach().clone()
    rb = train(base, data, quick_cfg(steps=4, warmup_steps=0, weight_decay=0.0, grad_clip=0.0))
    train(fast, data, quick_cfg(steps=4, warmup_steps=0, weight_decay=0.0, grad_clip=0.0, position_lr_mult=10.0))
    step_base = (base.position.table().detach() - pos0).abs().max().item()
    step_fast = (fast.position.table().detach() - pos0).abs().max().item()
    assert step_fast == pytest.approx(10 * step_base, rel=0.05)
    assert step_base <= 4 * 3e-3 * 1.01  # at most one learning rate per step under Adam
    groups = param_groups(fast, quick_cfg(position_lr_mult=10.0))
    pos_ids = {id(p) for p in fast.position.parameters()}
    assert all(g["lr_mult"] == (10.0 if id(g["params"][0]) in pos_ids else 1.0) for g in groups)
    assert sum(len(g["params"]) for g in groups) == len([p for p in fast.parameters() if p.requires_grad])
    assert rb.lrs == [lr_at(s, quick_cfg(steps=4, warmup_steps=0)) for s in range(4)]  # the base learning rate
    assert not torch.equal(fast.tok.weight, tok0)


@pytest.mark.parametrize("bad", [0, -1.0, True, "10"])
def test_position_lr_mult_must_be_positive(bad):
    with pytest.raises(ValueError, match="position_lr_mult must be a number > 0"):
        quick_cfg(position_lr_mult=bad)


def test_nested_windows_are_prefixes_of_the_longest():
    data = random_bytes(5000)
    long_x, _ = eval_windows(data, 64, 8, span=64)
    short_x, short_y = eval_windows(data, 16, 8, span=64)
    assert torch.equal(short_x, long_x[:, :16])
    assert not torch.equal(eval_windows(data, 16, 8)[0], short_x)  # spaced for their own length, they start elsewhere
    with pytest.raises(ValueError, match="span must be an int >= seq_len=16"):
        eval_windows(data, 16, 8, span=8)
    model = tiny_lm()
    results = evaluate_lengths(model, data, [8, 16], num_windows=4, nested=True)
    direct = evaluate(model, data, 8, num_windows=4, span=16)
    assert torch.equal(results[8].loss_per_position, direct.loss_per_position)


def test_per_window_losses_average_to_the_loss():
    data = random_bytes()
    result = evaluate(tiny_lm(), data, 16, num_windows=6, batch_size=4)
    assert result.loss_per_window.shape == (6,)
    assert result.loss_per_window.mean().item() == pytest.approx(result.loss, abs=1e-6)


def test_task_accuracy_records_each_rows_exact_match():
    from posenc.lab.train import task_accuracy

    acc = task_accuracy(_CopyOracle(6), _copy(6), num_examples=40, batch_size=16)
    assert acc.row_exact == (1,) * 40
    blind = TinyLM(LMConfig(d_model=16, n_layer=1, n_head=2, max_len=12), "nope")
    acc = task_accuracy(blind, _copy(6), num_examples=40)
    assert len(acc.row_exact) == 40 and sum(acc.row_exact) / 40 == acc.exact_match


def test_stop_after_is_exactly_the_first_steps_of_the_longer_run():
    data, cfg = random_bytes(), quick_cfg(steps=8)
    measure = lambda m: {"val_loss": evaluate(m, data, 16, num_windows=4).loss}  # noqa: E731
    full = train(tiny_lm("learned"), data, cfg, curve_at=[3, 8], measure=measure)
    part = train(tiny_lm("learned"), data, cfg, curve_at=[3, 8], measure=measure, stop_after=3)
    assert part.losses == full.losses[:3] and part.curve == full.curve[:1] and len(part.lrs) == 3
    with pytest.raises(ValueError, match="stop_after must be an int in 1..8"):
        train(tiny_lm(), data, cfg, stop_after=9)


def test_windows_between_are_held_out_text_of_the_same_kind():
    data = random_bytes(20000)
    x, _ = eval_windows(data, 16, 8)
    xb, yb = eval_windows(data, 16, 8, between=True)
    assert xb.shape == (7, 16) and yb.shape == (7, 16)
    starts = torch.arange(8) * (20000 - 17) // 7
    mids = (starts[:-1] + starts[1:]) // 2
    assert torch.equal(xb[:, 0], data[mids].long())
    result = evaluate(tiny_lm(), data, 16, num_windows=8, between=True)
    assert result.num_windows == 7 and result.loss_per_window.shape == (7,)
    with pytest.raises(ValueError, match="between=True needs num_windows >= 2"):
        eval_windows(data, 16, 1, between=True)


def test_evaluate_bands_and_chunks_score_the_same_tokens_in_a_long_and_a_short_context():
    from posenc.lab import LMConfig, TinyLM
    from posenc.lab.data import load_stdlib_corpus
    from posenc.lab.train import evaluate, evaluate_chunks

    torch.manual_seed(0)
    model = TinyLM(LMConfig(d_model=16, n_layer=1, n_head=2, max_len=64), "learned")
    val = load_stdlib_corpus().val
    long = evaluate(model, val, 64, num_windows=3, batch_size=2, span=64, bands=(16, 32, 48))
    band = long.loss_per_window_band
    assert band.shape == (3, 4)
    torch.testing.assert_close(band.mean(1), long.loss_per_window)  # equal bands: their mean is the window's
    pieces = evaluate_chunks(model, val, 64, 16, num_windows=3, batch_size=5)
    assert pieces.shape == (3, 4)
    torch.testing.assert_close(pieces[:, 0], band[:, 0])  # the first piece has the same context in both
    assert not torch.allclose(pieces[:, 1:], band[:, 1:])  # the others lose their context
    short = evaluate(model, val, 16, num_windows=3, batch_size=2, span=64)
    torch.testing.assert_close(short.loss_per_window, pieces[:, 0])
    with pytest.raises(ValueError, match="chunk must be a positive int that divides span=64, got 24"):
        evaluate_chunks(model, val, 64, 24)
    with pytest.raises(ValueError, match="bands must be increasing positive ints"):
        evaluate(model, val, 64, bands=(32, 16))


def test_task_accuracy_per_row_losses_and_a_position_offset():
    from posenc.lab import LMConfig, TinyLM
    from posenc.lab.data import copy_task
    from posenc.lab.train import task_accuracy

    torch.manual_seed(0)
    task = lambda b, g: copy_task(b, 4, g)  # noqa: E731
    nope = TinyLM(LMConfig(d_model=16, n_layer=1, n_head=2, max_len=64), "nope")
    acc = task_accuracy(nope, task, num_examples=6, batch_size=4)
    assert len(acc.row_answer_loss) == 6
    assert abs(sum(acc.row_answer_loss) / 6 - acc.answer_loss) < 1e-5  # rows have equal answer lengths
    moved = task_accuracy(nope, task, num_examples=6, position_offset=40)  # no position: nothing moves
    assert moved.row_exact == acc.row_exact and abs(moved.answer_loss - acc.answer_loss) < 1e-5
    learned = TinyLM(LMConfig(d_model=16, n_layer=1, n_head=2, max_len=64), "learned")
    assert task_accuracy(learned, task, num_examples=6, position_offset=40).answer_loss != \
        task_accuracy(learned, task, num_examples=6).answer_loss
    with pytest.raises(ValueError, match="position_offset must be an int >= 0, got -1"):
        task_accuracy(nope, task, position_offset=-1)


def test_curve_steps_are_evenly_spaced_and_end_at_the_last_step():
    from posenc.lab.train import curve_steps

    assert curve_steps(4000, 8) == [500, 1000, 1500, 2000, 2500, 3000, 3500, 4000]
    assert curve_steps(3, 8) == [1, 2, 3]  # fewer steps than points: each step once
