"""The GDB Remote Serial Protocol, sans-IO.

Nothing in this package performs I/O: feed bytes in, get typed events out;
build events, get bytes to send. No trio, no sockets, no threads.
"""
