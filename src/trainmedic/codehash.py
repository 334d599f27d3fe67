"""Which source a class comes from: a hash of the file that defines it.

``tune dataloader`` records it for the dataset it measured; ``run --apply-from``
applies the tuned settings only to loaders over a dataset of the same name *and*
the same code - a class of that name in another file (another project's
``data.Images``, another script's ``__main__.MyDataset``) is another dataset.
The hash, not the path, so that the same code checked out elsewhere matches.
Standard library only: the probe imports it inside the training process.
"""

from __future__ import annotations

import hashlib
import sys
from typing import Any

MAX_BYTES = 16 << 20
_cache: dict[str, str | None] = {}


def code_of(obj: Any) -> str | None:
    """sha256 (hex) of the file defining ``type(obj)``'s module; ``None`` when there is
    no such file (a built-in, an interactive session) or it cannot be read."""
    module = sys.modules.get(type(obj).__module__)
    path = getattr(module, "__file__", None)
    if not isinstance(path, str):
        return None
    if path not in _cache:
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_BYTES + 1)
            _cache[path] = None if len(data) > MAX_BYTES else hashlib.sha256(data).hexdigest()
        except OSError:
            _cache[path] = None
    return _cache[path]
