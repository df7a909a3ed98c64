"""Build of shardcat's optional C extensions (the project's metadata is in pyproject.toml).

Each extension is optional: where it does not build, the pure-Python paths are used
(the tests check that CI builds both).
"""

from setuptools import Extension, setup

EXTENSIONS = [
    Extension(
        "shardcat.sources._inflate",
        ["shardcat/sources/_inflate.c"],
        libraries=["z"],
        optional=True,
    ),
    Extension(
        "shardcat.formats._scan",
        ["shardcat/formats/_scan.c"],
        depends=["shardcat/formats/wire.h"],
        optional=True,
        extra_compile_args=["-O3"],
    ),
    Extension(
        "shardcat.readers._hot",
        ["shardcat/readers/_hot.c"],
        depends=[
            "shardcat/formats/wire.h",
            "shardcat/readers/example_wire.h",
            "shardcat/readers/hot_batch.h",
        ],
        include_dirs=["shardcat/formats"],
        libraries=["sqlite3"],
        optional=True,
        extra_compile_args=["-O3"],
    ),
]

setup(ext_modules=EXTENSIONS)
