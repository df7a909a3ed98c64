"""A sample catalog for the ``catalog serve`` tests: TFRecord, tar, RecordIO and
Parquet datasets with real JPEG and PNG members (made with Pillow), JSON, text,
numbers and float lists, and records whose keys and values hold HTML."""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from features import b, ex_bytes, f32, i64

from shardcat import Catalog, TFRecordWriter
from shardcat.formats.irheader import pack
from shardcat.formats.recordio_frames import RecordIOWriter
from shardcat.testing.required import need

XSS_KEY = "<script>alert(1)</script>"
XSS_JSON = {"note": "<img src=x onerror=alert(2)>", "ok": True}
XSS_TEXT = "<b onmouseover=alert(3)>caption</b>"


def image(kind: str, size: tuple[int, int], color: tuple[int, int, int]) -> bytes:
    """A real image: ``kind`` JPEG or PNG of ``size`` in ``color`` with a white bar."""
    pil = need("PIL.Image", why="the serve tests make real JPEG/PNG members with Pillow")
    picture = pil.new("RGB", size, color)
    for x in range(size[0] // 4, size[0] // 2):
        for y in range(size[1] // 3, size[1] // 3 + 6):
            picture.putpixel((x, y), (255, 255, 255))
    out = io.BytesIO()
    picture.save(out, kind)
    return out.getvalue()


@dataclass
class Sample:
    """The catalog and what its records hold: ``images[(dataset, key, feature)]``."""

    catalog: Path
    shards: list[Path] = field(default_factory=list)
    images: dict[tuple[str, str, str], bytes] = field(default_factory=dict)


def _tfrecord(root: Path, sample: Sample) -> Path:
    path = root / "train-00000.tfrecord"
    with TFRecordWriter(path) as w:
        for i in range(12):
            key = f"rec_{i:06d}"
            jpeg = image("JPEG", (96, 64), (40 + 15 * i, 90, 200 - 10 * i))
            png = image("PNG", (48, 48), (200, 60 + 10 * i, 60))
            sample.images[("train", key, "image")] = jpeg
            sample.images[("train", key, "mask")] = png
            meta = json.dumps({"id": i, "tags": ["a", "b"], "source": "camera"}).encode()
            w.write(
                ex_bytes(
                    key=b(key.encode()),
                    image=b(jpeg),
                    mask=b(png),
                    label=i64(i % 3),
                    score=f32(i / 10),
                    meta=b(meta),
                    caption=b(f"a picture number {i}".encode()),
                    embedding=f32(*(float(j) / 8 for j in range(8))),
                )
            )
        w.write(
            ex_bytes(
                key=b(XSS_KEY.encode()),
                meta=b(json.dumps(XSS_JSON).encode()),
                caption=b(XSS_TEXT.encode()),
                label=i64(7),
            )
        )
    return path


def _tar(root: Path, sample: Sample) -> Path:
    path = root / "photos-00000.tar"
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as archive:
        for i in range(5):
            jpeg = image("JPEG", (80, 80), (10, 120 + 20 * i, 90))
            sample.images[("photos", f"s{i:03d}", "jpg")] = jpeg
            for ext, data in (
                ("jpg", jpeg),
                ("json", json.dumps({"width": 80, "i": i}).encode()),
                ("cls", str(i % 2).encode()),
            ):
                member = tarfile.TarInfo(f"s{i:03d}.{ext}")
                member.size = len(data)
                archive.addfile(member, io.BytesIO(data))
    return path


def _recordio(root: Path, sample: Sample) -> Path:
    path = root / "faces.rec"
    with RecordIOWriter(path) as w:
        for i in range(4):
            png = image("PNG", (32, 32), (30 * i, 30, 160))
            sample.images[("faces", str(i), "data")] = png
            w.write(pack((0, float(i), i, 0), png))
    return path


def _parquet(root: Path) -> Path:
    pa = need("pyarrow", why="the serve tests include a Parquet dataset")
    pq = need("pyarrow.parquet", why="the serve tests include a Parquet dataset")
    path = root / "table.parquet"
    table = pa.table(
        {
            "key": pa.array([f"row{i}" for i in range(6)], pa.string()),
            "label": pa.array([i % 2 for i in range(6)], pa.int64()),
            "text": pa.array([f"text {i}" for i in range(6)], pa.string()),
        }
    )
    pq.write_table(table, path, row_group_size=3, write_page_checksum=True)
    return path


def make_sample(root: Path, catalog: str | Path | None = None) -> Sample:
    """Shards under ``root`` ingested into ``catalog`` (default ``root/c.sqlite``):
    datasets ``train`` (TFRecord), ``photos`` (tar), ``faces`` (RecordIO) and
    ``table`` (Parquet)."""
    root.mkdir(parents=True, exist_ok=True)
    sample = Sample(Path(catalog) if catalog is not None else root / "c.sqlite")
    shards = {
        "train": _tfrecord(root, sample),
        "photos": _tar(root, sample),
        "faces": _recordio(root, sample),
        "table": _parquet(root),
    }
    with Catalog(catalog if catalog is not None else sample.catalog) as cat:
        for name, path in shards.items():
            options = {"format": "parquet", "key": "key"} if name == "table" else {}
            cat.ingest(path, name, workers=1, **options).close()
            sample.shards.append(path)
    return sample
