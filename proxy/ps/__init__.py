"""`asyncrsp ps` and `asyncrsp tree`: the async state of a live process or a core, once.

* `snapshot` - `take(image, src)`: every task, its tree, what it waits on, and the
  wait-for cycles, read from a `ProgramImage` (the one place that gathers).
* `render`   - the table, the trees, the cycles, the JSON document (pure).
* `main`     - the command: stop the process only to copy it (proxy.corefile.live),
  or open the core; analyse before the stop, walk the copy after it.
"""
