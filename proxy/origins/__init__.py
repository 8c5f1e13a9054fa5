"""Where each task came from and who wakes it: spawn records and wake statistics (pure).

``records`` decodes what the kernel gives (spawn records, the tasks' folded wake
statistics), ``log`` keeps the spawn records raw, ``resolve`` turns one into a
spawning line and backtraces only when a command shows it, ``view`` matches them
to the stop's tasks and says it in words. docs/wakes.md.
"""
