"""This host's side of a program the proxy debugs: is the stub's process one of this
host's (``identity``), which registers a local gdbserver may send safely
(``regsafety``), its memory and signals through /proc (``procmem``: code bytes, a
pending SIGINT; ``localmem``: data pages at a stop)."""
