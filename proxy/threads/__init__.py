"""Tasks as threads: every RSP client's threads pane lists the program's async tasks.

With ``--task-threads`` (or ``monitor async threads on``) each live task that
is not running on a real thread at a stop becomes an extra thread: listed in
``qfThreadInfo``/``qXfer:threads`` with its name and what it waits on, with
registers and a synthetic stack that gdb's and lldb's own unwinders walk one
coroutine per frame, ``self`` where each frame's DWARF looks for it, so
``bt``, ``frame N``, ``info locals`` and ``print`` work as in a real frame.
OpenOCD's RTOS layer is the precedent (DESIGN.md §3 rule 13).

* ``model``: TaskThread/TaskFrame, the id space and the synthetic region;
* ``ids``: stable ids per task;
* ``adapter``: the stop's snapshot (proxy.snapshot) -> task threads;
* ``listing``: how many of the runtime's tasks a stop reads (the cap; the rest counted);
* ``shapes``: CFI rows and DWARF ``self`` locations of resume functions;
* ``stack``: laying out the synthetic stack (pure);
* ``view``: the answers to the client's thread packets (pure);
* ``hooks``: the session's small side (when to read the tasks, what never reaches the stub).
"""
