"""Typed parse/build for the packets asyncrsp understands, one module per
family. Each ``parse_*`` takes a packet body (as `rsp.reader.Packet.body`)
and returns a frozen dataclass or raises `rsp.errors.MalformedPacket`; each
object's ``build()`` returns the body again. `rsp.packets.requests`
names a client command's kind by its prefix through one table (`kind_of`)
and gives its typed form (`classify`); anything it does not know becomes
`Raw` (pass-through)."""
