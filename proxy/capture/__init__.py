"""Capture backends: turn the program's poll entries and exits into engine events."""
