"""``Mixture``: a weighted mixture of datasets for training, sampled by ``RecordSampler``.

A :class:`Mixture` is a map-style dataset over :class:`Stream` s, each a dataset
(a ``RecordDataset``: a whole catalog dataset, or a ``where`` subset of one through
``keys=``; streams may come from different catalogs) with one of:

- ``weight``: a relative proportion. The epoch has ``epoch_size`` items
  (default: the streams' records together) split by weight;
- ``repeat``: an absolute multiple of the stream's records (``0.5``: half of
  them, ``3``: every record three times);
- ``choose``: an absolute count of items.

Either every stream has a ``weight`` or none has (``repeat=1`` is the default
then), as in Mosaic streaming's ``Stream(proportion | repeat | choose)``. With
absolute streams and an ``epoch_size``, the counts are scaled to it.

**Exact counts.** Each epoch takes exactly :meth:`Mixture.counts` items of each
stream: shares are split by largest remainder (exact fractions, ties to the
earlier stream), so they add up to the epoch size and differ from the exact
proportion by less than one item. Within a stream of ``n`` records that takes
``c`` items, every record comes ``c // n`` times and ``c % n`` distinct others
once more, chosen anew each epoch from ``(seed, epoch, stream)`` by a keyed
permutation (no memory held for it).

**Order.** ``RecordSampler(mixture, ...)`` permutes the epoch's items (a
virtual index per item) exactly as it permutes a dataset's records, so
everything it promises holds for mixtures: one global order from ``(seed,
epoch)`` only, equal ranks, ``state_dict`` that resumes on another world size,
exact ``StatefulDataLoader`` resume. It hands the loader ``(stream, index)``
pairs; the item of a pair is ``(stream name, the stream dataset's item)``, so
the default collate gives ``[names, batch]``.
"""

from __future__ import annotations

import operator
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from shardcat.errors import SamplerError
from shardcat.readers.sampler import KeyedPermutation

__all__ = ["Mixture", "Stream"]


@dataclass(frozen=True)
class Stream:
    """One stream of a :class:`Mixture`: a map-style dataset and how much of it an
    epoch takes (``weight``, or ``repeat``, or ``choose``; see the module docstring)."""

    dataset: Any
    weight: float | None = None
    repeat: float | None = None
    choose: int | None = None
    name: str | None = None


def _share(total: int, parts: Sequence[Fraction]) -> list[int]:
    """``total`` split in proportion to ``parts`` by largest remainder (ties: earlier)."""
    whole = sum(parts)
    if whole <= 0:
        raise SamplerError("a mixture needs a stream with a positive share")
    quotas = [total * p / whole for p in parts]
    counts = [int(q) for q in quotas]
    by_remainder = sorted(range(len(parts)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts


def _positive(value: Any, what: str) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise SamplerError(f"{what} must be a number, not {value!r}")
    if not value >= 0 or value == float("inf"):
        raise SamplerError(f"{what} must be a finite number >= 0, not {value!r}")
    return Fraction(float(value))


class Mixture:
    """A weighted mixture of streams (see the module docstring)."""

    def __init__(self, streams: Sequence[Stream], epoch_size: int | None = None) -> None:
        self.streams = list(streams)
        if not self.streams or not all(isinstance(s, Stream) for s in self.streams):
            raise SamplerError("a Mixture takes a non-empty list of Stream(...)")
        self.names = [s.name or f"stream{i}" for i, s in enumerate(self.streams)]
        if len(set(self.names)) != len(self.names):
            raise SamplerError(f"stream names must differ: {self.names}")
        self.sizes = [len(s.dataset) for s in self.streams]
        if epoch_size is not None and (
            isinstance(epoch_size, bool) or not isinstance(epoch_size, int) or epoch_size < 0
        ):
            raise SamplerError(f"epoch_size must be an integer >= 0, not {epoch_size!r}")
        self.counts = self._counts(epoch_size)
        self.offsets = np.cumsum([0, *self.counts], dtype=np.int64)
        self.layout = zlib.crc32(np.asarray([*self.sizes, *self.counts], np.int64).tobytes())

    def _counts(self, epoch_size: int | None) -> list[int]:
        weighted = [s.weight is not None for s in self.streams]
        if any(weighted) and not all(weighted):
            raise SamplerError("either every stream has a weight or none has (repeat/choose)")
        if all(weighted):
            weights = [
                _positive(s.weight, f"{n}'s weight")
                for s, n in zip(self.streams, self.names, strict=True)
            ]
            return _share(sum(self.sizes) if epoch_size is None else epoch_size, weights)
        counts: list[Fraction] = []
        for stream, name, size in zip(self.streams, self.names, self.sizes, strict=True):
            if stream.repeat is not None and stream.choose is not None:
                raise SamplerError(f"{name}: repeat or choose, not both")
            if stream.choose is not None:
                counts.append(Fraction(operator.index(stream.choose)))
                if counts[-1] < 0:
                    raise SamplerError(f"{name}'s choose must be >= 0, not {stream.choose}")
            else:
                repeat = 1 if stream.repeat is None else stream.repeat
                counts.append(size * _positive(repeat, f"{name}'s repeat"))
        if epoch_size is None:  # fractional counts (repeat 0.5 of 3) by largest remainder too
            epoch_size = round(sum(counts))
        return _share(epoch_size, counts) if sum(counts) else [0] * len(counts)

    def __len__(self) -> int:
        """Items per epoch (every epoch has as many)."""
        return int(self.offsets[-1])

    def locate(self, seed: int, epoch: int, places: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(stream, index in the stream) of the epoch's items ``places`` (virtual indices:
        stream ``s`` owns ``offsets[s]`` to ``offsets[s + 1]``)."""
        places = np.asarray(places, dtype=np.int64)
        stream = np.searchsorted(self.offsets, places, side="right") - 1
        index = places - self.offsets[stream]
        for s in np.unique(stream).tolist():
            at = stream == s
            size, j = self.sizes[s], index[at]
            full = (self.counts[s] // size) * size if size else 0
            extra = j >= full  # past the whole passes: the epoch's chosen others
            picked = j % size if size else j
            if extra.any():
                chosen = KeyedPermutation(size, seed, epoch, 4, s)
                picked[extra] = chosen.at(j[extra] - full)
            index[at] = picked
        return stream, index

    def __getitem__(self, item: tuple[int, int]) -> tuple[str, Any]:
        stream, index = item
        return self.names[stream], self.streams[stream].dataset[index]

    def __getitems__(self, items: Sequence[tuple[int, int]]) -> list[tuple[str, Any]]:
        """The items in the order asked, one batched fetch per stream."""
        out: list[Any] = [None] * len(items)
        wanted: dict[int, list[int]] = {}
        for at, (stream, _) in enumerate(items):
            wanted.setdefault(stream, []).append(at)
        for stream, places in wanted.items():
            dataset = self.streams[stream].dataset
            indices = [items[at][1] for at in places]
            got = (
                dataset.__getitems__(indices)
                if hasattr(dataset, "__getitems__")
                else [dataset[i] for i in indices]
            )
            for at, value in zip(places, got, strict=True):
                out[at] = (self.names[stream], value)
        return out

    def keys_of(self, items: Sequence[tuple[int, int]]) -> list[tuple[str, Any]]:
        """``(stream name, key)`` of ``(stream, index)`` items, one ``keys_of`` per
        stream (:meth:`RecordSampler.seen <shardcat.torch.RecordSampler.seen>`)."""
        out: list[Any] = [None] * len(items)
        wanted: dict[int, list[int]] = {}
        for at, (stream, _) in enumerate(items):
            wanted.setdefault(stream, []).append(at)
        for stream, places in wanted.items():
            keys = self.streams[stream].dataset.keys_of([items[at][1] for at in places])
            for at, key in zip(places, keys, strict=True):
                out[at] = (self.names[stream], key)
        return out

    def __repr__(self) -> str:
        parts = ", ".join(f"{n}={c}" for n, c in zip(self.names, self.counts, strict=True))
        return f"Mixture({parts})"
