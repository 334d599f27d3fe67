"""The JSON schema of the findings document (docs/findings-schema.md)."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any


@cache
def findings_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) that every findings document satisfies."""
    text = resources.files("trainmedic.findings").joinpath("findings.schema.json").read_text()
    schema: dict[str, Any] = json.loads(text)
    return schema
