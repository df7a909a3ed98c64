"""A map-style dataset over a reader, for ``torch.utils.data.DataLoader``.

It needs no torch import: DataLoader, ``DistributedSampler`` and friends take
any object with ``__len__`` and ``__getitem__``. With ``num_workers > 0`` each
worker reopens the catalog connection by itself (fork) or unpickles the reader
(spawn). A batch is fetched with ``__getitems__`` (torch's batched fetch): one
query for the batch, reads in (shard, offset) order; without a ``transform``, a
TFRecord batch's items come straight off the checked payloads' wire (native). Its sampler is
:class:`~shardcat.readers.sampler.RecordSampler` (both are in ``shardcat.torch``).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

from shardcat.readers.hot import AGAIN
from shardcat.readers.reader import Reader

__all__ = ["RecordDataset"]


class RecordDataset:
    """Item ``i`` is record ``i`` of the reader (or of ``keys``, e.g. a ``where`` result).

    ``transform`` receives the decoded record; without one, items are
    ``{feature: value}`` dicts (single values unwrapped, lists otherwise).
    """

    def __init__(
        self,
        reader: Reader,
        keys: Sequence[str] | None = None,
        transform: Callable[[Any], Any] | None = None,
    ) -> None:
        self.reader = reader
        self.keys = None if keys is None else list(keys)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.reader) if self.keys is None else len(self.keys)

    def __getitem__(self, index: int) -> Any:
        if self.keys is None:
            record = self.reader.get_record_at(index)
        else:
            record = self.reader[self.keys[index]]
        if self.transform is not None:
            return self.transform(record)
        return self.reader.to_dict(record)

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """Items ``indices`` (duplicates allowed) in the order asked, from one batched
        read (``get_many_at``, or ``get_many`` over ``keys``); ``IndexError`` when
        one is out of range, as ``__getitem__``."""
        indices = [operator.index(i) for i in indices]
        reader, keys = self.reader, self.keys
        dicts = reader.native_dicts if self.transform is None else None
        if keys is None:
            records = reader.get_many_at(indices, raw=dicts is not None)
        else:
            records = reader.get_many([keys[i] for i in indices], raw=dicts is not None)
        if dicts is not None:  # checked payloads -> items straight off the wire
            items = list(map(dicts, records))
            for n, item in enumerate(items):
                if item is AGAIN:  # an odd Example: decoded, as __getitem__ does
                    items[n] = self[indices[n]]
            return items
        if self.transform is not None:
            return [self.transform(r) for r in records]
        to_dict = self.reader.to_dict
        return [to_dict(r) for r in records]

    def keys_of(self, indices: Sequence[int]) -> list[str]:
        """The keys of items ``indices`` (one query; :meth:`RecordSampler.seen`)."""
        if self.keys is None:
            return self.reader.keys_at(list(indices))
        return [self.keys[i] for i in indices]

    def shard_starts(self) -> list[int] | None:
        """The index of each shard's first item (for a shard-local block shuffle);
        None over ``keys``, whose shards the dataset does not know."""
        return self.reader.shard_starts() if self.keys is None else None
