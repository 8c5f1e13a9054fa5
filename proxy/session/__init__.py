"""The session core: a pure state machine of one client <-> stub session."""
