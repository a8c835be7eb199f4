"""NaN and Infinity in a trace. JSON has no such values, but writers that print floats as they
are put them in all the same: Python's `json.dump` (allow_nan is on by default) writes `NaN`,
`Infinity` and `-Infinity`. msgspec, being strict JSON, stops at the first one.

They are read as missing values rather than refused: the rest of the trace is good, and one NaN
in a field nobody reads should not cost the user the profile. Each one becomes a string (`NaN`
becomes `"NaN"`), which the lenient reader (decode.py) then treats like any other value of the
wrong type: a timestamp or duration that is not a number makes its event damaged (skipped, and
counted in the warning), anything else reads as absent. The importer says how many there were
and where the first was, so nothing is dropped silently.

The standard library's JSON parser does the rewriting: it knows these three spellings, and
being a real parser it never touches the same letters inside a string (a kernel named
"check_NaN" or an argument "[inf, 1]"), which a textual search and replace would break. It is
slower than msgspec and builds the whole document as Python objects, so it runs only where
msgspec stopped at such a token, on one slice of a large trace at a time where it can (decode.py).
Other spellings (C's `nan`, `inf`) are not JSON of any dialect Python reads; those are refused
with a message that says what and where.
"""

from __future__ import annotations

import json
import re

import msgspec

_TOKEN = re.compile(rb"-?(?:NaN|Infinity|nan|inf(?:inity)?|Inf(?:inity)?)")
_BYTE = re.compile(r"\(byte (\d+)\)")


def nonfinite_at(data: bytes | bytearray, error: Exception) -> tuple[int, str] | None:
    """(byte, token) when `error`, msgspec's decode error of `data`, is at a NaN or Infinity."""
    m = _BYTE.search(str(error))
    if m is None:
        return None
    at = int(m.group(1))
    # msgspec names the byte where it gave up, which may be a few bytes into the token.
    t = _TOKEN.search(data, max(0, at - 9), at + 9)
    return (t.start(), t.group().decode()) if t is not None else None


def quote_nonfinite(data: bytes | bytearray) -> tuple[bytes, int] | None:
    """(the JSON with each NaN, Infinity and -Infinity as a string, how many there were), or
    None when it does not parse even with them (other damage, or spellings JSON never had)."""
    count = 0

    def constant(token: str) -> str:
        nonlocal count
        count += 1
        return token

    try:
        doc = json.loads(data, parse_constant=constant)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    return msgspec.json.encode(doc), count


def nonfinite_error(path: str, at: int, token: str) -> str:
    """What to tell the user when a trace holding `token` at byte `at` cannot be read around it."""
    return (f"{path}: holds {token} at byte {at:,} of its JSON; JSON has no NaN or Infinity, and dlpt reads "
            "them as missing values only when spelled NaN, Infinity or -Infinity in an otherwise valid "
            "trace: re-export the trace, or replace them with null")
