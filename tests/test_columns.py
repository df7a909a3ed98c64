"""Columns: a scan's records column by column, built from entries and selected from."""

from __future__ import annotations

from shardcat.formats.base import Columns, Entry


def test_of_fills_every_column_and_leaves_absent_values_none() -> None:
    entries = [
        Entry("a", 0, 10, {"label": 1}, [("jpg", 512, 10)]),
        Entry("b", 100, 20, {"score": 0.5, "label": 2}, [], ((100, 5), (300, 15)), 3),
        Entry("c", 200, 30, {}, [("jpg", 712, 30), ("cls", 1300, 1, ((1300, 1),))]),
    ]
    c = Columns.of(iter(entries))
    assert (c.keys, c.offsets, c.lengths, len(c)) == (
        ["a", "b", "c"],
        [0, 100, 200],
        [10, 20, 30],
        3,
    )
    assert list(c.fields) == ["label", "score"]  # first-seen order
    assert c.fields == {"label": [1, 2, None], "score": [None, 0.5, None]}
    assert c.members == [
        (0, "jpg", 512, 10),
        (2, "jpg", 712, 30),
        (2, "cls", 1300, 1, ((1300, 1),)),
    ]
    assert c.extents == [None, ((100, 5), (300, 15)), None]
    assert c.items == [None, 3, None]
    plain = Columns.of([Entry(None, 0, 4)])
    assert (plain.keys, plain.fields, plain.members, plain.extents, plain.items) == (
        [None],
        {},
        [],
        None,
        None,
    )


def test_select_keeps_rows_in_order_and_renumbers_members() -> None:
    c = Columns.of(
        [
            Entry("a", 0, 1, {"x": 1}, [("m", 0, 1)]),
            Entry("b", 1, 1, {"x": 2}, [("m", 1, 1)]),
            Entry("c", 2, 1, {"x": 3}, [("m", 2, 1), ("n", 3, 1)], None, 7),
        ]
    )
    kept = c.select([0, 2])
    assert (kept.keys, kept.offsets, kept.fields) == (["a", "c"], [0, 2], {"x": [1, 3]})
    assert kept.members == [(0, "m", 0, 1), (1, "m", 2, 1), (1, "n", 3, 1)]
    assert kept.items == [None, 7]
    assert c.keys == ["a", "b", "c"]  # the original is left as it was
