// SPDX-License-Identifier: GPL-2.0
/* asyncrsp's uprobe capture: one program on every resume-function entry, every
 * `ret` of it and every unwind exit (`call _Unwind_Resume`), attached with one
 * uprobe_multi link per binary, filtered by pid, the cookie = the site's index
 * in `sites`.
 *
 * Each hit writes one record into the ring buffer `events` (no wakeup: the
 * proxy drains it on a timer) and counts itself in the per-CPU `counters`
 * (hits, records, drops, ...): hits = records - flushed + drops + skipped, always
 * (flushed: entries written late, CFG_CHANGES, counted skipped at their hit,
 * then records or drops).
 *
 *   entry  -> kind, cookie, tid, ns, ip, the entry's sp (sp + the site's
 *             sp_adjust: the probe may stand on the first instruction the
 *             kernel emulates, after the prologue), self (register named by the site),
 *             return address, __state through self, rbp rbx r12-r15, and the
 *             first `stack_max` bytes of the stack from the real sp while `credits` last (read a
 *             page at a time: stack_len says how many were readable).
 *   exit   -> kind, cookie, tid, ns, ip, sp, rax (the Poll result), and self and
 *             __state when the entry's scope (its entry sp) is still on the
 *             thread's scope stack: a `ret` leaves with the entry's sp; an
 *             unwind exit computes it from the site's CFA rule (reg + off - 8),
 *             given by the proxy.
 *
 * Poll scopes: each thread keeps the polls in progress on it as a stack in its
 * task-local storage (`tstate`, one lookup a hit through the task itself: no
 * hash of (tid, sp) written at every entry and deleted at every exit, ~280 ns a
 * hit). Entries' sps decrease up the stack (a nested poll runs deeper), so an
 * entry first pops the scopes at or below its own sp (polls whose exits were
 * missed: their frames are gone), and an exit finds its scope by its entry sp,
 * popping it and any left above it.
 *
 * Every hit also counts in `site_hits[cookie]` (per CPU), and an entry with a
 * poll in progress on its thread in `site_nested[cookie]` too: the proxy tells
 * the resume functions polled only inside other polls (full mode takes their
 * probes out while it is behind, capture.py `_nested_step`). A count site
 * (KIND_COUNT: the user's `--probe` functions) only counts there and writes
 * no record. When every site is one (a C program: no resume functions), the
 * proxy loads `asyncrsp_count` below instead, alone: the kernel's verifier
 * takes ~0.55 s over `asyncrsp_poll` and ~1 ms over it, paid by every session.
 *
 * Folding in the kernel: every poll (entry to exit, matched by its scope)
 * adds to its coroutine instance's totals in `instances`, keyed (self,
 * resume function): polls (at the entry: one whose exit is not seen counts
 * too), raw ns (exit ts - entry ts), and the hits on
 * its thread from its entry to its exit (1 + those inside: what the proxy's
 * timing subtracts the per-event cost for). With `sample_every` N > 1 only one
 * root poll (no enclosing scope on the thread) in N of each instance, at
 * random, is recorded, with every poll nested in it; the first poll of a new instance
 * (not in `instances`, or entered Unresumed) always is. The other polls write
 * no record: their counts and times are exact in `instances`, which the proxy
 * reads at each stop. When an instance's address starts a new life (entered
 * Unresumed after polls), its totals so far go out first as a KIND_STATS
 * record: self, fn (cookie field), polls (ret), raw ns (rax), hits (state),
 * recorded polls (ip).
 *
 * Recording what changes the graph (CFG_CHANGES, full mode): every poll is
 * folded into its instance's totals, and a poll writes records only when it
 * changes what the graph knows: an instance not in `instances` (or a new life
 * at its address), an entry state other than the one its last poll left, an
 * enclosing poll (the instance and function on the scope stack below it) or a
 * thread other than its last poll's, an exit state other than its entry's (a
 * completion too), an uncovered poll. Such a poll's entry names the poll it
 * runs inside (F_PARENT: its instance's self, entry sp and function), whose own entry
 * may have gone out as no record; an entry left pending goes out late, from
 * its scope, when its exit changes the state. A repeat poll (a known instance
 * polled again in the same state, from the same parent, on the same thread,
 * leaving the same state) writes nothing: its count, raw time and hits are in
 * `instances`, which the proxy reads at stops. A completion's exit record
 * carries its instance's totals (F_TOTALS: polls in ret, raw ns in rax, hits
 * in ip, its function's index + 1 in stack_len) and the instance leaves the map. The proxy reads the entries still
 * pending at a stop out of each thread's task storage (and marks them
 * recorded, so their exits go out).
 *
 * Return sites (KIND_RETSITE): a resume function polled through a vtable has no
 * direct caller whose next instruction could hold its exit probe; its polls'
 * return addresses are learned at run time instead. Its entry sites say so
 * (cfa_reg REG_LEARN: its exits are still its `ret`s, each entry's return
 * address goes into `rets_seen`; REG_RETSITES: its exits are at the probed
 * return sites in `retsites`, an entry whose return address is not one of them
 * counts C_UNCOVERED, its poll counted at once, no scope: its exit is not
 * seen). A return-site probe stands on the first emulated instruction after
 * the return address (ret_back bytes before it) and fires after every return
 * there, of any callee: it is an exit only when the thread has a poll in
 * progress entered at rsp - 8 whose entry read that return address (the scope
 * keeps it, and the state layout, since one site serves every function polled
 * from there); any other hit counts C_RETSITE_OTHER and nothing else.
 *
 * Build: proxy/capture/uprobes/build.py (clang -target bpf; no vmlinux.h, no
 * CO-RE: only the UAPI pt_regs, so the object is portable and committed).
 */
#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "GPL";

#define KIND_ENTRY 0
#define KIND_EXIT 1
#define KIND_UNWIND 2
#define KIND_COUNT 3
#define KIND_STATS 4 /* records only: an instance's totals, closed */
#define KIND_RETSITE 5 /* sites only: a learned return site (its records are KIND_EXIT) */
#define KIND_SPAWN 6 /* sites only: a task about to be spawned (a record in `side`, see on_spawn) */
#define KIND_WAKE 7 /* sites only: a waker function or a task's poll function (folded in `wakes`) */

#define REG_RDI 0
#define REG_RSI 1
#define REG_RSP 2
#define REG_RBP 3
#define REG_RAX 4 /* spawn sites: the new task's pointer is in rax (an allocation's return value) */
/* an entry site's cfa_reg (unused at entries): the function's return addresses */
#define REG_LEARN 8    /* are learned (rets_seen); its exits are its rets */
#define REG_RETSITES 9 /* are probed return sites (retsites); its exits are there */

#define F_SELF 1   /* self is valid */
#define F_STATE 2  /* state is valid */
#define F_UNCOVERED 4 /* an entry whose return site is not probed: its exit will not be seen */
#define F_TOTALS 8 /* a completion's exit (CFG_CHANGES): its instance's totals in ret, rax, ip */
#define F_PARENT 16 /* an entry (CFG_CHANGES) naming the poll it runs inside: parent_self, parent_fn */
#define F_ELIDED 32 /* CFG_ELIDE: rax holds the coroutines elided on the thread since its last record */

#define CHUNK 256 /* stack_max is a multiple of it */
#define MAX_CHUNKS 64 /* 16 KiB of stack at most */
#define STACK_MAX (CHUNK * MAX_CHUNKS)
#define PAGE 4096

#define C_HITS 0
#define C_RECORDS 1
#define C_DROPS 2
#define C_SCOPE_MISS 3
#define C_OTHER_PID 4
#define C_SCOPE_FULL 5
#define C_RETRIES 6
#define C_SKIPPED 7 /* hits not recorded (sampling) */
#define C_STATS_LOST 8 /* KIND_STATS records the ring had no room for */
#define C_DUPLICATES 9 /* hits run twice (two links on one site, cfg DEDUPE): the second dropped */
#define C_UNCOVERED 10 /* polls whose return address is not a probed return site (REG_RETSITES) */
#define C_RETSITE_OTHER 11 /* return-site hits that end no poll of ours (another callee) */
#define C_FLUSHED 12 /* entries written late (CFG_CHANGES, CFG_ELIDE): counted skipped at the hit, records or drops then */
#define C_ELIDED 13 /* CFG_ELIDE: polls of coroutines created and completed inside one poll of their parent */
#define C_SLICES 14 /* entries written with a stack slice */
#define C_LOST_WITH_ROOM 15 /* records lost (drops, stats lost) with the ring at most half full: see lost_with_room */
#define C_SPAWNS_LOST 16 /* spawn records the ring `side` had no room for */
#define N_COUNTERS 17

struct site {
	__u8 kind;
	__u8 self_reg;    /* entry: where self is */
	__u8 state_size;  /* 0: no layout (state not read) */
	__u8 cfa_reg;     /* exits: the CFA's base register (REG_RSP / REG_RBP) */
	__s32 cfa_off;    /* exits: CFA = cfa_reg + cfa_off; entry sp = CFA - 8 */
	__u32 state_off;
	__s32 sp_adjust;  /* the entry's sp = sp + sp_adjust (an entry moved past the prologue; an exit in the caller) */
	__u32 fn;         /* the resume function's index (the key of `instances`) */
	__u32 ret_back;   /* KIND_RETSITE: the return address is the probe's ip - ret_back */
};

struct config {
	__u32 tgid;        /* 0: any (the link's pid filter still applies) */
	__u32 stack_max;   /* bytes of stack at entries, a multiple of CHUNK */
	__s64 credits;     /* stack slices the proxy still wants: each entry takes one */
	__u32 sample_every; /* 0/1: record every poll; N: one root poll in N per instance */
	__u32 flags;        /* CFG_DEDUPE */
	__u32 epoch;        /* a thread state of another epoch is stale: emptied at its next hit */
	__u32 pad;
};

/* While the proxy swaps one link for another on a subset of its sites (the new
 * one attached before the old one is closed, so no poll goes unseen), a hit at a
 * site both links hold runs this program twice, with the same ip and sp. With
 * exits probed a thread never hits the same (ip, sp) twice in a row otherwise:
 * an entry's next poll at the same sp comes after its exit, an exit's after an
 * entry. (Not in entry-only mode: the flag is only set during a swap.) */
#define CFG_DEDUPE 1
#define CFG_ROOTS (1 << 12) /* task_roots holds a task type: root entries may be tasks' polls */
/* The program returns at once (bench_server.py --split's `empty` row: what the
 * kernel's traps cost at these sites with a BPF program that does nothing). */
#define CFG_OFF 2
/* Every poll is recorded (no sampling): the proxy's engine counts them, so no
 * instance totals are folded here and no KIND_STATS record goes out (on the
 * axum service 2 a request: a new life of the handler's futures). */
#define CFG_NOFOLD 4
/* Only what changes the graph is recorded, every poll folded (see the top). */
#define CFG_CHANGES 8
/* Full mode (every poll recorded, CFG_NOFOLD, no sampling): a coroutine created
 * and completed inside one poll of its parent writes no record. A nested entry in
 * the Unresumed state (a new coroutine) is held back in its scope (not recorded);
 * its exit, when it leaves Returned, writes nothing either: the poll is counted in
 * `site_elided` (per entry site) and the thread's `elided` count, which the next
 * record written on the thread carries (F_ELIDED, in rax: the engine skips as many
 * task ids and counts them finished, so the ids stay those of every poll recorded;
 * a held-back entry keeps those elided before it, elided_before, which its late
 * record carries, so the ids keep their order).
 * Anything else - an entry recorded inside it, an exit that suspends, panics or
 * whose state is unreadable - writes the held-back entries first (emit_pending,
 * bottom first: the poll below each went out before it), so the engine sees what it would have seen. At a
 * stop the proxy reads the held-back entries out of the threads' scope stacks, as
 * for CFG_CHANGES. At most MAX_PEND are held back on a thread at once. */
#define CFG_ELIDE 16
#define MAX_PEND 4
/* Full mode that samples while the proxy is behind (capture.py, "Catching up"):
 * the proxy switches sample_every between 1 and N by itself, and every poll is
 * folded into `instances` all the time (no CFG_NOFOLD), so POLLS and BUSY stay
 * exact over the switches. A life whose polls all went out as records is counted
 * by the engine, and one with none recorded is no graph node: neither sends its
 * KIND_STATS record (full-mode periods then send none, and a sampled period one
 * per life the graph saw in part: the nested coroutines' new lives, ~2 a request
 * on the axum service, under an unrecorded root poll send none). Under sampling, a thread's unrecorded root poll holds nothing back: the
 * CFG_ELIDE exit rules apply inside recorded root polls only. An elided
 * coroutine's instance is emptied in `instances` (polls 0; its poll is in
 * `site_elided`): a later life at its address must not close it as a node the
 * graph knows, and an empty instance is a new one at its next entry. */
#define CFG_ADAPT 32
/* With CFG_ADAPT and CFG_ELIDE, while sampling (sample_every > 1): a new task's
 * first poll (a root poll of a new instance, Unresumed) is held back as a nested
 * new coroutine is under CFG_ELIDE, in a recorded root poll: if it completes in
 * that poll nothing is written (counted in `site_elided` and the thread's elided
 * count, the engine's ids and finished count kept); if it suspends (or anything
 * is recorded inside it) its entry goes out late. So a task alive at a stop was
 * recorded, while a server that spawns a task per request done in one poll (the
 * axum benchmark's backend) writes no record for it while sampling
 * (catchup.py). */
#define CFG_HOLD_NEW 64

#define ST_RETURNED 1 /* __state after a completion (a generator's Returned, Panicked) */
#define ST_PANICKED 2

/* a poll in progress on a thread */
struct scope_val {
	__u64 sp;       /* the entry's sp (its key: an exit computes it) */
	__u64 self;
	__u64 ts;       /* entry time */
	__u64 hits;     /* the thread's hit count at the entry */
	__u64 ret;      /* the return address */
	__u64 state;    /* __state at the entry */
	__u32 fn;
	__u32 recorded; /* its entry went out as a record */
	__u32 state_off; /* the entry site's layout: a return site serves several functions */
	__u32 state_size;
	__u32 cookie;   /* the entry's site (a pending entry's late record) */
	__u16 flags;    /* the entry's record flags */
	__u16 elided_before; /* CFG_ELIDE, held back: the thread's elided coroutines before its entry */
	__u64 ip;
};

/* polls nested deeper on one thread are not given a scope (counted
 * C_SCOPE_FULL; their exits are scope misses) */
#define MAX_DEPTH 32

struct thread_state {
	__u64 hits;     /* hits on this thread so far */
	__u32 depth;    /* polls in progress on this thread: scopes[0 .. depth) */
	__u32 recording; /* the root poll in progress is recorded */
	__u64 last_ip;  /* the thread's last hit (CFG_DEDUPE) */
	__u64 last_sp;
	__u32 epoch;    /* config's epoch when this state was last reset */
	__u32 elided;   /* CFG_ELIDE: coroutines elided since the thread's last record */
	struct scope_val scopes[MAX_DEPTH]; /* [0]: the root poll */
	/* KIND_WAKE: the runtime task whose poll function (OP_POLL) ran last on this
	 * thread, and its sp there: a hit deeper (a lower sp) while a poll is in
	 * progress on the thread (depth > 0) runs inside that task's poll */
	__u64 cur_task;
	__u64 cur_sp;
	__u64 cur_unbound; /* cur_task's future not named yet: the next root entry on the thread is it */
};

struct inst_key {
	__u64 self;
	__u32 fn;
	__u32 pad;
};

struct inst_stats {
	__u64 polls;
	__u64 raw_ns;
	__u64 hits;     /* sum over its polls of 1 + the hits inside on its thread */
	__u64 recorded; /* polls whose records went out */
	/* CFG_CHANGES: what its last poll told the graph */
	__u64 parent_self; /* the enclosing poll's instance (0: a root poll) */
	__u32 parent_fn;
	__u32 tid;
	__u64 state;       /* __state after it */
};

struct ret_key {
	__u64 ret;
	__u32 fn;
	__u32 pad;
};

struct rec {
	__u16 kind;
	__u16 flags;
	__u32 cookie;
	__u32 tid;
	__u32 stack_len;
	__u64 ts;
	__u64 ip;
	__u64 sp;
	__u64 self;
	__u64 ret;
	__u64 rax;
	__u64 state;
	/* entries only: */
	__u64 rbp, rbx, r12, r13, r14, r15;
	__u64 parent_self; /* F_PARENT */
	__u64 parent_sp;
	__u32 parent_fn;
	__u32 pad;
	__u8 stack[STACK_MAX + PAGE]; /* the scratch record: a page-sized read may start at STACK_MAX - 1 */
};

#define EXIT_SIZE 72   /* offsetof(struct rec, rbp) */
#define ENTRY_SIZE 144 /* offsetof(struct rec, stack) */

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 16 << 20); /* the proxy resizes it before load */
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 65536); /* the proxy sizes it to its sites */
	__type(key, __u32);
	__type(value, struct site);
} sites SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct config);
} config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, N_COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct rec);
} scratch SEC(".maps");

/* CFG_ELIDE: polls elided per entry site (cookie), per CPU; sized by the proxy to its sites */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, __u64);
} site_elided SEC(".maps");

/* entries at a poll in progress on their thread (nested), per entry site (cookie), per CPU;
 * sized by the proxy to its sites */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, __u64);
} site_nested SEC(".maps");

/* hits per site (cookie), per CPU; sized by the proxy to its sites */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, __u64);
} site_hits SEC(".maps");

/* each thread's state and poll scopes, in its task-local storage (created at
 * its first hit, freed by the kernel when the thread exits) */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct thread_state);
} tstate SEC(".maps");

/* per coroutine instance: exact totals of every poll, recorded or not */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 262144);
	__type(key, struct inst_key);
	__type(value, struct inst_stats);
} instances SEC(".maps");

/* return addresses probed as return sites (runtime address -> 1) */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, __u32);
} retsites SEC(".maps");

/* (return address, function) seen at entries of REG_LEARN / REG_RETSITES sites and
 * not probed: what the proxy checks and probes next (value: entries seen) */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct ret_key);
	__type(value, __u64);
} rets_seen SEC(".maps");

/* ---- Spawns and wakes (KIND_SPAWN, KIND_WAKE sites; docs/wakes.md) ----
 *
 * A spawn site stands on a function every spawn of the runtime goes through
 * (tokio's task::Id::next), right after async-task's allocation of the task
 * (self_reg REG_RAX: the record keyed by the task's pointer), or, where the
 * function was inlined (release builds), after each increment of tokio's id
 * counter (state_size 1: the id is the counter's value less one). Its hit writes one
 * record into the ring `side` (never `events`: the poll decoder does not see
 * it) with what a backtrace needs later and nothing resolved: the registers the
 * CFI unwinder starts from, the first `spawn_stack` bytes of the stack, the
 * runtime's next task id (read at `aux.id_addr`: tokio's counter, the id the
 * task is about to get), the runtime task whose poll runs on the thread, and
 * the coroutines polled on the thread (its scope stack, innermost first).
 *
 * A wake site stands on a waker function (wake, wake by reference, clone,
 * drop) or a task's poll function (tokio's raw::poll, async-task's
 * RawTask::run); the site's state_off is the operation. The task is the
 * first argument (rdi: tokio's header, async-task's raw pointer; self_reg REG_RSP: read at rsp + cfa_off, where a debug build's prologue stored it). Each hit is
 * folded into the task's entry of `wakes`; nothing goes to a ring. A poll
 * closes the scheduling delay begun by the first wake since the last poll. */
#define OP_WAKE 0        /* wake by value: a wake, and the waker is consumed */
#define OP_WAKE_BY_REF 1
#define OP_CLONE 2
#define OP_DROP 3
#define OP_POLL 4
#define SPAWN_MAX 16384 /* a path's first record; later ones what `spawn_sizes` says */
#define KEY_NONE 0 /* a spawn record keyed by nothing */
#define KEY_ID 1   /* by the runtime's task id (tokio) */
#define KEY_TASK 2 /* by the new task's pointer (async-task: its allocation) */
#define CHAIN 8
#define HIST 20  /* scheduling delays: bucket b < 2^(b+10) ns (the first < 1 us, the last the rest) */
#define LAST 4   /* the last wakes kept per task */

struct aux {
	__u64 id_addr;     /* the runtime's next task id (0: none) */
	__u32 spawn_stack; /* bytes of stack a spawn record keeps, <= SPAWN_MAX */
	__u32 pad;
};

/* A spawning path: the spawn site, the return address of the frame it stands in (read at
 * rsp + the site's cfa_off - 8: the instantiation of the generic spawn function it was
 * called from), and the resume function polled innermost on the thread + 1 (0: none). The
 * stack a path's records keep is learnt by the proxy from its first record, unwound: down
 * to the program's spawning frame and a little more (wakes.py, `spawn_sizes`). */
struct spawn_path {
	__u64 ret;
	__u32 cookie;
	__u32 fn;
};

struct spawn_rec {
	__u16 kind;
	__u8 depth;        /* polls in progress on the thread (<= MAX_DEPTH) */
	__u8 key;          /* what task_id holds: KEY_NONE, KEY_ID, KEY_TASK */
	__u32 cookie;
	__u32 tid;
	__u32 stack_len;
	__u64 ts;
	__u64 ip;
	__u64 sp;
	__u64 task_id;     /* KEY_ID: read at aux.id_addr; KEY_TASK: rax (self_reg REG_RAX) */
	__u64 task;        /* the runtime task polled on the thread (0: none) */
	__u64 rbp, rbx, r12, r13, r14, r15;
	__u64 chain[CHAIN];    /* self of the polls in progress, innermost first */
	__u32 chain_fn[CHAIN]; /* ... their resume function's index */
	struct spawn_path path; /* the spawning path (its stack size learnt in `spawn_sizes`) */
	__u8 stack[SPAWN_MAX + 2 * PAGE];
};
#define SPAWN_HEAD 216 /* offsetof(struct spawn_rec, stack) */

struct wake_last {
	__u64 ts;
	__u64 waker;  /* the runtime task whose poll woke it (0: none: a driver, a timer, another thread) */
	__u64 ret;    /* the waker function's return address */
	__u32 tid;
	__u32 op;     /* the operation | (the resume function polled innermost on the thread + 1) << 8 */
};

struct wake_stats {
	__u64 wakes;      /* by value and by reference */
	__u64 by_ref;
	__u64 self_wakes; /* woken from inside its own poll */
	__u64 clones;
	__u64 drops;      /* drops, and wakes by value (they consume the waker) */
	__u64 polls;
	__u64 woken_at;   /* the first wake since the last poll began (0: none) */
	__u64 sched_ns;   /* sum of wake -> poll delays */
	__u64 sched_max;
	__u64 sched_n;
	__u64 poll_at;    /* the last poll's start */
	__u64 first_ts;   /* first seen */
	__u64 future;     /* the first coroutine its poll polls (self): the task as the graph knows it */
	__u32 hist[HIST];
	__u32 last_i;     /* wakes written into last[] */
	__u32 pad;
	struct wake_last last[LAST];
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20); /* the proxy resizes it before load */
} side SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct spawn_rec);
} side_scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct aux);
} aux SEC(".maps");

/* spawning path -> the stack bytes its records keep (written by the proxy once it has unwound
 * one record of the path; absent: aux.spawn_stack) */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct spawn_path);
	__type(value, __u32);
} spawn_sizes SEC(".maps");

/* A task type whose poll is seen at its future's root entry (task_roots.py): the future's
 * resume function -> the future's offset from the task's header and the vtables the header
 * may point to (one per scheduler the type is spawned on). Its raw::poll is then no site. */
#define ROOT_VTS 4
struct task_root {
	__u32 off;    /* the future's self - the header */
	__u32 vt_off; /* the header's vtable field */
	__u64 vt[ROOT_VTS]; /* runtime addresses, 0: none */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, struct task_root);
} task_roots SEC(".maps");

/* per runtime task (its header or raw pointer): wakes folded (the proxy sizes it) */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, struct wake_stats);
} wakes SEC(".maps");

/* an all-zero wake_stats: a new task's entry is inserted from it (too big for the BPF stack) */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct wake_stats);
} wake_zero SEC(".maps");

static __always_inline void count(__u32 which)
{
	__u64 *c = bpf_map_lookup_elem(&counters, &which);
	if (c)
		*c += 1;
}

/* A record of `size` bytes could not be written: was the ring full? Counted
 * C_LOST_WITH_ROOM when the unread bytes plus the record's (with its 8-byte
 * header), read right after the failure, fill at most half the ring. Not
 * "less than the ring": the proxy frees up to 8 MiB at a time on the other
 * CPU, so a ring full at the failure can have room a few ns later (a 30 s
 * --uprobe-strict run counted 3 of its 12 full-ring losses so). */
static __always_inline void lost_with_room(__u64 size)
{
	__u64 unread = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA);
	__u64 ring = bpf_ringbuf_query(&events, BPF_RB_RING_SIZE);
	if (unread + ((size + 8 + 7) & ~7ULL) <= ring / 2)
		count(C_LOST_WITH_ROOM);
}

static __always_inline __u64 read_state_at(__u64 self, __u32 off, __u32 n, __u16 *flags)
{
	/* 16 bytes for a read of at most 15 (n & 15): the verifier cannot always
	 * carry the n <= 8 bound to the call */
	__u64 v[2] = {0, 0};
	if (!self || n == 0 || n > 8)
		return 0;
	barrier_var(n); /* keeps the mask below: clang drops it when it knows n <= 8 */
	if (bpf_probe_read_user(v, n & 15, (void *)(self + off)) == 0)
		*flags |= F_STATE;
	return v[0];
}

static __always_inline __u64 read_state(__u64 self, const struct site *s, __u16 *flags)
{
	return read_state_at(self, s->state_off, s->state_size, flags);
}

/* The fields every record has; `r` is a ring slot or the scratch record; `ts`
 * the hit's one clock read (a read costs ~0.1 us in this VM). */
static __always_inline void fill_head(struct rec *r, struct pt_regs *ctx, __u16 kind, __u32 cookie,
				      __u64 id, __u64 sp, __u64 ts, __u64 ret)
{
	r->kind = kind;
	r->flags = 0;
	r->cookie = cookie;
	r->tid = (__u32)id;
	r->stack_len = 0;
	r->ts = ts;
	r->ip = PT_REGS_IP(ctx);
	r->sp = sp;
	r->rax = ctx->rax;
	r->ret = ret; /* entries: the return address read at the entry's sp */
}

/* An entry's fields (self, state, callee-saved registers), and its scope. */
static __always_inline void fill_entry(struct rec *r, struct pt_regs *ctx, __u64 self, __u64 state,
				       __u16 flags, __u64 pself, __u64 psp, __u32 pfn)
{
	r->self = self;
	r->flags = flags;
	r->parent_self = pself;
	r->parent_sp = psp;
	r->parent_fn = pfn;
	r->pad = 0;
	r->state = state;
	r->rbp = ctx->rbp;
	r->rbx = ctx->rbx;
	r->r12 = ctx->r12;
	r->r13 = ctx->r13;
	r->r14 = ctx->r14;
	r->r15 = ctx->r15;
}

static __always_inline __u64 entry_self(struct pt_regs *ctx, const struct site *s)
{
	/* read both: the verifier refuses a ctx pointer moved by a variable offset */
	__u64 rdi = ctx->rdi, rsi = ctx->rsi;
	barrier_var(rdi);
	barrier_var(rsi);
	return s->self_reg == REG_RSI ? rsi : rdi;
}

/* An exit's scope: its entry's sp; a `ret` leaves with the entry's sp, an
 * unwind exit computes it from the site's CFA rule (reg + off - 8). */
static __always_inline __u64 exit_key(struct pt_regs *ctx, const struct site *s, __u64 sp)
{
	__u64 rbp = ctx->rbp;
	barrier_var(rbp);
	__u64 base = s->cfa_reg == REG_RBP ? rbp : sp;
	return base + (__s64)s->cfa_off - 8;
}

/* The index of the thread's scope entered at `sp`, or -1. From the top down:
 * the scopes below have higher sps, so the search stops at the first above `sp`. */
static __always_inline int find_scope(struct thread_state *th, __u64 sp)
{
	__u32 depth = th->depth;
	for (int k = 0; k < MAX_DEPTH; k++) {
		int i = (int)depth - 1 - k;
		if (i < 0)
			break;
		struct scope_val *sc = &th->scopes[i & (MAX_DEPTH - 1)];
		if (sc->sp == sp)
			return i;
		if (sc->sp > sp)
			break;
	}
	return -1;
}

/* An entry at `sp`: the scopes at or below it are polls whose exits were missed. */
static __always_inline void pop_stale(struct thread_state *th, __u64 sp)
{
	for (int k = 0; k < MAX_DEPTH; k++) {
		__u32 d = th->depth;
		if (d == 0 || th->scopes[(d - 1) & (MAX_DEPTH - 1)].sp > sp)
			break;
		th->depth = d - 1;
	}
}

/* An exit's fields: self and __state when its poll's scope was found (the
 * layout: the site's, or the scope's at a return site). */
static __always_inline void fill_exit(struct rec *r, __u32 st_off, __u32 st_size, __u64 self)
{
	r->self = 0;
	r->state = 0;
	if (self) {
		r->self = self;
		r->flags = F_SELF;
		r->state = read_state_at(self, st_off, st_size, &r->flags);
	}
}

/* The thread's state (created zeroed on its first hit; emptied when the proxy
 * moved to a new epoch: a time slice's end). */
static __always_inline struct thread_state *thread_of(const struct config *cfg)
{
	struct thread_state *t = bpf_task_storage_get(&tstate, bpf_get_current_task_btf(), 0,
						     BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (t && t->epoch != cfg->epoch) {
		t->epoch = cfg->epoch;
		t->hits = 0;
		t->depth = 0;
		t->recording = 0;
		t->last_ip = 0;
		t->last_sp = 0;
	}
	return t;
}

/* A closed instance's totals, as a record (KIND_STATS). */
static __always_inline void emit_stats(struct inst_key *ik, struct inst_stats *st, __u32 tid)
{
	struct rec *r = bpf_ringbuf_reserve(&events, EXIT_SIZE, 0);
	if (!r) {
		count(C_STATS_LOST);
		lost_with_room(EXIT_SIZE);
		return;
	}
	r->kind = KIND_STATS;
	r->flags = 0;
	r->cookie = ik->fn;
	r->tid = tid;
	r->stack_len = 0;
	r->ts = bpf_ktime_get_ns();
	r->ip = st->recorded;
	r->sp = 0;
	r->self = ik->self;
	r->ret = st->polls;
	r->rax = st->raw_ns;
	r->state = st->hits;
	bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
}

/* CFG_ELIDE: the coroutines elided on the thread since its last record ride on
 * this one (after its flags are set); given back when the record is dropped. */
static __always_inline void take_elided(struct thread_state *th, struct rec *r)
{
	if (th && th->elided) {
		r->flags |= F_ELIDED;
		r->rax = th->elided;
		th->elided = 0;
	}
}

/* Reserve a fixed-size record in the ring (once more when the ring's lock gave
 * up: with 4+ threads on 2 CPUs its resilient spinlock, Linux 6.15+, fails now
 * and then; a full ring fails again and the hit counts as dropped). */
#define RESERVE(size) ({							\
	struct rec *_r = bpf_ringbuf_reserve(&events, (size), 0);		\
	if (!_r) {								\
		count(C_RETRIES);						\
		_r = bpf_ringbuf_reserve(&events, (size), 0);			\
		if (!_r)							\
			lost_with_room(size);					\
	}									\
	_r; })

/* CFG_CHANGES: the entry of the thread's scope `i`, pending until now, as a
 * record (no stack slice, no callee-saved registers), naming the poll below it. */
static __noinline void emit_late(struct thread_state *th, int i, __u64 id, int named)
{
	/* a subprogram, not inlined: its paths (ring full or not, a parent or not)
	 * meet again at its return, so the verifier does not multiply them over the
	 * up to 4 places it is called from (inlined: 26 s of verification) */
	struct scope_val *sc = &th->scopes[i & (MAX_DEPTH - 1)];
	if (sc->recorded)
		return;
	sc->recorded = 1; /* lost or not: its exit goes out (a loss is counted) */
	count(C_FLUSHED);
	struct rec *r = RESERVE(ENTRY_SIZE);
	if (!r) {
		count(C_DROPS);
		th->elided += sc->elided_before; /* a later record carries them */
		sc->elided_before = 0;
		return;
	}
	r->kind = KIND_ENTRY;
	r->flags = sc->flags;
	r->cookie = sc->cookie;
	r->tid = (__u32)id;
	r->stack_len = 0;
	r->ts = sc->ts;
	r->ip = sc->ip;
	r->sp = sc->sp;
	r->self = sc->self;
	r->ret = sc->ret;
	r->rax = 0;
	r->state = sc->state;
	/* no callee-saved registers (no stack slice either), no parent yet */
	__builtin_memset(&r->rbp, 0, ENTRY_SIZE - EXIT_SIZE);
	if (i > 0 && named) { /* CFG_ELIDE: the poll below went out before it (no name needed) */
		struct scope_val *up = &th->scopes[(i - 1) & (MAX_DEPTH - 1)];
		r->flags |= F_PARENT;
		r->parent_self = up->self;
		r->parent_sp = up->sp;
		r->parent_fn = up->fn;
	}
	if (sc->elided_before) { /* CFG_ELIDE: those elided before it, not those inside it */
		r->flags |= F_ELIDED;
		r->rax = sc->elided_before;
		sc->elided_before = 0;
	}
	bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
	count(C_RECORDS);
}

/* CFG_CHANGES: before a record of a poll of the object at `self` over the
 * thread's scopes [0, upto): the pending entries right below it of the same
 * object (a wrapper's resume function polling the inner one: GenFuture::poll
 * and its generator), bottom first, MAX_WRAP of them at most (the verifier's
 * bound). The engine takes them for one coroutine, the outer poll first: an
 * outer entry after the inner's records would look like a new life. */
#define MAX_WRAP 2
static __always_inline void emit_same_object(struct thread_state *th, __u32 upto, __u64 self, __u64 id)
{
	int low = (int)upto;
	for (int k = 0; k < MAX_WRAP; k++) {
		int j = low - 1;
		if (j < 0)
			break;
		struct scope_val *sc = &th->scopes[j & (MAX_DEPTH - 1)];
		if (sc->recorded || sc->self != self)
			break;
		low = j;
	}
	for (int k = 0; k < MAX_WRAP; k++) {
		int j = low + k;
		if (j >= (int)upto)
			break;
		emit_late(th, j, id, 1);
	}
}

/* CFG_ELIDE: how many held-back entries lie right below the thread's scope `upto`
 * (they are the top of the stack: a record flushes those below it), MAX_PEND at most. */
static __always_inline int pending_below(struct thread_state *th, __u32 upto)
{
	int n = 0;
	for (int k = 0; k < MAX_PEND; k++) {
		int j = (int)upto - 1 - k;
		if (j < 0)
			break;
		barrier_var(j); /* keeps the mask: the verifier needs the bound */
		if (th->scopes[j & (MAX_DEPTH - 1)].recorded)
			break;
		n++;
	}
	return n;
}

/* CFG_ELIDE: before a record over the thread's scopes [0, upto): the held-back
 * entries right below it, bottom first. */
static __always_inline void emit_pending(struct thread_state *th, __u32 upto, __u64 id)
{
	int low = (int)upto - pending_below(th, upto);
	for (int k = 0; k < MAX_PEND; k++) {
		int j = low + k;
		if (j >= (int)upto)
			break;
		emit_late(th, j, id, 0);
	}
}

/* The runtime task whose poll runs on the thread at this hit (0: none). */
static __always_inline __u64 running_task(struct thread_state *th, __u64 sp)
{
	if (th && th->depth > 0 && th->cur_task && sp < th->cur_sp)
		return th->cur_task;
	return 0;
}

/* A root entry on a thread right after a task's poll function (KIND_WAKE, OP_POLL): its
 * coroutine is the task's future; the task's `wakes` entry names it (once a poll). */
static __noinline void bind_future(struct thread_state *th, __u64 self, __u64 first)
{
	__u32 zero = 0;
	__u64 key = th->cur_task;
	th->cur_unbound = 0;
	struct wake_stats *w = bpf_map_lookup_elem(&wakes, &key);
	if (!w)
		return;
	if (first && w->polls > 1) {
		/* its coroutine's first poll (Unresumed): a new task in a cell an ended one had;
		 * the old task's figures go (its poll, just counted, stays) */
		struct wake_stats *z = bpf_map_lookup_elem(&wake_zero, &zero);
		if (z) {
			__u64 at = w->poll_at;
			__builtin_memcpy(w, z, sizeof(*w));
			w->polls = 1;
			w->poll_at = at;
			w->first_ts = at;
		}
	}
	w->future = self;
}

/* KIND_SPAWN: one record in `side` (see the top of the spawns and wakes part). */
static __noinline void on_spawn(struct pt_regs *ctx, struct thread_state *th, const struct site *s, __u32 cookie,
			       __u64 now)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 zero = 0;
	struct spawn_rec *r = bpf_map_lookup_elem(&side_scratch, &zero);
	struct aux *a = bpf_map_lookup_elem(&aux, &zero);
	if (!r || !a)
		return;
	__u64 sp = PT_REGS_SP(ctx);
	r->kind = KIND_SPAWN;
	r->cookie = cookie;
	r->tid = (__u32)id;
	r->ts = now;
	r->ip = PT_REGS_IP(ctx);
	r->sp = sp;
	r->task_id = 0;
	r->key = KEY_NONE;
	if (s->self_reg == REG_RAX) { /* after async-task's allocation of the task (task_allocs.py) */
		r->task_id = ctx->rax;
		r->key = r->task_id ? KEY_TASK : KEY_NONE;
	} else if (a->id_addr) {
		bpf_probe_read_user(&r->task_id, 8, (void *)a->id_addr);
		if (s->state_size) /* a site after the counter's increment (an inlined Id::next) */
			r->task_id -= 1;
		r->key = KEY_ID;
	}
	r->task = running_task(th, sp);
	r->rbp = ctx->rbp;
	r->rbx = ctx->rbx;
	r->r12 = ctx->r12;
	r->r13 = ctx->r13;
	r->r14 = ctx->r14;
	r->r15 = ctx->r15;
	__u32 depth = th ? th->depth : 0;
	r->depth = (__u8)depth;
	for (int k = 0; k < CHAIN; k++) {
		int i = (int)depth - 1 - k;
		r->chain[k] = 0;
		r->chain_fn[k] = 0;
		if (i < 0 || !th)
			continue;
		struct scope_val *sc = &th->scopes[i & (MAX_DEPTH - 1)];
		r->chain[k] = sc->self;
		r->chain_fn[k] = sc->fn;
	}
	r->path.ret = 0;
	r->path.cookie = cookie;
	r->path.fn = depth > 0 ? r->chain_fn[0] + 1 : 0;
	if (s->cfa_off)
		bpf_probe_read_user(&r->path.ret, 8, (void *)(sp + s->cfa_off - 8));
	__u32 want = a->spawn_stack;
	__u32 *learnt = bpf_map_lookup_elem(&spawn_sizes, &r->path);
	if (learnt)
		want = *learnt;
	if (want > SPAWN_MAX)
		want = SPAWN_MAX;
	/* `want` bytes from sp, read a page at most at a time and never across a page boundary
	 * (the stack's top page may be the last mapped one) */
	__u32 got = 0;
	for (int i = 0; i <= SPAWN_MAX / PAGE; i++) {
		if (got >= want)
			break;
		__u32 n = PAGE - (__u32)((sp + got) & (PAGE - 1));
		if (n > want - got)
			n = want - got;
		if (n == 0 || n > PAGE)
			break;
		barrier_var(n);
		n &= 2 * PAGE - 1; /* the verifier's bound (stack[] has room for it past SPAWN_MAX) */
		if (bpf_probe_read_user(&r->stack[got & (SPAWN_MAX - 1)], n, (void *)(sp + got)))
			break;
		got += n;
	}
	r->stack_len = got;
	long size = SPAWN_HEAD + (got & (SPAWN_MAX * 2 - 1));
	if (size > SPAWN_HEAD + SPAWN_MAX)
		size = SPAWN_HEAD + SPAWN_MAX;
	if (bpf_ringbuf_output(&side, r, size, BPF_RB_NO_WAKEUP))
		count(C_SPAWNS_LOST);
}

static __always_inline __u32 delay_bucket(__u64 ns)
{
	__u32 b = 0;
	ns >>= 10;
	for (int i = 0; i < HIST - 1; i++) {
		if (!ns)
			break;
		ns >>= 1;
		b++;
	}
	return b;
}

/* The task's `wakes` entry, made on its first hit. */
static __always_inline struct wake_stats *wake_entry(__u64 key, __u64 now)
{
	__u32 zero = 0;
	struct wake_stats *w = bpf_map_lookup_elem(&wakes, &key);
	if (!w) {
		struct wake_stats *z = bpf_map_lookup_elem(&wake_zero, &zero);
		if (!z)
			return 0;
		bpf_map_update_elem(&wakes, &key, z, BPF_NOEXIST);
		w = bpf_map_lookup_elem(&wakes, &key);
		if (!w)
			return 0;
		w->first_ts = now;
	}
	return w;
}

/* A task's poll begins (its raw::poll site, or its future's root entry: task_roots): the
 * scheduling delay since its first wake closed; the thread runs the task until sp is left. */
static __always_inline void fold_poll(struct thread_state *th, struct wake_stats *w, __u64 key, __u64 sp, __u64 now)
{
		if (w->woken_at && now > w->woken_at) {
			__u64 d = now - w->woken_at;
			w->sched_ns += d;
			w->sched_n += 1;
			if (d > w->sched_max)
				w->sched_max = d;
			__u32 b = delay_bucket(d);
			barrier_var(b); /* keeps the bound below: the verifier needs it */
			if (b < HIST)
				w->hist[b] += 1;
		}
		w->woken_at = 0;
		w->polls += 1;
		w->poll_at = now;
		if (th) {
			th->cur_task = key;
			th->cur_sp = sp;
			th->cur_unbound = 1;
		}
}

/* KIND_WAKE: folded into the task's `wakes` entry. */
static __noinline void on_wake(struct pt_regs *ctx, struct thread_state *th, const struct site *s, __u64 id, __u64 now)
{
	__u32 op = s->state_off;
	__u64 key = ctx->rdi;
	__u64 sp = PT_REGS_SP(ctx);
	if (s->self_reg == REG_RSP) { /* a debug build's waker: the task in its frame's slot (wake_sites.py) */
		key = 0;
		bpf_probe_read_user(&key, 8, (void *)(sp + (__s64)s->cfa_off));
	}
	if (!key)
		return;
	struct wake_stats *w = wake_entry(key, now);
	if (!w)
		return;
	if (op == OP_POLL) {
		fold_poll(th, w, key, sp, now);
		return;
	}
	if (op == OP_CLONE) {
		w->clones += 1;
		return;
	}
	if (op == OP_DROP) {
		w->drops += 1;
		return;
	}
	__u64 waker = running_task(th, sp);
	w->wakes += 1;
	if (op == OP_WAKE_BY_REF)
		w->by_ref += 1;
	else
		w->drops += 1;
	if (waker == key)
		w->self_wakes += 1;
	if (!w->woken_at)
		w->woken_at = now;
	__u64 ret = 0; /* at the entry's sp: the site may stand after a push or two (sp_adjust) */
	bpf_probe_read_user(&ret, 8, (void *)(sp + (__s64)s->sp_adjust));
	__u32 i = w->last_i & (LAST - 1);
	w->last[i].ts = now;
	w->last[i].waker = waker;
	w->last[i].ret = ret;
	w->last[i].tid = (__u32)id;
	__u32 fn1 = 0; /* the resume function polled innermost on the thread, + 1 (0: none) */
	if (th && th->depth > 0)
		fn1 = th->scopes[(th->depth - 1) & (MAX_DEPTH - 1)].fn + 1;
	w->last[i].op = op | (fn1 << 8);
	w->last_i += 1;
}

/* A root entry (depth 0) of a task type's future (task_roots): the task's poll, as its
 * raw::poll site would have folded it, then the task bound to its future. Not a task's when
 * the header the offset gives does not point to the type's vtable. */
static __noinline int root_poll(struct thread_state *th, __u32 fn_first, __u64 self, __u64 sp, __u64 now)
{
	__u32 fn = fn_first & 0x7fffffff; /* the top bit: the future's first poll (Unresumed) */
	struct task_root *tr = bpf_map_lookup_elem(&task_roots, &fn);
	if (!tr || self < tr->off)
		return 0;
	__u64 key = self - tr->off, vt = 0;
	if (bpf_probe_read_user(&vt, 8, (void *)(key + tr->vt_off)) || !vt)
		return 0;
	int ok = 0;
	for (int i = 0; i < ROOT_VTS; i++)
		if (tr->vt[i] == vt)
			ok = 1;
	if (!ok)
		return 0;
	struct wake_stats *w = wake_entry(key, now);
	if (!w)
		return 0;
	fold_poll(th, w, key, sp + 8, now);
	bind_future(th, self, fn_first >> 31);
	return 1;
}

SEC("uprobe")
int asyncrsp_poll(struct pt_regs *ctx)
{
	__u32 zero = 0;
	__u64 id = bpf_get_current_pid_tgid();
	__u32 cookie = (__u32)bpf_get_attach_cookie(ctx);
	struct config *cfg = bpf_map_lookup_elem(&config, &zero);
	if (!cfg || cfg->flags & CFG_OFF)
		return 0;
	if (cfg->tgid && (__u32)(id >> 32) != cfg->tgid) {
		count(C_OTHER_PID);
		return 0;
	}
	struct thread_state *th = thread_of(cfg);
	if (th) {
		__u64 ip = PT_REGS_IP(ctx), rsp = PT_REGS_SP(ctx);
		if (cfg->flags & CFG_DEDUPE && th->last_ip == ip && th->last_sp == rsp) {
			count(C_DUPLICATES);
			return 0;
		}
		th->last_ip = ip;
		th->last_sp = rsp;
	}
	__u64 *sh = bpf_map_lookup_elem(&site_hits, &cookie);
	if (sh)
		*sh += 1;
	struct site *s = bpf_map_lookup_elem(&sites, &cookie);
	if (s && s->kind == KIND_COUNT)
		return 0; /* counted, no record (not in hits = records + drops) */
	if (s && s->kind == KIND_SPAWN) {
		on_spawn(ctx, th, s, cookie, bpf_ktime_get_ns());
		return 0; /* counted in site_hits, its record in `side` */
	}
	if (s && s->kind == KIND_WAKE) {
		on_wake(ctx, th, s, id, bpf_ktime_get_ns());
		return 0; /* counted in site_hits, folded in `wakes` */
	}
	__u64 sp = PT_REGS_SP(ctx);
	if (s && s->kind == KIND_RETSITE) {
		/* ours only when a poll in progress entered at rsp - 8 read this return address */
		int ri = th ? find_scope(th, sp - 8) : -1;
		if (ri < 0 || th->scopes[ri & (MAX_DEPTH - 1)].ret != PT_REGS_IP(ctx) - s->ret_back) {
			count(C_RETSITE_OTHER);
			return 0;
		}
	}
	count(C_HITS);
	if (!s) {
		count(C_DROPS);
		return 0;
	}
	if (th)
		th->hits += 1;

	__u64 now = bpf_ktime_get_ns();
	if (s->kind != KIND_ENTRY) {
		__u64 esp = exit_key(ctx, s, sp);
		int si = th ? find_scope(th, esp) : -1;
		struct scope_val *sc = si >= 0 ? &th->scopes[si & (MAX_DEPTH - 1)] : 0;
		__u64 self = 0;
		__u32 recorded = th && !(cfg->flags & CFG_CHANGES) ? th->recording : 1;
		__u32 st_off = s->state_off, st_size = s->state_size, rec_fn = 0;
		if (sc && s->kind == KIND_RETSITE) {
			st_off = sc->state_off;
			st_size = sc->state_size;
			rec_fn = sc->fn + 1; /* the record names its function: the site serves several */
		}
		struct inst_key ik = {};
		struct inst_stats *st = 0;
		__u64 xstate = 0;
		__u16 xflags = 0;
		int done = 0; /* CFG_CHANGES: a completion, its totals in the record */
		int elide = 0; /* CFG_ELIDE: a held-back coroutine completed in its first poll */
		if (sc) {
			self = sc->self;
			recorded = sc->recorded;
			ik.self = sc->self;
			ik.fn = sc->fn;
			if (!(cfg->flags & CFG_NOFOLD) && !((cfg->flags & CFG_CHANGES) && !st_size))
				st = bpf_map_lookup_elem(&instances, &ik);
			if (cfg->flags & CFG_CHANGES) {
				xstate = read_state_at(self, st_off, st_size, &xflags);
				/* a state change (or one not known), or a panic: the entry goes out late */
				if (!recorded && (s->kind == KIND_UNWIND || !(xflags & F_STATE) || !(sc->flags & F_STATE) ||
						  xstate != sc->state)) {
					emit_same_object(th, (__u32)si, self, id);
					emit_late(th, si, id, 1);
					recorded = 1;
				}
				if (st) {
					st->state = xstate;
					done = recorded && (xflags & F_STATE) && (xstate == ST_RETURNED || xstate == ST_PANICKED);
				}
			}
			if (!(cfg->flags & CFG_CHANGES) && (cfg->flags & CFG_ELIDE) && !recorded && th->recording) {
				xstate = read_state_at(self, st_off, st_size, &xflags);
				if (s->kind != KIND_UNWIND && (xflags & F_STATE) && xstate == ST_RETURNED) {
					elide = 1;
				} else { /* it suspended, panicked or is not known: its entry goes out late */
					emit_pending(th, (__u32)si + 1, id);
					recorded = 1;
				}
			}
			if (st) { /* its poll was counted at its entry */
				st->raw_ns += now - sc->ts;
				st->hits += th->hits - sc->hits;
				st->recorded += recorded;
			}
			th->depth = si; /* popped, with any scope left above it */
			if (elide) {
				__u32 ck = sc->cookie;
				__u64 *n = bpf_map_lookup_elem(&site_elided, &ck);
				if (n)
					*n += 1;
				/* one coroutine: a wrapper's inner resume function (the same object
				 * right below: GenFuture::poll and its generator) is counted by the outer */
				int below = si - 1;
				barrier_var(below); /* keeps the mask: the verifier needs the bound */
				if (si == 0 || th->scopes[below & (MAX_DEPTH - 1)].self != self)
					th->elided += 1;
				th->elided += sc->elided_before;
				count(C_ELIDED);
				if (st) { /* CFG_ADAPT: folded at its entry, never a graph task */
					/* emptied, not deleted: a delete here and an insert at the
					 * next new coroutine at this address (the next request's,
					 * most often) cost ~45 ns a hit on the axum benchmark (6%
					 * of the program's time); an empty instance is taken as a
					 * new one at its next entry and the proxy skips it */
					st->polls = 0;
					st->raw_ns = 0;
					st->hits = 0;
					st->recorded = 0;
				}
			}
		} else {
			count(C_SCOPE_MISS);
		}
		if (!recorded) {
			count(C_SKIPPED);
			return 0;
		}
		/* exits: a 72-byte record written in place in the ring (no copy) */
		struct rec *r = RESERVE(EXIT_SIZE);
		if (!r) {
			count(C_DROPS); /* the poll is over all the same */
			return 0;
		}
		/* sp_adjust: an exit probed in the caller after the call (-8: the return
		 * address popped); the record carries the entry's sp */
		fill_head(r, ctx, s->kind == KIND_RETSITE ? KIND_EXIT : s->kind, cookie, id, sp + (__s64)s->sp_adjust, now, 0);
		r->stack_len = rec_fn;
		if (cfg->flags & CFG_CHANGES) {
			r->self = self;
			r->flags = self ? F_SELF | xflags : 0;
			r->state = xstate;
		} else {
			fill_exit(r, st_off, st_size, self);
		}
		take_elided(th, r);
		if (done) {
			/* the instance is over: its totals ride on its last exit, and it leaves the map */
			r->flags |= F_TOTALS;
			r->stack_len = ik.fn + 1; /* as at a return site: the record names its function */
			r->ret = st->polls;
			r->rax = st->raw_ns;
			r->ip = st->hits;
			bpf_map_delete_elem(&instances, &ik);
		}
		bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
		count(C_RECORDS);
		return 0;
	}

	__u64 esp = sp + (__s64)s->sp_adjust;
	__u64 self = entry_self(ctx, s);
	__u16 flags = F_SELF;
	__u64 state = read_state(self, s, &flags);

	__u64 ret = 0;
	bpf_probe_read_user(&ret, 8, (void *)esp);

	/* polled through a vtable: where does this poll return to? */
	int uncovered = 0;
	if (s->cfa_reg == REG_LEARN || s->cfa_reg == REG_RETSITES) {
		if (!bpf_map_lookup_elem(&retsites, &ret)) {
			struct ret_key rk = {.ret = ret, .fn = s->fn};
			__u64 *seen = bpf_map_lookup_elem(&rets_seen, &rk);
			if (seen) {
				__sync_fetch_and_add(seen, 1);
			} else {
				__u64 one = 1;
				bpf_map_update_elem(&rets_seen, &rk, &one, BPF_NOEXIST);
			}
			if (s->cfa_reg == REG_RETSITES) {
				uncovered = 1;
				flags |= F_UNCOVERED;
				count(C_UNCOVERED);
			}
		}
	}

	/* the enclosing poll, once the scopes whose exits were missed are popped
	 * (the stack is back at or above their frames) */
	__u64 pself = 0, psp = 0;
	__u32 pfn = 0;
	if (th) {
		pop_stale(th, esp);
		/* a task type's future first (task_roots): a task-poll site's task whose future was
		 * not entered (done, cancelled, inlined) must not take this one's */
		if (th->depth == 0 && cfg->flags & CFG_ROOTS &&
		    root_poll(th, s->fn | ((flags & F_STATE) && state == 0 ? 1u << 31 : 0), self, esp, now))
			;
		else if (th->cur_unbound && th->depth == 0 && esp < th->cur_sp)
			bind_future(th, self, (flags & F_STATE) && state == 0);
		__u32 d = th->depth;
		if (d > 0) {
			struct scope_val *up = &th->scopes[(d - 1) & (MAX_DEPTH - 1)];
			pself = up->self;
			psp = up->sp;
			pfn = up->fn;
			__u64 *nn = bpf_map_lookup_elem(&site_nested, &cookie);
			if (nn)
				*nn += 1;
		}
	}

	/* the instance's totals; a new one, or a new life at its address (entered
	 * Unresumed after polls: the old one's totals go out first) */
	struct inst_key ik = {.self = self, .fn = s->fn};
	struct inst_stats *st = 0;
	int fresh = 0, changed = 0;
	/* no totals without the state: every poll of a function without a layout
	 * changes what the graph knows (its state is not known), all recorded */
	int nofold = (cfg->flags & CFG_NOFOLD) || ((cfg->flags & CFG_CHANGES) && !s->state_size);
	if (!nofold)
		st = bpf_map_lookup_elem(&instances, &ik);
	if (!st && !nofold) {
		struct inst_stats zero = {.polls = 1, .parent_self = pself, .parent_fn = pfn,
					  .tid = (__u32)id, .state = state};
		bpf_map_update_elem(&instances, &ik, &zero, BPF_ANY);
		fresh = 1;
	} else if (st && (flags & F_STATE) && state == 0 && st->polls > 0) {
		if (!(cfg->flags & CFG_ADAPT) || (st->recorded && st->recorded < st->polls))
			emit_stats(&ik, st, (__u32)id);
		st->polls = 0;
		st->raw_ns = 0;
		st->hits = 0;
		st->recorded = 0;
		fresh = 1;
	} else if (st && st->polls == 0) {
		fresh = 1; /* emptied (an elided coroutine's, CFG_ADAPT): a new one */
	}
	if (st && (cfg->flags & CFG_CHANGES)) {
		changed = !(flags & F_STATE) || state != st->state || pself != st->parent_self ||
			  pfn != st->parent_fn || (__u32)id != st->tid;
		st->state = state;
		st->parent_self = pself;
		st->parent_fn = pfn;
		st->tid = (__u32)id;
	}
	if (st)
		st->polls += 1; /* at its entry: a poll whose exit is not seen (uncovered, a panic
				 * through no probed path) counts all the same */

	__u32 recording = 1;
	if (th && (cfg->flags & CFG_CHANGES)) {
		recording = fresh || changed || !st || uncovered || (flags & F_UNCOVERED) || th->depth >= MAX_DEPTH;
		if (recording)
			emit_same_object(th, th->depth, self, id);
		if (th->depth > 0)
			flags |= F_PARENT; /* its parent's entry may have gone out as no record */
	} else if (th) {
		/* a root poll: no poll in progress on the thread */
		if (th->depth == 0) {
			__u32 n = cfg->sample_every;
			/* at random, not every Nth: a task whose polls repeat a cycle (an axum
			 * connection: 2 polls a request) would otherwise be sampled in one phase
			 * of it only, and what runs in the other never recorded */
			th->recording = n <= 1 || fresh || !st || bpf_get_prandom_u32() % n == 0;
		}
		recording = th->recording;
		if (recording && (cfg->flags & CFG_ELIDE)) {
			/* a new coroutine inside another poll is held back (see CFG_ELIDE), and
			 * while sampling a new task's first poll (CFG_HOLD_NEW); anything else
			 * recorded writes the held-back entries below it first */
			int hold = 0;
			if (th->depth < MAX_DEPTH && (flags & F_STATE) && state == 0 && !(flags & F_UNCOVERED)) {
				if (th->depth > 0)
					hold = pending_below(th, th->depth) < MAX_PEND;
				else
					hold = fresh && cfg->sample_every > 1 && (cfg->flags & CFG_HOLD_NEW);
			}
			if (hold)
				recording = 0;
			else
				emit_pending(th, th->depth, id);
		}
	}
	if (th) {
		/* an uncovered poll gets no scope: no exit will close it */
		if (!(flags & F_UNCOVERED)) {
			__u32 d = th->depth;
			if (d < MAX_DEPTH) {
				struct scope_val *sc = &th->scopes[d & (MAX_DEPTH - 1)];
				sc->sp = esp;
				sc->self = self;
				sc->ts = now;
				sc->hits = th->hits;
				sc->ret = ret;
				sc->state = state;
				sc->fn = s->fn;
				sc->recorded = recording;
				sc->state_off = s->state_off;
				sc->state_size = s->state_size;
				sc->cookie = cookie;
				sc->flags = flags;
				sc->ip = PT_REGS_IP(ctx);
				sc->elided_before = 0;
				if (!recording && (cfg->flags & CFG_ELIDE)) {
					/* held back: the coroutines elided before it go out with its
					 * entry, if it ever goes out; those inside it after it */
					sc->elided_before = th->elided > 0xffff ? 0xffff : th->elided;
					th->elided -= sc->elided_before;
				}
				th->depth = d + 1;
			} else {
				count(C_SCOPE_FULL);
			}
		}
	}
	if (!recording) {
		count(C_SKIPPED);
		return 0;
	}

	/* The unwinder samples: a slice only while the proxy has credits left
	 * (it refills them as it unwinds), so a fast program does not fill the
	 * ring with stacks nobody reads. */
	if (cfg->stack_max == 0 || cfg->credits <= 0 || __sync_fetch_and_add(&cfg->credits, -1) <= 0) {
		/* an entry without its stack: 120 bytes in place in the ring */
		struct rec *r = RESERVE(ENTRY_SIZE);
		if (!r) {
			count(C_DROPS);
			return 0;
		}
		fill_head(r, ctx, KIND_ENTRY, cookie, id, esp, now, ret);
		fill_entry(r, ctx, self, state, flags, pself, psp, pfn);
		take_elided(th, r);
		bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
		count(C_RECORDS);
		return 0;
	}

	/* an entry with a stack slice: built in the per-CPU scratch record (the
	 * slice's length is only known after reading it), then copied */
	struct rec *r = bpf_map_lookup_elem(&scratch, &zero);
	if (!r) {
		count(C_DROPS);
		return 0;
	}
	fill_head(r, ctx, KIND_ENTRY, cookie, id, esp, now, ret);
	fill_entry(r, ctx, self, state, flags, pself, psp, pfn);
	take_elided(th, r);
	/* Read up to the end of sp's page, then a page at a time: a read that
	 * fails is past the end of the stack's mapping. Each read from user memory
	 * costs ~100 ns on the benchmark's VM whatever its size: 256-byte chunks
	 * made an 8 KiB slice 32 reads (docs/speed.md, "The BPF program's cost a hit"). */
	__u32 want = cfg->stack_max;
	__u32 got = PAGE - (__u32)(sp & (PAGE - 1));
	barrier_var(got); /* keeps the bound below: the verifier needs it */
	if (got > PAGE)
		got = PAGE;
	if (bpf_probe_read_user(&r->stack[0], got, (void *)sp)) {
		got = 0;
	} else {
		for (int i = 0; i < STACK_MAX / PAGE; i++) {
			if (got >= want)
				break;
			if (bpf_probe_read_user(&r->stack[got & (STACK_MAX - 1)], PAGE, (void *)(sp + got)))
				break; /* the end of the stack's mapping */
			got += PAGE;
		}
	}
	if (got > want)
		got = want;
	r->stack_len = got;
	long size = ENTRY_SIZE + (got & (STACK_MAX * 2 - 1));
	if (size > ENTRY_SIZE + STACK_MAX)
		size = ENTRY_SIZE + STACK_MAX;
	if (bpf_ringbuf_output(&events, r, size, BPF_RB_NO_WAKEUP)) {
		count(C_RETRIES);
		if (bpf_ringbuf_output(&events, r, size, BPF_RB_NO_WAKEUP)) {
			count(C_DROPS);
			lost_with_room(size);
			if (th && (r->flags & F_ELIDED))
				th->elided += (__u32)r->rax; /* the next record carries them */
			return 0;
		}
	}
	count(C_RECORDS);
	count(C_SLICES);
	return 0;
}

/* Count sites only (see the top): the hit counted per site, nothing else. */
SEC("uprobe")
int asyncrsp_count(struct pt_regs *ctx)
{
	__u32 zero = 0;
	__u32 cookie = (__u32)bpf_get_attach_cookie(ctx);
	struct config *cfg = bpf_map_lookup_elem(&config, &zero);
	if (!cfg || cfg->flags & CFG_OFF)
		return 0;
	if (cfg->tgid && (__u32)(bpf_get_current_pid_tgid() >> 32) != cfg->tgid) {
		count(C_OTHER_PID);
		return 0;
	}
	__u64 *sh = bpf_map_lookup_elem(&site_hits, &cookie);
	if (sh)
		*sh += 1;
	return 0;
}
