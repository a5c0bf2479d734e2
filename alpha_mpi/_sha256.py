"""sha256 for the identities a program's first reduction computes, without loading OpenSSL.

`import hashlib` loads OpenSSL's libcrypto (`_hashlib`): 3.3 ms of the ~25 ms a program's first
`allreduce` took on the development machine, against a 20 ms goal (docs/performance.md). The
tree, plan, frame and verdict identities hash short strings; CPython's own SHA-256 (the module
hashlib itself falls back to: `_sha2` from 3.12, `_sha256` before) gives the same digests and
imports in under 1 ms. It is slower on long inputs (no SHA instructions: ~5x on a megabyte), so
what hashes bulk data (checkpoints, model digests) keeps hashlib.
"""

from __future__ import annotations

try:
    from _sha2 import sha256  # CPython 3.12+
except ImportError:  # pragma: no cover - the interpreter decides
    try:
        from _sha256 import sha256  # CPython 3.11
    except ImportError:  # another Python, or a CPython built without it
        from hashlib import sha256

__all__ = ["sha256"]
