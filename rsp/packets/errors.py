"""Alias of `rsp.packets.replies` (``OK``, empty and ``Exx`` replies), for
callers that look for error replies under this name."""

from rsp.packets.replies import (
    EMPTY,
    OK,
    ErrorReply,
    is_empty,
    is_error_reply,
    is_ok,
    parse_error_reply,
    raise_for_error,
)

__all__ = [
    "EMPTY",
    "OK",
    "ErrorReply",
    "is_empty",
    "is_error_reply",
    "is_ok",
    "parse_error_reply",
    "raise_for_error",
]
