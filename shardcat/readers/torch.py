"""A map-style dataset over a reader, for ``torch.utils.data.DataLoader``.

It needs no torch import: DataLoader, ``DistributedSampler`` and friends take
any object with ``__len__`` and ``__getitem__``. With ``num_workers > 0`` each
worker reopens the catalog connection by itself (fork) or unpickles the reader
(spawn).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

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
