"""Typed parse/build for the packets asyncrsp understands, one module per
family. Each ``parse_*`` takes a packet body (as `rsp.reader.Packet.body`)
and returns a frozen dataclass or raises `rsp.errors.MalformedPacket`; each
object's ``build()`` returns the body again. `rsp.packets.raw.classify`
dispatches a client command by its prefix through one table; anything it
does not know becomes `Raw` (pass-through)."""
