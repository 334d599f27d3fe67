"""A module that fails on import, as user code sometimes does."""

import math

VALUE = math.sqrt(-1)
