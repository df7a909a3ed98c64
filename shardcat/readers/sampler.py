"""``RecordSampler``: a distributed sampler for ``torch.utils.data.DataLoader`` whose
order is seeded, resumable mid-epoch, elastic across world sizes and shard-aware.

**The global order** of an epoch is a permutation of the dataset's indices that
depends only on ``(seed, epoch, len(dataset), shuffle, block_size, window)`` and,
for ``shuffle="block"``, the dataset's shard layout; never on the world size:

- ``shuffle=False``: ``0, 1, 2, ...``;
- ``"full"`` (or ``True``, the default, as torch's ``DistributedSampler``): a
  uniform permutation. Below :data:`LAZY_FROM` indices it is one numpy array
  per epoch (``PCG64``); from there on it is computed lazily, place by place,
  by a keyed bijection of ``[0, n)`` (a balanced Feistel network whose keys come
  from ``(seed, epoch)``, cycle-walked back into range): no memory and no
  start-up cost at any size, the same guarantees;
- ``"block"``: the indices are cut into blocks of ``block_size`` consecutive
  indices that never straddle a shard (a dataset's ``shard_starts()``), the
  blocks are permuted, and each run of ``window`` consecutive blocks of that
  permutation is shuffled as one pool. Reads stay within ``window`` places of
  a few shards at a time, and nothing the size of the dataset is ever built:
  one window of indices at a time.

**Ranks.** Rank ``r`` of ``W`` takes global places ``r, r + W, r + 2W, ...``
(as torch's ``DistributedSampler``), so when every rank has taken ``k``
samples the ranks together hold exactly the first ``W * k`` of the order.
Every rank gets the same number: the order is padded by repeating it from
its start (at most one sample per rank), or the tail is dropped with
``drop_last=True``.

**Resume.** ``state_dict()`` holds the global place reached (``consumed``:
the iteration's start plus ``W *`` the samples this rank handed out), so the
state of any rank resumes every rank, with any world size: the new ranks
split the rest of the same order (the padding is computed for the rest).
``load_state_dict`` refuses (:class:`SamplerStateError`) a state from another
dataset length, seed, shuffle or shard layout.
"""

from __future__ import annotations

import copy
import zlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, Protocol

import numpy as np

from shardcat.errors import SamplerError, SamplerStateError

__all__ = ["STATE_KIND", "RecordSampler", "Shuffle"]

STATE_KIND = "shardcat.RecordSampler"
STATE_VERSION = 1
Shuffle = Literal[False, True, "full", "block"]
_CHUNK = 1 << 16  # indices handed out per numpy slice of the sequential and full orders
LAZY_FROM = 1 << 24  # "full" orders of this many indices or more are computed lazily
_FULL_KINDS = ("array", "lazy")


class Sized(Protocol):
    def __len__(self) -> int: ...


def _rng(seed: int, epoch: int, *tags: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, *tags])))


def _index_dtype(n: int) -> type[np.signedinteger[Any]]:
    return np.int32 if n < 2**31 else np.int64


class _Order:
    """One epoch's global order; ``chunks(a, b, step)`` is ``order[a:b:step]`` in pieces."""

    def __init__(self, n: int) -> None:
        self.n = n

    def chunks(self, start: int, stop: int, step: int) -> Iterator[np.ndarray]:
        for a in range(start, stop, _CHUNK * step):
            yield self.part(a, min(stop, a + _CHUNK * step), step)

    def part(self, start: int, stop: int, step: int) -> np.ndarray:
        return np.arange(start, stop, step, dtype=np.int64)


class _FullOrder(_Order):
    def __init__(self, n: int, seed: int, epoch: int) -> None:
        super().__init__(n)
        self.perm = np.arange(n, dtype=_index_dtype(n))
        _rng(seed, epoch, 2).shuffle(self.perm)

    def part(self, start: int, stop: int, step: int) -> np.ndarray:
        return self.perm[start:stop:step]


class KeyedPermutation:
    """A keyed permutation of ``[0, n)`` computed place by place, never held.

    The domain is the smallest ``4**h >= n`` (under ``4 n``): a balanced Feistel
    network on its ``2 h`` bits (six rounds, keys drawn from ``entropy``, e.g.
    ``(seed, epoch, tag)``; the round function a 64-bit finalizer mix) is a
    bijection of it; a value that falls at or past ``n`` is sent through the
    network again until it lands below ``n`` (cycle walking), which keeps a
    bijection of ``[0, n)`` (at most four passes expected).
    """

    ROUNDS = 6

    def __init__(self, n: int, *entropy: int) -> None:
        self.n = n
        self.half = max(1, ((n - 1).bit_length() + 1) // 2)
        self.mask = np.uint64((1 << self.half) - 1)
        self.keys = np.random.SeedSequence(list(entropy)).generate_state(self.ROUNDS, np.uint64)

    def _network(self, x: np.ndarray) -> np.ndarray:
        half, mask = np.uint64(self.half), self.mask
        left, right = x >> half, x & mask
        for key in self.keys:
            z = right ^ key
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            left, right = right, left ^ ((z ^ (z >> np.uint64(31))) & mask)
        return (left << half) | right

    def at(self, places: np.ndarray) -> np.ndarray:
        """The permutation's values at ``places`` (each in ``[0, n)``)."""
        values = self._network(np.asarray(places, dtype=np.uint64))
        n = np.uint64(self.n)
        outside = np.flatnonzero(values >= n)
        while outside.size:
            values[outside] = self._network(values[outside])
            outside = outside[values[outside] >= n]
        return values.astype(np.int64)


class _LazyFullOrder(_Order):
    def __init__(self, n: int, seed: int, epoch: int) -> None:
        super().__init__(n)
        self.permutation = KeyedPermutation(n, seed, epoch, 3)

    def part(self, start: int, stop: int, step: int) -> np.ndarray:
        return self.permutation.at(np.arange(start, stop, step, dtype=np.uint64))


def blocks(n: int, starts: Sequence[int] | None, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(first index, length) of each block: ``block_size`` consecutive indices, cut
    at every shard start too (shards in ``starts``, ascending; None: one shard)."""
    edges = np.unique(np.asarray([0, *(starts or ())], dtype=np.int64))
    edges = edges[(edges >= 0) & (edges < n)]
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    ends = np.append(edges[1:], n)
    per_segment = -(-(ends - edges) // block_size)
    segment = np.repeat(np.arange(len(edges)), per_segment)
    within = np.arange(len(segment)) - np.repeat(np.cumsum(per_segment) - per_segment, per_segment)
    first = edges[segment] + within * block_size
    return first, np.minimum(block_size, ends[segment] - first)


class _BlockOrder(_Order):
    def __init__(
        self, n: int, seed: int, epoch: int, starts: Sequence[int] | None, size: int, window: int
    ) -> None:
        super().__init__(n)
        self.seed, self.epoch = seed, epoch
        first, length = blocks(n, starts, size)
        perm = _rng(seed, epoch, 0).permutation(len(first))
        self.first, self.length = first[perm], length[perm]
        self.window = window
        heads = np.arange(0, len(perm), window)
        sizes = np.add.reduceat(self.length, heads) if len(perm) else np.zeros(0, np.int64)
        self.ends = np.cumsum(sizes)  # global place just past each window

    def pool(self, w: int) -> np.ndarray:
        """Window ``w``'s indices in their shuffled order."""
        a, b = w * self.window, (w + 1) * self.window
        parts = [
            np.arange(f, f + n) for f, n in zip(self.first[a:b], self.length[a:b], strict=True)
        ]
        items = np.concatenate(parts)
        _rng(self.seed, self.epoch, 1, w).shuffle(items)
        return items

    def chunks(self, start: int, stop: int, step: int) -> Iterator[np.ndarray]:
        w = int(np.searchsorted(self.ends, start, side="right"))
        while start < stop and w < len(self.ends):
            begin, end = int(self.ends[w - 1]) if w else 0, int(self.ends[w])
            if start < end:  # start is the first place of this rank at or after begin
                yield self.pool(w)[start - begin : min(stop, end) - begin : step]
                start += -(-(min(stop, end) - start) // step) * step
            w += 1

    def part(self, start: int, stop: int, step: int) -> np.ndarray:
        return np.concatenate([np.zeros(0, np.int64), *self.chunks(start, stop, step)])


def _world(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    """The world size and rank: given, or torch.distributed's when it is initialized."""
    if num_replicas is None or rank is None:
        try:
            import torch.distributed as dist

            running = dist.is_available() and dist.is_initialized()
        except ImportError:
            running = False
        if num_replicas is None:
            num_replicas = dist.get_world_size() if running else 1
        if rank is None:
            rank = dist.get_rank() if running else 0
    return num_replicas, rank


def _whole(value: Any, name: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise SamplerError(f"{name} must be an integer >= {least}, not {value!r}")
    return int(value)


class RecordSampler:
    """The indices of ``dataset`` for one rank, in the epoch's global order (see the
    module docstring); pass it to ``DataLoader(sampler=...)``.

    ``shuffle`` is True by default, as torch's ``DistributedSampler``: a new
    uniform permutation per epoch (True is ``"full"``); ``False`` keeps the
    dataset's order, ``"block"`` shuffles shard-local blocks.
    ``set_epoch(e)`` before each epoch (a new order per epoch). ``state_dict()``
    and ``load_state_dict()`` save and resume the place in the epoch. The count
    is of indices handed to the loader, which runs ahead of training by its
    prefetch (``num_workers * prefetch_factor`` batches). For an exact resume
    point, either use torchdata's ``StatefulDataLoader`` (it snapshots the
    sampler's state with each batch it yields: save ``loader.state_dict()``, and
    for another world size take this sampler's part with :meth:`state_in`), or
    pass the samples this rank has trained on since the iteration began:
    ``sampler.state_dict(consumed=batches_done * batch_size)``. Every rank is
    assumed to have taken as many samples as the others (lockstep training).
    """

    def __init__(
        self,
        dataset: Sized,
        num_replicas: int | None = None,
        rank: int | None = None,
        seed: int = 0,
        shuffle: Shuffle = True,
        block_size: int = 4096,
        window: int = 16,
        drop_last: bool = False,
    ) -> None:
        num_replicas, rank = _world(num_replicas, rank)
        self.num_replicas = _whole(num_replicas, "num_replicas", 1)
        self.rank = _whole(rank, "rank", 0)
        if self.rank >= self.num_replicas:
            raise SamplerError(f"rank {rank} is not below num_replicas {num_replicas}")
        if shuffle is True:
            shuffle = "full"  # torch's shuffle=True: one uniform permutation per epoch
        if shuffle not in (False, "full", "block") or not isinstance(shuffle, (bool, str)):
            raise SamplerError(
                f'shuffle must be True (= "full"), False or "block", not {shuffle!r}'
            )
        self.shuffle: Shuffle = shuffle
        self.seed = _whole(seed, "seed", 0)
        self.block_size = _whole(block_size, "block_size", 1)
        self.window = _whole(window, "window", 1)
        self.drop_last = bool(drop_last)
        self.dataset = dataset
        self.length = len(dataset)
        starts = getattr(dataset, "shard_starts", None)
        self.shard_starts: list[int] | None = None if starts is None else starts()
        bounds = np.asarray(self.shard_starts or [], dtype=np.int64)
        self._layout = zlib.crc32(bounds.tobytes())
        # a Mixture's items are (stream, index) pairs, located from the epoch's places
        self._locate = getattr(dataset, "locate", None)
        if self._locate is not None:
            mixed = np.int64(getattr(dataset, "layout", 0))  # its streams' sizes and counts
            self._layout = zlib.crc32(mixed.tobytes(), self._layout)
        self.epoch = 0
        self._resume = 0  # the global place the next iteration starts at
        self._start = 0  # ... the current (or last) iteration started at
        self._yielded = 0  # indices this rank handed out in that iteration
        self._iteration = 0  # which iterator counts (the newest one)
        self._active = False  # an iteration is under way (begun, not exhausted)
        self._cached: tuple[int, _Order] | None = None
        self._full = "lazy" if self.length >= LAZY_FROM else "array"  # how "full" is computed

    # -- the order ---------------------------------------------------------------

    def _order(self, epoch: int | None = None) -> _Order:
        """The order of ``epoch`` (default: the sampler's)."""
        epoch = self.epoch if epoch is None else epoch
        if self._cached is not None and self._cached[0] == epoch:
            return self._cached[1]
        n = self.length
        order: _Order
        if self.shuffle == "full" and self._full == "lazy":
            order = _LazyFullOrder(n, self.seed, epoch)
        elif self.shuffle == "full":
            order = _FullOrder(n, self.seed, epoch)
        elif self.shuffle == "block":
            order = _BlockOrder(
                n, self.seed, epoch, self.shard_starts, self.block_size, self.window
            )
        else:
            order = _Order(n)
        self._cached = (epoch, order)
        return order

    def global_order(self) -> np.ndarray:
        """The whole epoch's order (every rank's samples interleaved), unpadded."""
        return self._order().part(0, self.length, 1)

    def _span(self, start: int) -> int:
        """Samples per rank for an iteration starting at global place ``start``."""
        rest = max(0, self.length - start)
        if self.drop_last:
            return rest // self.num_replicas
        return -(-rest // self.num_replicas)

    def __len__(self) -> int:
        """Samples of this rank in the iteration under way, else in the next one."""
        return self._span(self._start if self._active else self._resume)

    def __iter__(self) -> Iterator[int]:
        start, self._resume = self._resume, 0  # a second pass over the epoch starts afresh
        self._start, self._yielded, self._active = start, 0, True
        self._iteration += 1
        return self._indices(self._iteration, start, self._span(start))

    def _indices(self, iteration: int, start: int, count: int) -> Iterator[int]:
        n, world = self.length, self.num_replicas
        first = start + self.rank
        stop = min(n, first + count * world)
        order = self._order()
        todo = count
        for chunk in order.chunks(first, stop, world):
            for index in self._items(chunk):
                if self._iteration == iteration:
                    self._yielded += 1
                todo -= 1
                yield index
        for k in range(count - todo, count):  # padding: places past the end wrap to the start
            place = (first + k * world - n) % n
            for index in self._items(order.part(place, place + 1, 1)):
                if self._iteration == iteration:
                    self._yielded += 1
                yield index
        if self._iteration == iteration:
            self._active = False

    def _items(self, chunk: np.ndarray, epoch: int | None = None) -> list[Any]:
        """What the loader gets for these indices of the order (of ``epoch``, default
        the sampler's): the indices, or a mixture's ``(stream, index)`` pairs."""
        if self._locate is None:
            return chunk.tolist()
        epoch = self.epoch if epoch is None else epoch
        streams, indices = self._locate(self.seed, epoch, chunk)
        return list(zip(streams.tolist(), indices.tolist(), strict=True))

    def set_epoch(self, epoch: int) -> None:
        """The epoch to sample next; a saved place in the same epoch is kept."""
        epoch = _whole(epoch, "epoch", 0)
        if epoch != self.epoch:
            self.epoch = epoch
            self._resume = self._start = self._yielded = 0
            self._active = False

    # -- state -------------------------------------------------------------------

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Where the epoch stands: the global place reached, and what the order depends on.

        ``consumed``: the samples this rank trained on since the iteration began
        (default: those the sampler handed out; see the class docstring).
        """
        taken = self._yielded if consumed is None else _whole(consumed, "consumed", 0)
        return {
            "kind": STATE_KIND,
            "version": STATE_VERSION,
            "seed": self.seed,
            "epoch": self.epoch,
            "consumed": self._start + taken * self.num_replicas,
            "length": self.length,
            "shuffle": self.shuffle,
            "full": self._full,
            "block_size": self.block_size,
            "window": self.window,
            "layout": self._layout,
            "num_replicas": self.num_replicas,  # for the record: any world size may resume
            "drop_last": self.drop_last,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue the saved epoch at the saved place (with this sampler's world size)."""
        self._check(state)
        consumed = _whole(state["consumed"], "consumed", 0)
        self.epoch = _whole(state["epoch"], "epoch", 0)
        if self.shuffle == "full":  # the saved run's order goes on (states before 0.2: arrays)
            self._full, self._cached = state.get("full", "array"), None
        self._resume = self._start = consumed
        self._yielded, self._active = 0, False

    def _check(self, state: Mapping[str, Any]) -> None:
        if not isinstance(state, Mapping) or state.get("kind") != STATE_KIND:
            raise SamplerStateError("not a RecordSampler state (no 'kind' of one)")
        if state.get("version") != STATE_VERSION:
            raise SamplerStateError(f"RecordSampler state version {state.get('version')!r}")
        missing = [k for k in ("seed", "epoch", "consumed", "length", "shuffle") if k not in state]
        if missing:
            raise SamplerStateError(f"RecordSampler state without {', '.join(missing)}")
        mine: dict[str, Any] = {"length": self.length, "seed": self.seed, "shuffle": self.shuffle}
        if self.shuffle == "block":
            mine.update(block_size=self.block_size, window=self.window, layout=self._layout)
        if self._locate is not None:  # a mixture of other streams or counts is another order
            mine.update(layout=self._layout)
        if self.shuffle == "full" and state.get("full", "array") not in _FULL_KINDS:
            raise SamplerStateError(
                f"RecordSampler state of an unknown full order {state['full']!r}"
            )
        wrong = [f"{k} {state.get(k)!r} (here {v!r})" for k, v in mine.items() if state.get(k) != v]
        if wrong:
            raise SamplerStateError(
                "the state is of another order: "
                + "; ".join(wrong)
                + " (the dataset changed length or shards, or the sampler's arguments differ)"
            )

    def seen(self, state: Mapping[str, Any] | None = None) -> Iterator[Any]:
        """The keys a run consumed up to ``state`` (a :meth:`state_dict` saved by any
        rank of any world size; default: this sampler's own), in the global order:
        every epoch before the state's in full (as its world size padded or cut it),
        then the state's epoch's places before its ``consumed``. Duplicates are
        listed as often as the loaders yielded them (padding). Keys as the dataset's
        ``keys_of`` names them: a ``RecordDataset``'s keys (of its ``keys=`` subset
        too), a ``Mixture``'s ``(stream name, key)``. Assumes each epoch ran with
        the state's world size and ran to its end."""
        keys_of = getattr(self.dataset, "keys_of", None)
        if keys_of is None:
            raise SamplerError(f"{type(self.dataset).__name__} cannot name its items' keys")
        run = copy.copy(self)  # the state's order (its kind of full order), self untouched
        run.load_state_dict(self.state_dict() if state is None else state)
        world = _whole((state or {}).get("num_replicas", self.num_replicas), "num_replicas", 1)
        whole = run.length // world * world if self.drop_last else -(-run.length // world) * world
        for epoch in range(run.epoch + 1):
            stop = whole if epoch < run.epoch else run._resume
            order, n = run._order(epoch), run.length
            for chunk in order.chunks(0, min(stop, n), 1):
                yield from keys_of(run._items(chunk, epoch))
            for place in range(n, stop):  # padding: places past the end wrap to the start
                yield from keys_of(run._items(order.part(place % n, place % n + 1, 1), epoch))

    @staticmethod
    def state_in(loader_state: Any) -> dict[str, Any]:
        """The RecordSampler state inside a saved loader state (torchdata's
        ``StatefulDataLoader.state_dict()``), to resume with another world size."""
        found = _find_state(loader_state)
        if found is None:
            raise SamplerStateError("no RecordSampler state in this loader state")
        return found

    def __repr__(self) -> str:
        return (
            f"RecordSampler(len={self.length}, rank={self.rank}/{self.num_replicas}, "
            f"shuffle={self.shuffle!r}, seed={self.seed}, epoch={self.epoch})"
        )


def _find_state(value: Any) -> dict[str, Any] | None:
    if isinstance(value, Mapping):
        if value.get("kind") == STATE_KIND:
            return dict(value)
        values: Any = value.values()
    elif isinstance(value, (list, tuple)):
        values = value
    else:
        return None
    for item in values:
        found = _find_state(item)
        if found is not None:
            return found
    return None
