"""Combinators and leaf futures the walker knows by type name (a few lines each).

A describer is ``fn(reflector, addr, type_name, depth, seen) -> Node | None``
registered under a type-name prefix in ``DESCRIBERS`` (first match wins;
None falls through to the generic walk). Field offsets always come from the
DWARF ``TypeInfo`` of the binary at hand, never from constants: a describer
that does not find the fields it needs returns None (the type is then shown
by name) rather than guessing.

Shapes checked on the corpus (tokio 1.24, rustc 1.95 and 1.63):

* ``join!`` awaits ``PollFn<closure>`` whose env holds ``futures: &mut (MaybeDone<A>,
  MaybeDone<B>, ..)``; ``MaybeDone`` is an enum ``Future(F) | Done(T) | Gone``.
* ``select!`` awaits ``PollFn<closure>`` whose env holds ``disabled: &mut u8``
  (bit i: branch i finished or failed its pattern) and ``futures: &mut &mut (A, B, ..)``
  (rustc 1.95 names captured references ``_ref__disabled`` / ``_ref__futures``).
* ``Sleep { entry, inner: Inner { deadline: Instant } }``; tokio's ``Instant`` wraps
  std's, which wraps a ``Timespec { tv_sec, tv_nsec }`` of CLOCK_MONOTONIC.
* ``JoinHandle { raw: RawTask { ptr: NonNull<Header> } }``; ``Header.vtable`` points
  at a ``Vtable`` whose ``poll`` is ``tokio::runtime::task::raw::poll<T, S>`` (T: the
  spawned future) and whose ``id_offset`` locates the task id in the cell.
* ``Acquire { semaphore: &Semaphore }`` (a ``Mutex``'s semaphore is its first field),
  ``Notified { notify: &Notify }``, ``oneshot::Receiver { inner: Option<Arc<Inner>> }``,
  ``mpsc::Receiver { chan: Rx { inner: Arc<Chan> } }``.

The describers, by what they describe: combinators.py (futures of futures), objects.py
(channels, locks and other objects waited on), streams.py, timers.py, tasks.py (JoinHandle,
BlockingTask) and io.py (I/O handles and the driver's entries); fields.py has what they all
use to find fields in the binary's types. ``DESCRIBERS``, here, is the table in order.
"""

from __future__ import annotations

from .combinators import (
    any_poll_fn, _branches, futures_unordered, join_all, joined, maybe_done, order_wrapper, pending, poll_fn,
    select, timeout, wrapper, yield_now,
)
from .fields import Describer
from .io import io_borrow, io_leaf, readiness
from .objects import broadcast_recv, _by_ref, objects, oneshot_receiver, _pointer_field
from .streams import stream_field, stream_map, stream_next
from .tasks import blocking_task, join_handle
from .timers import async_io_timer, sleep

DESCRIBERS: list[tuple[str, Describer]] = [
    ("tokio::future::poll_fn::PollFn<", poll_fn),
    ("core::future::poll_fn::PollFn<", poll_fn),
    ("futures_util::future::poll_fn::PollFn<", poll_fn),
    ("tokio::future::maybe_done::MaybeDone<", maybe_done),
    ("futures_util::future::maybe_done::MaybeDone<", maybe_done),
    ("futures_util::future::try_maybe_done::TryMaybeDone<", maybe_done),
    ("tokio::time::timeout::Timeout<", timeout),
    ("tokio::time::sleep::Sleep", sleep),
    ("tokio::runtime::task::join::JoinHandle<", join_handle),
    ("tokio::sync::batch_semaphore::Acquire", _pointer_field("tokio::sync::Semaphore::acquire", "semaphore",
                                                              "semaphore")),
    ("tokio::sync::notify::Notified", _pointer_field("tokio::sync::Notify::notified", "notify", "Notify")),
    ("tokio::sync::oneshot::Receiver<", oneshot_receiver),
    ("core::future::pending::Pending<", pending),
    ("futures_util::future::pending::Pending<", pending),
    ("futures_util::future::join_all::JoinAll<", join_all),
    ("futures_util::future::select::Select<", select),
    ("futures_util::stream::futures_unordered::FuturesUnordered<", futures_unordered),
    ("futures_util::stream::futures_ordered::OrderWrapper<", order_wrapper),
    ("futures_util::stream::stream::next::Next<", stream_next),
    ("futures_util::stream::stream::collect::Collect<", stream_next),
    ("tokio::task::yield_now::", yield_now),  # the YieldNow struct local to yield_now's body
    ("tokio::runtime::io::scheduled_io::Readiness", readiness),
    ("tokio_stream::stream_ext::next::Next<", stream_next),
    ("async_std::stream::stream::next::NextFuture<", stream_next),
    ("tokio_stream::stream_map::StreamMap<", stream_map),
    ("tokio::sync::broadcast::Recv<", broadcast_recv),
    ("tokio::runtime::blocking::task::BlockingTask<", blocking_task),
    ("async_io::Timer", async_io_timer),
    ("async_std::io::timeout::Timeout<", _branches("async_std::io::timeout", ("future", "value"), ("timeout", "deadline"))),
    ("async_std::future::timeout::TimeoutFuture<",
     _branches("async_std::future::timeout", ("future", "value"), ("delay", "deadline"))),
    ("futures_lite::future::Or<", _branches("futures_lite::future::or", ("future1", "first"), ("future2", "second"))),
    ("async_channel::Recv<", _by_ref("receiver", "async_channel::Receiver::recv", "channel")),
    ("async_channel::Send<", _by_ref("sender", "async_channel::Sender::send", "channel")),
    ("async_lock::mutex::Lock<", _by_ref("mutex", "async_lock::Mutex::lock", "Mutex", link=True)),
    ("async_lock::rwlock::futures::Read<", _by_ref("lock", "async_lock::RwLock::read", "RwLock")),
    ("async_lock::rwlock::futures::Write<", _by_ref("lock", "async_lock::RwLock::write", "RwLock")),
    ("", any_poll_fn),  # another crate's PollFn<closure> (h2's)
    ("", joined),  # a struct of MaybeDone slots (futures' Join, Join3.., TryJoin..)
    ("", io_borrow),  # a leaf future borrowing an I/O handle (tokio's io::util futures)
    ("", objects),  # channel ends met as leaves (not futures: not in _is_futurish)
    ("", stream_field),  # a future or stream polling the stream in its `stream` field
    ("", io_leaf),  # a leaf polling an I/O handle it holds: the driver entry's wakers
    ("", wrapper),  # last: any one-field wrapper future
]
