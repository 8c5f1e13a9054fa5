"""proxy/host/localmem.py against a real process: this test's own (the proxy reads
the stopped program's data pages this way; the kernel's rules are the same)."""

from __future__ import annotations

import ctypes
import os

from proxy.host.localmem import open_local, spans_of


def test_reads_data_refuses_code_and_knows_unmapped_addresses() -> None:
    buf = ctypes.create_string_buffer(b"asyncrsp reads this" + bytes(64))
    local = open_local(os.getpid())
    assert local is not None
    try:
        addr = ctypes.addressof(buf)
        assert local.read(addr, 19) == b"asyncrsp reads this"
        # code: an executable mapping (gdbserver's inserted int3s show there): the stub reads it
        code = ctypes.cast(ctypes.CDLL(None).getpid, ctypes.c_void_p).value
        assert code is not None and local.read(code, 8) is None and not local.unmapped(code)
        # below every mapping: nobody can read it, the stub is not asked
        assert local.read(0x1000, 8) is None and local.unmapped(0x1000)
        assert local.bytes_read == 19 and local.refused == 2
    finally:
        local.close()


def test_a_read_across_the_end_of_a_data_mapping_is_left_to_the_stub() -> None:
    data, mapped = spans_of(os.getpid())
    local = open_local(os.getpid())
    assert local is not None and data and mapped
    try:
        lo, hi = data[0]
        assert local.read(hi - 8, 8) is not None
        assert local.read(hi - 8, 16) is None  # partly past it: gdbserver's answer, not guessed here
    finally:
        local.close()


def test_a_process_that_is_gone_gives_no_reader() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    assert open_local(pid) is None
