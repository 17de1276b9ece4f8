"""posenc.lab.experiments.distributed: dealing cells to ranks, data-parallel batches, processes dealt to GPUs
(several on one GPU: gloo, no DDP), and two CPU processes under torchrun giving the records of one process
(a sharded grid) and the loss of one process (DDP)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from posenc.lab.experiments import distributed
from posenc.lab.experiments.distributed import DistContext, WorkQueue
from posenc.lab.experiments.extrapolation import pending_dir, record_key
from posenc.lab.lm import LMConfig, TinyLM
from posenc.lab.train import TrainConfig, batch_rows, train

ROOT = Path(__file__).resolve().parents[1]

# a study of a few seconds: three methods (RoPE with its scalings and two fine-tunes), two seeds, both tasks
STUDY = ["--methods", "rope", "learned", "alibi", "--seeds", "0", "1", "--train-length", "80", "--multiples", "1", "2",
         "--d-model", "16", "--n-layer", "1", "--n-head", "2", "--lm-steps", "6", "--lm-batch", "4",
         "--passkey-steps", "6", "--passkey-batch", "4", "--warmup-steps", "1", "--finetune-steps", "3",
         "--finetune-batch", "2", "--depths", "0", "1", "--eval-windows", "2", "--eval-examples", "4",
         "--eval-batch", "2", "--quiet"]


def test_a_lone_work_queue_hands_out_every_item_once_and_returns_the_results():
    ctx = DistContext()
    queue = WorkQueue(ctx, 3, "q")
    claimed = []
    while (index := queue.claim()) is not None:
        claimed.append(index)
        queue.put(index, {"item": index})
        if index == 0:
            assert queue.collect() == [(0, {"item": 0})] and queue.collect() == []
    assert claimed == [0, 1, 2] and queue.claim() is None
    assert queue.collect(wait=True) == [(1, {"item": 1}), (2, {"item": 2})]
    assert WorkQueue(ctx, 0, "empty").claim() is None
    with pytest.raises(ValueError, match="size must be an int >= 0, got -1"):
        WorkQueue(ctx, -1, "q")
    with pytest.raises(ValueError, match="a WorkQueue over several ranks needs ctx.store"):
        WorkQueue(DistContext(rank=0, world_size=2), 3, "q")
    with pytest.raises(RuntimeError, match="only rank 0 collects results; this is rank 1"):
        WorkQueue(DistContext(rank=1, world_size=2, store=object()), 3, "q").collect()


def test_batch_rows_split_a_global_batch_into_equal_contiguous_slices():
    rows = [batch_rows(12, r, 3) for r in range(3)]
    assert rows == [slice(0, 4), slice(4, 8), slice(8, 12)] and batch_rows(5, 0, 1) == slice(0, 5)
    with pytest.raises(ValueError, match="batch_size=10 must be divisible by the number of processes, world_size=4"):
        batch_rows(10, 0, 4)
    with pytest.raises(ValueError, match=r"shard must be \(rank, world_size\) with 0 <= rank .*got \(2, 2\)"):
        batch_rows(4, 2, 2)
    model = TinyLM(LMConfig(d_model=16, n_layer=1, n_head=2, max_len=16))
    with pytest.raises(ValueError, match=r"shard must be a tuple \(rank, world_size\), got \[0, 1\]"):
        train(model, torch.zeros(100, dtype=torch.uint8), TrainConfig(steps=1, warmup_steps=0, seq_len=8), shard=[0, 1])


def test_a_lone_process_needs_no_process_group():
    ctx = distributed.init("cpu", env={})
    assert ctx == DistContext() and ctx.is_main and not ctx.distributed
    assert distributed.init("cpu", env={"RANK": "0", "WORLD_SIZE": "1"}) == DistContext()
    assert distributed.gather_to_main({"a": 1}, ctx) == [{"a": 1}] and distributed.broadcast_from_main("x", ctx) == "x"
    model = TinyLM(LMConfig(d_model=16, n_layer=1, n_head=2, max_len=16))
    assert distributed.train_data_parallel(model, lambda m, shard: (m is model, shard), ctx) == (True, (0, 1))
    distributed.shutdown(ctx)
    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda' .*got 'meta'"):
        distributed.init("meta", env={})
    with pytest.raises(ValueError, match=r"rank must be an int in 0..world_size-1=1, got 2"):
        DistContext(rank=2, world_size=2)


def test_device_for_deals_processes_to_the_gpus_in_turn_and_leaves_the_cpu_alone():
    assert [distributed.device_for(r, "cuda", 1) for r in range(3)] == ["cuda:0"] * 3  # all share the one GPU
    assert [distributed.device_for(r, "cuda", 2) for r in range(5)] == ["cuda:0", "cuda:1"] * 2 + ["cuda:0"]
    assert distributed.device_for(3, "cuda:1", 2) == "cuda:1"  # an index given with "cuda" is replaced
    assert distributed.device_for(5, "cpu", 0) == "cpu" and distributed.device_for(0, "cpu", 2) == "cpu"
    with pytest.raises(ValueError, match=r"n_gpus must be an int >= 1 for device='cuda' \(no GPU is visible\), got 0"):
        distributed.device_for(0, "cuda", 0)
    with pytest.raises(ValueError, match="local_rank must be an int >= 0, got -1"):
        distributed.device_for(-1, "cuda", 1)


@pytest.mark.parametrize("flags", [(False, False, False), (False, True, False), (True, True, True)])
def test_every_rank_learns_whether_any_rank_shares_a_gpu(flags):
    """The backend choice: each rank (a thread here) says whether it shares a GPU; all get the same answer."""
    store, answers = torch.distributed.HashStore(), {}
    threads = [threading.Thread(target=lambda r=r: answers.__setitem__(
        r, distributed._any_rank(store, "k", flags[r], len(flags)))) for r in range(len(flags))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert answers == {r: any(flags) for r in range(len(flags))}


# Two ranks told there is one GPU (no GPU is touched: device_count and set_device are replaced): both
# land on cuda:0, agree that a GPU is shared, and so join a gloo group, whose object collectives work.
SHARED_GPU_SCRIPT = """
import json, pathlib, sys, torch
torch.cuda.device_count = lambda: 1
torch.cuda.set_device = lambda device: None
from posenc.lab.experiments import distributed
ctx = distributed.init("cuda")
name = distributed.new_name(ctx)
torch.distributed.barrier()
out = pathlib.Path(sys.argv[1]) / f"rank{ctx.rank}.json"
out.write_text(json.dumps({"rank": ctx.rank, "device": ctx.device, "backend": ctx.backend, "name": name}))
distributed.shutdown(ctx)
"""


def test_two_ranks_on_one_gpu_share_cuda_0_over_gloo(tmp_path):
    script = tmp_path / "shared.py"
    script.write_text(SHARED_GPU_SCRIPT)
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             str(script), str(tmp_path)], cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert sorted(r["rank"] for r in lines) == [0, 1]
    assert {(r["device"], r["backend"]) for r in lines} == {("cuda:0", "gloo")}
    assert len({r["name"] for r in lines}) == 1  # rank 0's queue name reached rank 1


def test_data_parallel_refuses_ranks_that_share_a_gpu():
    ctx = DistContext(rank=0, world_size=2, device="cuda:0", backend="gloo", store=object())
    with pytest.raises(ValueError, match=r"data parallel training needs a GPU per process, but the 2 processes"):
        distributed.train_data_parallel(torch.nn.Linear(1, 1), lambda m, shard: None, ctx)


def run(args: list[str], nproc: int = 0) -> None:
    """Run the study's command line in fresh processes (``nproc`` under torchrun, else one plain process).

    torchrun's ``--standalone`` rendezvous picks a free port; every run is killed after 300 s.
    """
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)] if nproc else []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, *launcher, "-m", "posenc.lab.experiments.extrapolation", *args],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


def records(path: Path) -> dict:
    return {record_key(r): r for r in json.loads(path.read_text())["records"]}


PROVENANCE = {"seconds", "cell_seconds", "finished", "command", "commit", "dirty", "torch", "python", "machine",
              "cpu_capability", "cpu_count", "threads", "device", "rank"}


def test_two_processes_under_torchrun_share_the_grid_and_store_the_records_of_one(tmp_path):
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    run([*STUDY, "--out", str(one)])
    run([*STUDY, "--out", str(two)], nproc=2)
    a, b = records(one), records(two)
    assert set(a) == set(b) and len(a) > 100
    assert {r["rank"] for r in b.values()} == {0, 1}  # both processes ran cells
    for key, r in a.items():  # every cell trained alone, single-threaded: the same numbers to the bit
        assert {k: v for k, v in r.items() if k not in PROVENANCE} == {k: v for k, v in b[key].items()
                                                                         if k not in PROVENANCE}, key
    assert json.loads(two.read_text())["meta"]["cells"] == 12
    assert not pending_dir(two).exists()  # every rank's finished cells were parked, stored and their files deleted
    before = two.read_text()
    run([*STUDY, "--out", str(two)], nproc=2)  # resumes: nothing left, nothing rewritten
    assert two.read_text() == before


def test_ddp_under_torchrun_trains_one_model_to_the_loss_of_one_process(tmp_path):
    """Two processes, each with half of every global batch, end at the one-process loss.

    fp32 on the CPU: the only differences are the order of the sums (each process's half of the batch,
    then the average of two gradients), about 1e-7 relative per step; 6 steps stay well under 1e-5.
    """
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    args = [*STUDY, "--methods", "rope", "t5", "--seeds", "0"]
    run([*args, "--out", str(one)])
    run([*args, "--ddp", "--out", str(two)], nproc=2)
    a, b = records(one), records(two)
    assert set(a) == set(b)
    trained = [k for k in a if a[k]["kind"] == "train"]
    assert len(trained) == 2 * 2 + 3 * 2  # rope and t5, both tasks, and RoPE's three fine-tunes per task (PI, YaRN, control)
    for key in trained:
        assert b[key]["train_loss_last"] == pytest.approx(a[key]["train_loss_last"], rel=1e-5, abs=0), key
    for key in a:
        for metric in ("loss", "answer_loss"):
            if metric in a[key]:
                assert b[key][metric] == pytest.approx(a[key][metric], rel=1e-5), (key, metric)
