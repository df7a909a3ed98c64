"""The compiled parts of shardcat (optional: without a compiler the pure-Python
scanners are used). Everything else is declared in pyproject.toml."""

from setuptools import Extension, setup

EXTENSIONS = [
    Extension(
        "shardcat.readers._scan",
        ["shardcat/readers/_scan.c"],
        optional=True,
        extra_compile_args=["-O3"],
    ),
]

setup(ext_modules=EXTENSIONS)
