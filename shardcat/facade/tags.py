"""The tag methods of :class:`shardcat.Catalog` (:class:`Tags`): pin a dataset as
it is, list and remove tags. What a tag is and holds: :mod:`shardcat.catalog.tags`."""

from __future__ import annotations

from shardcat.catalog.store import Store
from shardcat.catalog.tags import TagInfo

__all__ = ["TagInfo", "Tags"]


class Tags:
    """:meth:`tag`, :meth:`untag`, :meth:`tags` of a catalog holding ``store``."""

    store: Store

    def tag(self, dataset: str, name: str) -> TagInfo:
        """Pin ``dataset`` as it is now, as tag ``name``: its shard versions (generation
        and file identity) and its record set, soft-deleted records left out. Read it
        later as ``"<dataset>@<name>"``: ``Catalog.dataset("train@v1")``,
        ``RecordDataset``, samplers, ``snapshot`` and SQL (the view ``"train@v1"``)
        see exactly that record set, after re-ingests, adds, deletes and undeletes of
        the dataset. A tag is read-only; a pinned shard whose file changed since is a
        :class:`~shardcat.errors.StaleShardError` naming the tag. The tag reads the
        dataset's rows by reference and copies them only before the dataset's ingest
        changes them (see :mod:`shardcat.catalog.tags`). :class:`CatalogError`
        for an unknown dataset, a bad name or one the dataset's tags have already."""
        return self.store.tag(dataset, name)

    def untag(self, dataset: str, name: str) -> TagInfo:
        """Remove tag ``name`` of ``dataset`` and the rows it pinned (files on disk are
        untouched); returns what it was. :class:`CatalogError` naming the dataset's
        tags when it has no such tag."""
        return self.store.untag(dataset, name)

    def tags(self, dataset: str | None = None) -> list[TagInfo]:
        """The tags of ``dataset`` (None: of every dataset), by dataset then name."""
        return self.store.tags(dataset)
