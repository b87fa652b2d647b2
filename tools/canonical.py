"""Values as the step journal keeps them.

A step's arguments and results go through PostgreSQL's jsonb and text
columns, which refuse some values Python accepts (a NUL character, a lone
surrogate, NaN, Infinity) and give some numbers back in another form
(``1e16`` as ``10000000000000000``, ``-0.0`` as ``0.0``). An attempt that
resumes from the journal must continue exactly the conversation the first
attempt had, and a call must keep its idempotency key (G12). So what a model
or a tool produced is made storable as it arrives — before it is planned,
keyed, executed, recorded or shown to the model — and the live attempt goes
on with the same value the journal will return.
"""

import math
import re
from decimal import Decimal

#: The longest tool name a step records (``RunStep.tool_name``): a longer
#: name, which no registered tool has, is cut to it where it arrives.
NAME_LIMIT = 100

#: Characters PostgreSQL's text and jsonb refuse: NUL, and code points that
#: are half of a UTF-16 surrogate pair (a Python str holds them only alone).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
REPLACEMENT = "\ufffd"


def storable_text(text: str) -> str:
    """``text`` with every character the database refuses replaced by U+FFFD."""
    return _UNSTORABLE.sub(REPLACEMENT, text) if _UNSTORABLE.search(text) else text


def token_count(value) -> int:
    """A provider's token count as the run's totals may add it: a whole
    number from 0 to 10**8, 0 for anything else (the totals are database
    integers: a negative or absurd count must not make a record fail)."""
    if isinstance(value, bool):
        return 0
    try:
        count = int(value)
    except (TypeError, ValueError, OverflowError):
        return 0
    return min(max(count, 0), 10**8)


def as_journaled(value):
    """``value`` (JSON-like) as the journal will give it back.

    Strings lose what the database refuses; NaN and the infinities, which
    JSON has no number for, become the strings ``"NaN"``, ``"Infinity"`` and
    ``"-Infinity"``; a float written with a positive exponent is the integer
    jsonb returns for it, and ``-0.0`` is ``0.0``. Anything else JSON holds
    is returned unchanged; what JSON cannot hold is left for ``json.dumps``
    to refuse.
    """
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, float):
        return _journaled_float(value)
    if isinstance(value, dict):
        return {storable_text(str(key)): as_journaled(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [as_journaled(item) for item in value]
    return value


def _journaled_float(number: float):
    if math.isnan(number):
        return "NaN"
    if math.isinf(number):
        return "Infinity" if number > 0 else "-Infinity"
    if number == 0:
        return 0.0
    written = repr(number)
    if "e+" in written:
        # jsonb keeps the exact decimal and prints it without an exponent,
        # which JSON reads back as an integer.
        return int(Decimal(written))
    return number


#: The deepest JSON a value a person or another system sends (an edit's
#: arguments, an answer, a completion) may be: the checks and the journal
#: walk it recursively, and a value thousands of levels deep, which the
#: parser reads, would overflow Python's stack there (a 500).
MAX_JSON_DEPTH = 64


def nested_deeper_than(value, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``value`` (parsed JSON) has objects or arrays more than
    ``limit`` levels deep; walked without recursion."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False
