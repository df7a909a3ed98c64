"""Hypothesis: arbitrary keys and payloads -> shard -> ingest -> read back."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardcat import Catalog, TFRecordWriter, make_example

keys = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    min_size=1,
    max_size=20,
)
records = st.lists(st.tuples(keys, st.binary(max_size=300)), max_size=25, unique_by=lambda r: r[0])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shards=st.lists(records, min_size=1, max_size=3))
def test_ingest_then_read_back(shards):
    seen: set[str] = set()
    shards = [[r for r in shard if r[0] not in seen and not seen.add(r[0])] for shard in shards]
    expected = [r for shard in shards for r in shard]
    with tempfile.TemporaryDirectory() as tmp:
        for i, shard in enumerate(shards):
            with TFRecordWriter(Path(tmp) / f"part-{i}.tfrecord") as w:
                for key, payload in shard:
                    w.write(make_example({"key": key, "payload": payload}))
        with (
            Catalog(Path(tmp) / "c.sqlite") as cat,
            cat.ingest(f"{tmp}/part-*.tfrecord", "rt", workers=1) as reader,
        ):
            assert reader.get_keys() == [k for k, _ in expected]
            for position, (key, payload) in enumerate(expected):
                assert reader.get_feature_list(key, "payload") == [payload]
                assert reader.key_at(position) == key
            if expected:
                batch = reader.get_many([k for k, _ in reversed(expected)])
                assert [r.features.feature["payload"].bytes_list.value[0] for r in batch] == [
                    p for _, p in reversed(expected)
                ]
            assert cat.query("SELECT count(*) FROM rt") == [(len(expected),)]
