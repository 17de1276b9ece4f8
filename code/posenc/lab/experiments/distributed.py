"""Running an experiment on several processes or machines with ``torch.distributed``.

Two ways to use more than one process, both under ``torchrun`` (``python -m torch.distributed.run``):

- **a sharded grid**: independent runs (cells) are shared out through a :class:`WorkQueue`: each
  rank claims the next cell as soon as it is free (so a slow cell never holds the others up),
  trains it alone and posts its records, which rank 0 collects and writes;
- **data parallel** (:func:`train_data_parallel`): all ranks train *one* model with
  :class:`~torch.nn.parallel.DistributedDataParallel`, each on its slice of every global batch
  (:func:`posenc.lab.train.batch_rows`), so that the run is the one-process run at the same global batch
  and seed, up to the order of floating-point sums.

:func:`init` joins the process group that ``torchrun`` describes in the environment (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), and the key-value store of
``torchrun``'s rendezvous, which the work queue uses. On CUDA a process uses
``cuda:(LOCAL_RANK % G)``, ``G`` the GPUs it sees (:func:`device_for`), so there may be more
processes than GPUs: several tiny models then train at once on one GPU. The backend is gloo on the
CPU; on CUDA it is NCCL when every process has a GPU of its own, and gloo as soon as two processes
of the run share one (NCCL refuses two ranks of one group on one GPU, "Duplicate GPU detected";
the sharded grid only sends small objects, which gloo carries through the CPU). Data parallel
training refuses processes that share a GPU (:func:`train_data_parallel`). Without ``torchrun``
:func:`init` returns a one-process context and every helper here does the one-process thing, so the
same code runs in a notebook, in one process and on many. Nothing here reads or sets global state
beyond the process group itself: every function takes the :class:`DistContext` it works in.
"""

from __future__ import annotations

import datetime as _dt
import os
import pickle
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

import torch
import torch.distributed as dist
from torch import nn

#: How long a collective waits for the slowest rank before failing (a cell can take a while).
TIMEOUT = _dt.timedelta(hours=12)


@dataclass(frozen=True)
class DistContext:
    """Where this process stands among the processes of a run."""

    rank: int = 0  #: index of this process among all processes (torchrun's ``RANK``)
    world_size: int = 1  #: number of processes (``WORLD_SIZE``)
    local_rank: int = 0  #: index of this process on its machine (``LOCAL_RANK``); picks the GPU
    device: str = "cpu"  #: this process's device, ``"cpu"`` or ``"cuda:(LOCAL_RANK % GPUs)"`` (:func:`device_for`)
    backend: Optional[str] = None  #: ``"gloo"`` or ``"nccl"`` while a process group is up, else ``None``
    #: the rendezvous key-value store (``torch.distributed.Store``), shared by all ranks; ``None`` alone
    store: Optional[Any] = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.world_size, int) or self.world_size < 1:
            raise ValueError(f"world_size must be a positive int, got {self.world_size!r}")
        if not isinstance(self.rank, int) or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be an int in 0..world_size-1={self.world_size - 1}, got {self.rank!r}")

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0, the process that writes results."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """Whether there is more than one process (and so a process group)."""
        return self.world_size > 1


def launched_by_torchrun(env: Mapping[str, str] = os.environ) -> bool:
    """Whether ``env`` describes a process started by ``torchrun`` (``RANK`` and ``WORLD_SIZE`` set)."""
    return "RANK" in env and "WORLD_SIZE" in env


def device_for(local_rank: int, device: str, n_gpus: int) -> str:
    """The device of the process with index ``local_rank`` on its machine.

    On CUDA, ``cuda:(local_rank % n_gpus)``: processes are dealt to the GPUs in turn, so with more
    processes than GPUs several share one (local ranks 0 and 2 on ``cuda:0`` with two GPUs). On the
    CPU, ``device`` unchanged.

    Args:
        local_rank: the process's index on its machine (torchrun's ``LOCAL_RANK``), ``>= 0``.
        device: ``"cpu"`` or ``"cuda"`` (an index given with it is ignored under torchrun).
        n_gpus: the GPUs the process sees (``torch.cuda.device_count()``); unused on the CPU.

    Returns:
        ``"cuda:I"`` or ``device``.

    Raises:
        ValueError: if ``local_rank`` is not an int ``>= 0``, or ``device`` is CUDA and ``n_gpus < 1``.
    """
    if not isinstance(local_rank, int) or isinstance(local_rank, bool) or local_rank < 0:
        raise ValueError(f"local_rank must be an int >= 0, got {local_rank!r}")
    if torch.device(device).type != "cuda":
        return str(device)
    if not isinstance(n_gpus, int) or isinstance(n_gpus, bool) or n_gpus < 1:
        raise ValueError(f"n_gpus must be an int >= 1 for device={device!r} (no GPU is visible), got {n_gpus!r}")
    return f"cuda:{local_rank % n_gpus}"


def _any_rank(store: Any, key: str, flag: bool, world_size: int) -> bool:
    """Whether ``flag`` is true on any of ``world_size`` ranks; every rank calls it once with the same ``key``."""
    store.add(f"{key}/true", int(bool(flag)))
    if store.add(f"{key}/arrived", 1) == world_size:  # the last rank to arrive lets every rank read the count
        store.set(f"{key}/all", "1")
    store.wait([f"{key}/all"])
    return store.add(f"{key}/true", 0) > 0


def init(device: str = "cpu", *, env: Mapping[str, str] = os.environ) -> DistContext:
    """Join the process group ``torchrun`` set up, or describe a lone process.

    The store is the one ``torchrun``'s agent hosts (``TORCHELASTIC_USE_AGENT_STORE``), or else one
    hosted by rank 0, at ``MASTER_ADDR:MASTER_PORT``, as ``init_process_group``'s ``env://`` would
    make it; the process group and the :class:`WorkQueue` s use it under separate prefixes.

    Args:
        device: ``"cpu"`` (gloo) or ``"cuda"`` (this process on ``cuda:(LOCAL_RANK % GPUs)``, see
            :func:`device_for`; NCCL if no two processes of the run share a GPU, else gloo); a lone
            process keeps ``device`` as given (e.g. ``"cuda:1"``).
        env: the environment to read (``os.environ``; tests pass their own).

    Returns:
        The :class:`DistContext`; call :func:`shutdown` with it at the end.

    Raises:
        ValueError: if ``device`` is neither a CPU nor a CUDA device, or is CUDA with no GPU visible.
        RuntimeError: if a default process group already exists (this function creates it).
    """
    kind = torch.device(device).type
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda' (under torchrun: cuda:(LOCAL_RANK % GPUs)), got {device!r}")
    if not launched_by_torchrun(env) or int(env["WORLD_SIZE"]) == 1:
        return DistContext(device=str(device))
    if dist.is_initialized():
        raise RuntimeError("a default process group exists already; posenc.lab.experiments.distributed.init creates it")
    rank, world, local = int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0))
    n_gpus = torch.cuda.device_count() if kind == "cuda" else 0
    device = device_for(local, device, n_gpus)
    if kind == "cuda":
        torch.cuda.set_device(torch.device(device))  # NCCL's object collectives use the current device
    agent = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), world, is_master=rank == 0 and not agent,
                          timeout=TIMEOUT, multi_tenant=True)
    attempt = env.get("TORCHELASTIC_RESTART_COUNT", "0")  # a restarted run must not read an earlier run's keys
    backend = "gloo"
    if kind == "cuda":  # every rank must pick the same backend: NCCL only if no machine has two ranks on a GPU
        shared = _any_rank(store, f"posenc/shared_gpu/{attempt}", local >= n_gpus, world)
        backend = "gloo" if shared else "nccl"
    dist.init_process_group(backend, store=dist.PrefixStore(f"posenc/group/{attempt}", store), rank=rank,
                            world_size=world, timeout=TIMEOUT)
    return DistContext(rank=rank, world_size=world, local_rank=local, device=str(device), backend=backend,
                       store=dist.PrefixStore(f"posenc/work/{attempt}", store))


def shutdown(ctx: DistContext) -> None:
    """Leave the process group of ``ctx`` (nothing for a lone process)."""
    if ctx.backend is not None and dist.is_initialized():
        dist.destroy_process_group()


def gather_to_main(obj: Any, ctx: DistContext) -> Optional[list]:
    """Collect one picklable object from every rank on rank 0.

    Returns:
        On rank 0 the list of the ranks' objects (in rank order); ``None`` elsewhere. A lone
        process gets ``[obj]``.
    """
    if not ctx.distributed:
        return [obj]
    out = [None] * ctx.world_size if ctx.is_main else None
    dist.gather_object(obj, out, dst=0)
    return out


def broadcast_from_main(obj: Any, ctx: DistContext) -> Any:
    """Rank 0's ``obj`` on every rank (what the others pass is ignored)."""
    if not ctx.distributed:
        return obj
    box = [obj if ctx.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class WorkQueue:
    """Items ``0 .. size - 1`` claimed one at a time by whichever rank is free; results go to rank 0.

    Dynamic sharding through the rendezvous store: :meth:`claim` hands out the next item (an atomic
    counter, so no item is run twice and a rank that finishes early takes more), :meth:`put` posts
    an item's result, and rank 0's :meth:`collect` takes every result posted so far (or, with
    ``wait``, all of them). No collective is involved, so no rank waits for another until the end.
    A lone process runs every item itself, in order.

    Args:
        ctx: the run's context (its ``store`` is used when there are several ranks).
        size: the number of items.
        name: the queue's name, the same on every rank and new for every queue of a process group
            (e.g. a :func:`new_name` broadcast from rank 0).

    Raises:
        ValueError: if ``size`` is negative, or several ranks have no store.
    """

    def __init__(self, ctx: DistContext, size: int, name: str):
        if not isinstance(size, int) or size < 0:
            raise ValueError(f"size must be an int >= 0, got {size!r}")
        if ctx.distributed and ctx.store is None:
            raise ValueError("a WorkQueue over several ranks needs ctx.store (use posenc.lab.experiments.distributed.init)")
        self.ctx, self.size, self.name = ctx, size, name
        self._next = 0  # a lone process's counter
        self._posted: dict[int, Any] = {}  # a lone process's results
        self._pending = set(range(size))  # rank 0: results not collected yet

    def _key(self, what: str) -> str:
        return f"{self.name}/{what}"

    def claim(self) -> Optional[int]:
        """The next unclaimed item, or ``None`` when every item has been claimed."""
        if self.ctx.distributed:
            index = self.ctx.store.add(self._key("next"), 1) - 1
        else:
            index, self._next = self._next, self._next + 1
        return index if index < self.size else None

    def put(self, index: int, result: Any) -> None:
        """Post the (picklable) result of item ``index`` for rank 0."""
        if self.ctx.distributed:
            self.ctx.store.set(self._key(f"result/{index}"), pickle.dumps(result))
        else:
            self._posted[index] = result

    def collect(self, wait: bool = False) -> list[tuple[int, Any]]:
        """On rank 0: ``(index, result)`` of every result posted and not collected yet, by index.

        Args:
            wait: block until every item's result has been posted.

        Raises:
            RuntimeError: on a rank other than 0.
        """
        if not self.ctx.is_main:
            raise RuntimeError(f"only rank 0 collects results; this is rank {self.ctx.rank}")
        out = []
        for index in sorted(self._pending):
            key = self._key(f"result/{index}")
            if not self.ctx.distributed:
                if index not in self._posted:
                    continue
                out.append((index, self._posted.pop(index)))
            else:
                if wait:
                    self.ctx.store.wait([key])
                elif not self.ctx.store.check([key]):
                    continue
                out.append((index, pickle.loads(self.ctx.store.get(key))))
                self.ctx.store.delete_key(key)
            self._pending.discard(index)
        return out


def new_name(ctx: DistContext) -> str:
    """A name no earlier queue of this process group has had: rank 0's random one, on every rank."""
    return broadcast_from_main(uuid.uuid4().hex if ctx.is_main else None, ctx)


def train_data_parallel(model: nn.Module, fit: Callable[[nn.Module, tuple[int, int]], Any], ctx: DistContext):
    """Train one model on all ranks with :class:`~torch.nn.parallel.DistributedDataParallel`.

    ``fit(module, shard)`` is a training call such as
    ``lambda m, shard: posenc.lab.train.train(m, data, cfg, shard=shard)``: every rank draws the same
    global batch from the same seed and computes the rows :func:`posenc.lab.train.batch_rows` gives it, and DDP
    averages the gradients, so the update is the one-process update on the whole batch. The
    recorded per-step losses (each rank's share) are averaged over the ranks afterwards, giving the
    loss of the whole batch at every step. For a lone process this is ``fit(model, (0, 1))``.

    Args:
        model: the module to train, identical on every rank (same seed), on ``ctx.device``.
        fit: trains the module it is given with the shard it is given; returns a
            :class:`~posenc.lab.train.TrainResult`.
        ctx: the run's context.

    Returns:
        ``fit``'s result, with ``losses`` those of the global batch. ``model`` is trained in place
        (identical on every rank).

    Raises:
        ValueError: if the ranks share GPUs (a CUDA ``ctx`` on gloo, see :func:`init`): NCCL cannot
            put two ranks on one GPU, and splitting a batch over processes on one GPU is no faster
            than one process.
    """
    if not ctx.distributed:
        return fit(model, (0, 1))
    if torch.device(ctx.device).type == "cuda" and ctx.backend != "nccl":
        raise ValueError(f"data parallel training needs a GPU per process, but the {ctx.world_size} processes of this "
                         f"run share GPUs (backend={ctx.backend!r}, this one on {ctx.device}); start at most as many "
                         "processes per machine as it has GPUs, or train one model per process (no --ddp)")
    device_ids = [torch.device(ctx.device).index] if ctx.backend == "nccl" else None
    wrapped = nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    result = fit(wrapped, (ctx.rank, ctx.world_size))
    losses = torch.tensor(result.losses, dtype=torch.float64, device=ctx.device)  # (steps,)
    dist.all_reduce(losses)
    result.losses = (losses / ctx.world_size).tolist()
    return result
