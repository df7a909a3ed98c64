# Two entry points (see README): `make demo` and `make test`. Each creates
# .venv and installs shardcat with all its extras first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CORE_VENV ?= .venv-core
PEERS_VENV ?= .venv-peers
RAYTF_VENV ?= .venv-raytf
DEMO_DIR ?= demo-data

.PHONY: demo test lint docs bench bench-record clean

$(VENV)/.installed: pyproject.toml setup.py $(wildcard shardcat/*/*.c)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[torch,compressed,bench,dev,parquet,postgres,remote,ray,docs,web,duckdb]'
	touch $@

# Headless Chromium and its driver (Debian's) for the `catalog serve` browser tests
# (tests/test_serve.py), installed where missing.
.PHONY: chromium
chromium:
	command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
		{ apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver; }

# The core alone on the newest protobuf runtime (the main venv has protobuf 5,
# which tfd-utils pins): proves shardcat.pb2 works on both ends of the range.
# Its test run sets SHARDCAT_TEST_CORE_ONLY=1: no extra is required there
# (shardcat/testing/required.py), the C extensions still are.
$(CORE_VENV)/.installed: pyproject.toml setup.py $(wildcard shardcat/*/*.c)
	$(PYTHON) -m venv $(CORE_VENV)
	$(CORE_VENV)/bin/python -m pip install -q --upgrade pip
	$(CORE_VENV)/bin/python -m pip install -q -e . 'protobuf>=7' pytest hypothesis
	touch $@

# The loader benchmark's streaming peers (the peers extra: litData, Mosaic streaming,
# webdataset) in their own venv: Mosaic pins numpy and google-cloud-storage below the
# main venv's. torch==2.13.0 is named in the same install, so pip keeps the CPU build
# on local disk; the torchvision both peers pull (PyPI's, a CUDA build) cannot load
# beside it and is removed (benchmarks/loader_peers.py keeps Mosaic from importing it).
$(PEERS_VENV)/.installed: pyproject.toml setup.py $(wildcard shardcat/*/*.c)
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install -q --upgrade pip
	$(PEERS_VENV)/bin/python -m pip install -q torch==2.13.0 -e '.[torch,bench,peers]' pytest
	$(PEERS_VENV)/bin/python -m pip uninstall -q -y torchvision
	touch $@

.PHONY: peers-venv bench-peers
peers-venv: $(PEERS_VENV)/.installed

# The DataLoader benchmark with the peers (benchmarks/loader_bench.py; its data once)
bench-peers: $(PEERS_VENV)/.installed
	$(PEERS_VENV)/bin/python -m benchmarks.hotpath --prepare
	$(PEERS_VENV)/bin/python -m benchmarks.loader_bench --rounds 5

# Ray Data's own read_tfrecords beside shardcat.ray.read_dataset (benchmarks/ray_bench.py):
# it imports tensorflow, and tensorflow-cpu 2.21 needs protobuf 7, which the main venv
# cannot have (tfd-utils pins 5), so it gets a venv of its own. Not part of `make test`.
$(RAYTF_VENV)/.installed: pyproject.toml setup.py $(wildcard shardcat/*/*.c)
	$(PYTHON) -m venv $(RAYTF_VENV)
	$(RAYTF_VENV)/bin/python -m pip install -q --upgrade pip
	$(RAYTF_VENV)/bin/python -m pip install -q -e '.[ray]' tensorflow-cpu==2.21.0
	touch $@

.PHONY: bench-ray-tf
bench-ray-tf: $(RAYTF_VENV)/.installed
	$(RAYTF_VENV)/bin/python -m benchmarks.ray_bench --only read

demo: $(VENV)/.installed
	VENV=$(VENV) DEMO_DIR=$(DEMO_DIR) sh scripts/demo.sh

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check shardcat tests benchmarks scripts
	$(VENV)/bin/ruff format --check shardcat tests benchmarks scripts
	$(VENV)/bin/mypy

# The docs site (docs/, mkdocs.yml; the docs extra) into build/docs-site; any warning
# fails it. tests/test_docs.py runs its code blocks and checks docs/cli.md is current.
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

# Azurite (Azure Blob Storage's emulator, a Node program) for tests/test_remote_cloud.py,
# installed into .node/ (git-ignored), never globally.
.node/.installed:
	npm install --prefix .node azurite@3.37.0 --no-audit --no-fund
	touch $@

test: $(VENV)/.installed $(CORE_VENV)/.installed $(PEERS_VENV)/.installed .node/.installed chromium lint docs
	sh scripts/ensure-postgres.sh
	$(PY) -m pytest -q
	SHARDCAT_TEST_PEERS=1 $(PEERS_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/test_loader_peers.py
	SHARDCAT_TEST_CORE_ONLY=1 $(CORE_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/test_pb2.py tests/test_tfrecord.py tests/test_native_scan.py

# tensorblob's own test suite, which tests/test_tensorblob_suite.py runs against
# shardcat's TensorBlob and TensorDB: its sdist, downloaded once into .peer/ (git-ignored).
TENSORBLOB_SDIST := .peer/tensorblob-0.3.0.tar.gz

.PHONY: peer-tensorblob
peer-tensorblob: $(TENSORBLOB_SDIST)

$(TENSORBLOB_SDIST): | $(VENV)/.installed
	$(PY) -m pip download -q --no-deps --no-binary :all: tensorblob==0.3.0 -d .peer

test: peer-tensorblob

# tfd-utils' own test suite, which tests/test_tfd_suite.py runs against shardcat's
# readers: its sdist, downloaded once into .peer/, and what its test helpers import
# (Pillow, requests; the image they would download is generated locally instead).
TFD_SDIST := .peer/tfd_utils-1.3.0.tar.gz

.PHONY: peer-tfd
peer-tfd: $(TFD_SDIST) $(VENV)/.peer-tfd

$(TFD_SDIST): | $(VENV)/.installed
	$(PY) -m pip download -q --no-deps --no-binary :all: tfd-utils==1.3.0 -d .peer

$(VENV)/.peer-tfd: $(VENV)/.installed
	$(PY) -m pip install -q pillow==13.0.0 requests==2.34.2
	touch $@

test: peer-tfd

bench: $(VENV)/.installed
	$(PY) -m benchmarks

# The recorded run the READMEs' performance tables are rendered from
# (benchmarks/results/latest.json; tests/test_bench_record.py checks them).
bench-record: $(VENV)/.installed
	$(PY) -m benchmarks --record

clean:
	rm -rf $(VENV) $(CORE_VENV) $(PEERS_VENV) $(RAYTF_VENV) .node $(DEMO_DIR) build/docs-site .pytest_cache .mypy_cache .ruff_cache
