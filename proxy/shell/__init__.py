"""The trio shell: sockets, the spawned stub, the pumps, shutdown."""
