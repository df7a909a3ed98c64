"""Tensor storage with SQLite metadata (TensorBlob, TensorDB): not built yet.

Planned in the project's TensorBlob/TensorDB issue; nothing here is public API.
"""
