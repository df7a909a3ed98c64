"""Byte sources: where a read's bytes come from. A local file read with ``pread``
(:mod:`.local`), a compressed shard read through stored seek points
(:mod:`.compressed`), an object in remote storage read by ranged requests
(:mod:`.remote` and its transports), the node-local shard cache (:mod:`.cache`)
and the per-process pool of open sources (:mod:`.pool`). Sources know bytes and
transport, nothing of formats or the catalog."""
