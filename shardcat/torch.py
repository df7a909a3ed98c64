"""The torch side of shardcat: ``RecordDataset`` (a map-style dataset over a reader),
``RecordSampler`` (its seeded, resumable, elastic, shard-aware sampler) and
``Mixture`` (weighted mixtures of ``Stream`` s, sampled by ``RecordSampler``).

Neither imports torch: ``from shardcat.torch import RecordDataset, RecordSampler``
works without it, and they work with torch's ``DataLoader`` and torchdata's
``StatefulDataLoader``. The code is in :mod:`shardcat.readers.torch` and
:mod:`shardcat.readers.sampler` and :mod:`shardcat.readers.mixture`.
"""

from __future__ import annotations

from shardcat.readers.mixture import Mixture, Stream
from shardcat.readers.sampler import RecordSampler, Shuffle
from shardcat.readers.torch import RecordDataset

__all__ = ["Mixture", "RecordDataset", "RecordSampler", "Shuffle", "Stream"]
