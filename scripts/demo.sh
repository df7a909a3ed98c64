#!/bin/sh
# The main job on a generated sample: shards -> catalog -> query -> read.
set -eu
VENV=${VENV:-.venv}
DIR=${DEMO_DIR:-demo-data}
CATALOG="$DIR/catalog.sqlite"
cat_() { "$VENV/bin/catalog" "$@"; }

rm -rf "$DIR"
echo "== generate 4 TFRecord shards, 2,000 records"
cat_ sample "$DIR/train" --shards 4 --records 2000
echo "== ingest them into $CATALOG"
cat_ ingest "$DIR/train/*.tfrecord" --dataset train --catalog "$CATALOG" --workers 2
echo "== ingest again: nothing changed, nothing re-read"
cat_ ingest "$DIR/train/*.tfrecord" --dataset train --catalog "$CATALOG"
echo "== datasets"
cat_ datasets --catalog "$CATALOG"
echo "== SQL over the records"
cat_ query "SELECT label, count(*) AS n FROM train GROUP BY label ORDER BY label" --catalog "$CATALOG"
cat_ query "SELECT key, score, caption FROM train WHERE label = 3 AND score > 0.9 LIMIT 5" --catalog "$CATALOG"
echo "== features of the first record"
cat_ list train --catalog "$CATALOG"
echo "== one feature's bytes"
cat_ get train rec_000000042 image --catalog "$CATALOG" > "$DIR/rec_000000042.jpg"
ls -l "$DIR/rec_000000042.jpg"
echo "== verify every CRC"
cat_ verify train --catalog "$CATALOG"
echo "== the Python API"
"$VENV/bin/python" - "$DIR" <<'PY'
import sys
from shardcat import Catalog, TFRecordRandomAccess

directory = sys.argv[1]
with Catalog(f"{directory}/catalog.sqlite") as cat:
    print(cat.query("SELECT count(*) FROM train WHERE label < 5"))
    with cat.dataset("train") as reader:
        print(len(reader), "records; first:", reader.key_at(0))
        print("caption of rec_000000042:", reader.get_feature("rec_000000042", "caption"))
        print("label = 3 AND score > 0.5:", len(reader.where("label = 3 AND score > 0.5")), "keys")
        print("get_many:", [r.features.feature["label"].int64_list.value[0]
                            for r in reader.get_many(["rec_000000001", "rec_000001999"])])
# tfd-utils style: the same glob finds the dataset `catalog ingest` made, no re-indexing
with TFRecordRandomAccess(f"{directory}/train/*.tfrecord",
                          index_file=f"{directory}/catalog.sqlite") as reader:
    print("TFRecordRandomAccess:", reader.dataset, reader.get_stats()["total_records"], "records")
PY
echo "demo OK"
