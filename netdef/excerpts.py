"""Quoting text that came from a file in a message: short, and safe to print on a terminal.

A message that quotes a file (a prototxt's offending line, a layer name, a field's value) must stay
one readable line whatever the file holds: a one-line 20 MB prototxt must not print 20 MB, and bytes
such as ESC (terminal escape sequences), carriage returns or NULs must not reach the terminal raw,
where they could repaint or hide the rest of the screen. ``excerpt`` bounds and escapes one quoted
piece; ``safe_line`` is the last guard on a whole message before it is printed.
"""
from __future__ import annotations

#: Characters kept of one quoted piece of a file, about a terminal line's worth.
EXCERPT_CHARACTERS = 80
#: Characters kept of a whole printed message: room for several quoted names and paths.
MESSAGE_CHARACTERS = 2000


def escape_controls(text: str) -> str:
    """``text`` with every control character but the tab (C0, DEL, C1, and Unicode's line and
    paragraph separators) written as a visible escape (``\\x1b``, ``\\n``); everything else unchanged.
    A tab stays: it only moves the cursor, and Caffe's timing log aligns its columns with it."""
    if text.isprintable():
        return text
    # repr escapes exactly the characters that are not printable.
    return "".join(char if char.isprintable() or char == "\t" else repr(char)[1:-1] for char in text)


def shorten(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters: its head and tail kept, the middle replaced by a
    count of what was left out, so that a reader still sees where the text started and ended."""
    if len(text) <= limit:
        return text
    keep = max(limit - 30, 2)
    head, tail = text[: keep * 2 // 3], text[len(text) - keep // 3:]
    return f"{head}...({len(text) - len(head) - len(tail)} characters left out)...{tail}"


def excerpt(text: str, limit: int = EXCERPT_CHARACTERS) -> str:
    """One piece of a file for a message: at most about ``limit`` characters, controls escaped.
    Shortened before escaping, so that the cost stays small for a huge piece."""
    return escape_controls(shorten(text, limit))


def safe_line(message: str, limit: int = MESSAGE_CHARACTERS) -> str:
    """``message`` as one printable line of at most about ``limit`` characters: runs of whitespace
    become one space (a newline inside a quoted name must not start a line of its own) and every
    other control character is escaped."""
    return excerpt(" ".join(message.split()), limit)
