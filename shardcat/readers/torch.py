"""A map-style dataset over a reader, for ``torch.utils.data.DataLoader``.

It needs no torch import: DataLoader, ``DistributedSampler`` and friends take
any object with ``__len__`` and ``__getitem__``. With ``num_workers > 0`` each
worker reopens the catalog connection by itself (fork) or unpickles the reader
(spawn). A batch is fetched with ``__getitems__`` (torch's batched fetch): one
batched read (:mod:`shardcat.readers.batch`: on a SQLite catalog, one native call
that looks the batch up, reads it in (shard, offset) order, checks it and builds
TFRecord items straight off the wire). Its sampler is
:class:`~shardcat.readers.sampler.RecordSampler` (both are in ``shardcat.torch``).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

from shardcat.readers.reader import Reader

__all__ = ["RecordDataset"]


class RecordDataset:
    """Item ``i`` is record ``i`` of the reader (or of ``keys``, e.g. a ``where`` result).

    Items are ``{feature: value}`` dicts (:meth:`Reader.to_dict`: single values
    unwrapped, lists otherwise), of the ``features`` named only when given (a
    feature a record lacks is left out). ``transform`` receives that dict when
    ``features`` is given, else the decoded record (a ``tf.train.Example`` for
    TFRecord). Dicts of TFRecord records come straight off the checked payloads'
    wire, no protobuf objects: name the ``features`` a transform needs and it gets
    them at that speed.
    """

    def __init__(
        self,
        reader: Reader,
        keys: Sequence[str] | None = None,
        transform: Callable[[Any], Any] | None = None,
        *,
        features: Sequence[str] | None = None,
    ) -> None:
        self.reader = reader
        self.keys = None if keys is None else list(keys)
        self.transform = transform
        self.features = None if features is None else tuple(features)

    def __len__(self) -> int:
        return len(self.reader) if self.keys is None else len(self.keys)

    def __getitem__(self, index: int) -> Any:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """Items ``indices`` (duplicates allowed) in the order asked, from one batched
        read (``get_dicts_at``/``get_many_at``, or over ``keys`` ``get_dicts``/
        ``get_many``); ``IndexError`` when one is out of range, as a list's."""
        indices = [operator.index(i) for i in indices]
        reader, keys, transform = self.reader, self.keys, self.transform
        if transform is not None and self.features is None:  # decoded records
            if keys is None:
                records = reader.get_many_at(indices)
            else:
                records = reader.get_many([keys[i] for i in indices])
            return [transform(r) for r in records]
        if keys is None:
            items = reader.get_dicts_at(indices, self.features)
        else:
            items = reader.get_dicts([keys[i] for i in indices], self.features)
        return items if transform is None else [transform(item) for item in items]

    def keys_of(self, indices: Sequence[int]) -> list[str]:
        """The keys of items ``indices`` (one query; :meth:`RecordSampler.seen`)."""
        if self.keys is None:
            return self.reader.keys_at(list(indices))
        return [self.keys[i] for i in indices]

    def shard_starts(self) -> list[int] | None:
        """The index of each shard's first item (for a shard-local block shuffle);
        None over ``keys``, whose shards the dataset does not know."""
        return self.reader.shard_starts() if self.keys is None else None
