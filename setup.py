"""Build configuration beyond setup.cfg: the optional C extension.

``cynomys._speedups`` is the producer's compiled hot path (row decoding and
Avro writing).  It is optional: where it cannot be compiled (no C compiler or
Python headers), the install still succeeds and Cynomys runs the pure-Python
path, saying so in its log and in ``cynomys status``.

``cynomys._reader`` reads the binlog (the protocol's packets from the
socket, or binlog files) and makes the SourceEvents in C (parser/creader.py);
optional in the same way: without it the library's reader runs.
"""
from __future__ import annotations

from setuptools import Extension, setup

_FLAGS = ["-O2", "-std=c99", "-Wall", "-Wno-missing-field-initializers"]

setup(ext_modules=[
    Extension("cynomys._speedups", ["cynomys/_speedups.c"], optional=True, extra_compile_args=_FLAGS),
    # _GNU_SOURCE: poll, recv flags and pread under -std=c99.
    Extension("cynomys._reader", ["cynomys/_reader.c"], optional=True,
              extra_compile_args=[*_FLAGS, "-D_GNU_SOURCE"]),
])
