"""Pictures of the stop: the program's async state drawn rather than printed.

* ``stacks``   - parallel stacks: every live task's logical stack merged into one
  graph (shared frames once, with the number of tasks through them), each leaf
  with what it waits on, the deadlock cycles in red: snapshot -> DOT text (pure).
* ``waitgraph``- the wait-for graph (tasks, the resources they hold and wait on):
  snapshot -> DOT text (pure).
* ``timeline`` - the recorded polls (proxy.graph.polls) as Chrome Trace Event
  JSON, which Perfetto's UI and chrome://tracing open (pure).
* ``report``   - one self-contained HTML page: the tasks, the parallel stacks,
  each task's tree, the wait-for graph and the timeline; nothing fetched (pure).
* ``graphviz`` - the thin renderer: DOT -> SVG or PNG with Graphviz's ``dot``,
  found at run time.
* ``files``    - what the commands write (``monitor async report|timeline|stacks``,
  ``asyncrsp tree --html``): the pure parts put together, then one file.
"""
