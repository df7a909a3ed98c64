"""Build of shardcat's optional C extensions (the project's metadata is in pyproject.toml).

Each extension is optional: where it does not build, the pure-Python paths are used.
"""

from setuptools import Extension, setup

EXTENSIONS = [
    Extension(
        "shardcat.readers._inflate",
        ["shardcat/readers/_inflate.c"],
        libraries=["z"],
        optional=True,
    ),
]

setup(ext_modules=EXTENSIONS)
