# Metadata lives in pyproject.toml; this file only hooks the cffi kernel build in (API mode).
from setuptools import setup

setup(cffi_modules=["alpha_mpi/kernel/build.py:ffi"])
