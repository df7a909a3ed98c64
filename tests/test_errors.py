"""The error hierarchy's promises: every ShardcatError and warning shows URLs
without their secrets (``errors.masked``), and every error crosses a process
boundary as itself: pickled (ingest workers send theirs to the parent) and
re-raised from its message (torch's DataLoader rebuilds a worker's exception as
``type(exc)(message)``), so ``except CorruptRecordError`` works in a training loop
with ``num_workers > 0``."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
from damage import flip_keeping_mtime
from features import payloads

import shardcat.errors as errors
from shardcat import Catalog, CorruptRecordError, ShardIOError, TFRecordWriter, make_example
from shardcat.testing.required import need

# One instance of every error class, built as the library builds it.
EXAMPLES: dict[type[BaseException], tuple[Any, ...]] = {
    errors.CorruptRecordError: ("s3://b/x.tar?X-Amz-Signature=s", 120, "bad CRC"),
    errors.LegacyIndexError: ("/d/a.index", 0, "not a pickle"),
    errors.NoSuchFeatureError: ("k1", "image", ["label", "score"]),
    errors.IngestError: ("2 shard(s) failed", ["a", "b"]),
    errors.StaleShardError: ("/d/a.tfrecord changed", "/d/a.tfrecord"),
    errors.MissingShardError: ("/d/a.tfrecord is gone", "/d/a.tfrecord"),
    errors.ShardIOError: ("http://u:pw@h/a.tar: refused", "http://u:pw@h/a.tar"),
}


def _all_errors() -> list[type[BaseException]]:
    found = [getattr(errors, name) for name in errors.__all__]
    return [c for c in found if isinstance(c, type) and issubclass(c, errors.ShardcatError)]


def _example(cls: type[BaseException]) -> BaseException:
    return cls(*EXAMPLES.get(cls, ("something went wrong at http://u:pw@h/x",)))


def test_every_error_class_has_an_example_or_takes_a_message() -> None:
    assert len(_all_errors()) >= 19
    for cls in _all_errors():
        assert "pw" not in str(_example(cls)) and "X-Amz-Signature" not in str(_example(cls))


@pytest.mark.parametrize("cls", _all_errors(), ids=lambda c: c.__name__)
def test_every_error_pickles_as_itself(cls: type[BaseException]) -> None:
    error = _example(cls)
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is cls and str(back) == str(error)
    assert vars(back) == vars(error)  # path, offset, failures, available...


@pytest.mark.parametrize("cls", _all_errors(), ids=lambda c: c.__name__)
def test_every_error_is_rebuilt_from_its_message(cls: type[BaseException]) -> None:
    """What torch's DataLoader does with a worker's exception: ``type(exc)(text)``."""
    text = f"Caught {cls.__name__} in DataLoader worker process 0.\n{_example(cls)}"
    again = cls(text)
    assert type(again) is cls and str(again) == text


def test_corrupt_record_in_a_dataloader_worker_is_a_corrupt_record_error(tmp_path: Path) -> None:
    """A record damaged after ingest, past the fingerprint's head and tail (bit rot:
    same size, mtime put back), found by its CRC: read in a worker process, the
    training loop gets a CorruptRecordError (torch turned it into a RuntimeError: CorruptRecordError
    could not be made from a message)."""
    torch = need("torch", why="shardcat[torch]")
    from shardcat.torch import RecordDataset

    shard = tmp_path / "a.tfrecord"
    with TFRecordWriter(shard) as w:
        for i in range(400):
            record = make_example({"key": f"k{i:03d}".encode(), "image": bytes([i % 256]) * 1000})
            w.write(record.SerializeToString())
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(str(shard), "d").close()
        reader = cat.dataset("d", verify_crc=True)
        frame = shard.stat().st_size // 400  # records of one size
        at = 200 * frame + 40  # inside record k200's payload
        flip_keeping_mtime(shard, at)
        assert reader.get_raw("k199") == payloads(str(shard))["k199"]
        with pytest.raises(CorruptRecordError, match=r"a\.tfrecord: at byte"):
            reader.get_raw("k200")
        loader = torch.utils.data.DataLoader(RecordDataset(reader), batch_size=None, num_workers=1)
        with pytest.raises(CorruptRecordError, match=r"worker process 0(.|\n)*at byte"):
            for _ in loader:
                pass


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("s3://b/x.tar?X-Amz-Signature=abc&X-Amz-Date=1: bad", "s3://b/x.tar?...: bad"),
        ("(https://h/x.tar?AWSAccessKeyId=A&Signature=S&Expires=1)", "(https://h/x.tar?...)"),
        (
            "https://storage.googleapis.com/b/x?X-Goog-Signature=f00",
            "https://storage.googleapis.com/b/x?...",
        ),
        (
            "https://a.blob.core.windows.net/c/x.tar?sv=2022&sp=r&sig=Zm9v%3D.",
            "https://a.blob.core.windows.net/c/x.tar?....",
        ),
        ("https://h/x?access_token=t, then", "https://h/x?..., then"),
        ("webhdfs://nn:9870/x?op=OPEN&delegation=tok", "webhdfs://nn:9870/x?..."),
        (
            "with url: /webhdfs/v1/x?delegation=tok (Caused by",
            "with url: /webhdfs/v1/x?... (Caused by",
        ),
        ("did you mean x? or y?", "did you mean x? or y?"),
        ("http://me:pw@h:8080/x.tfrecord changed", "http://me:***@h:8080/x.tfrecord changed"),
        ("cannot open postgresql://u:pw@db/cat", "cannot open postgresql://u:***@db/cat"),
        ("key 'http://site/img.jpg?w=512' not found", "key 'http://site/img.jpg?w=512' not found"),
        ("http://me@h/x and /data/x.tar?y", "http://me@h/x and /data/x.tar?y"),
    ],
)
def test_masked_hides_url_secrets_and_keeps_the_rest(text: str, shown: str) -> None:
    from shardcat.errors import masked

    assert masked(text) == shown
    error = ShardIOError(f"read failed: {text}", text)
    assert str(error) == f"read failed: {shown}" and error.path == text
    assert isinstance(error, OSError)


def test_a_hint_crosses_a_process_boundary_and_keeps_both_spellings() -> None:
    hint = errors.Hint("(use on_duplicate='first')", "(use --on-duplicate first)")
    error = errors.DuplicateKeyError("duplicate key 'k' in a.tfrecord", hint=hint)
    assert str(error) == "duplicate key 'k' in a.tfrecord (use on_duplicate='first')"
    back = pickle.loads(pickle.dumps(error))
    assert (str(back), back.hint) == (str(error), hint)
    assert back.cli_message() == "duplicate key 'k' in a.tfrecord (use --on-duplicate first)"
    rebuilt = errors.DuplicateKeyError(str(error))  # as torch's DataLoader rebuilds it
    assert (str(rebuilt), rebuilt.hint) == (str(error), None)
    lead = errors.CatalogError("must be one of a, b", hint=errors.Hint("x", "--x", lead=True))
    assert (str(lead), lead.cli_message()) == ("x must be one of a, b", "--x must be one of a, b")
