"""Build configuration beyond setup.cfg: the optional C extension.

``cynomys._speedups`` is the producer's compiled hot path (row decoding and
Avro writing).  It is optional: where it cannot be compiled (no C compiler or
Python headers), the install still succeeds and Cynomys runs the pure-Python
path, saying so in its log and in ``cynomys status``.
"""
from __future__ import annotations

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("cynomys._speedups", ["cynomys/_speedups.c"], optional=True,
              extra_compile_args=["-O2", "-std=c99", "-Wall", "-Wno-missing-field-initializers"]),
])
