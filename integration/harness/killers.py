"""Packets that kill gdbserver 13.1: each was sent alone to a fresh gdbserver (tokio_app,
stopped at its first instruction) and the gdbserver exited, killing the program ("Invalid
hex digit 122", "invalid remote ptid", the vCont;t assertion). The proxy's shield refuses
every one (tests/proxy/session/test_shield.py; integration/test_shield.py live)."""

KILLERS = [
    b"Gzz", b"m1,zz", b"mzz", b"M0,1:zz", b"Hcp-1.-1", b"qXfer:features:read:target.xml:zz",
    b"qXfer:auxv:read::0", b"qRcmd,zz", b"Czz", b"qSearch:memory:zz", b"QPassSignals:zz",
    b"QProgramSignals:zzz;", b"QCatchSyscalls:1;zz", b"QEnvironmentHexEncoded:zz", b"QSetWorkingDir:zz",
    b"qXfer:threads:read::zz", b"vCont;t", b"vCont;t:p1.1", b"QTDV:zz",
    # over a breakpoint of gdbserver's: "check_mem_read: Assertion ... failed" (the fuzz client, seed 1)
    b"m7ffff734d2ad,10000",
    # "invalid remote ptid: p11" (the fuzz client, seed 3)
    b"Tp11",
]
