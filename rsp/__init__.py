"""The GDB Remote Serial Protocol, sans-IO.

Nothing in this package performs I/O: feed bytes in, get typed events out;
build events, get bytes to send. No trio, no sockets, no threads.

* `rsp.framing`    checksum, ``}`` escaping, run-length expansion, hex, frame()
* `rsp.reader`     PacketReader.feed(bytes) -> Ack/Nack/Interrupt/Packet/
                   Notification/BadPacket (any split of the stream gives the
                   same events)
* `rsp.connection` Connection: acks, NAKs, retransmission, no-ack mode;
                   receive_data() / send_packet() / send_raw() / data_to_send()
* `rsp.threads`    ThreadId (``p<pid>.<tid>``, -1 all, 0 any)
* `rsp.packets`    typed parse/build per packet family (stop, resume,
                   breakpoints, qsupported, qxfer, monitor, memory, registers,
                   thread, replies) and requests.kind_of()/classify() through one table
* `rsp.regs`       RegisterLayout from target.xml; the amd64 no-XML layout of
                   gdbserver 13.1 and a target description for it
* `rsp.agent`      agent-expression bytecode (conditions, tracepoint actions)
* `rsp.errors`     ProtocolError > RemoteProtocolError / LocalProtocolError;
                   StubError for ``Exx`` replies
"""
