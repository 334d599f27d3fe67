"""What tests share: builders of run records and samples (:mod:`support.builders`)
and of doctor's machine facts (:mod:`support.facts`), healthy by default, so a
test names only the numbers it is about.

Imported as ``support`` (``from support.builders import make_record``):
``tests/`` is on ``sys.path`` because pytest inserts the directory of the
root ``conftest.py`` (``rootdir``-relative, the default ``prepend`` import mode).
"""
