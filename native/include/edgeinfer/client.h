/*
 * edgeinfer ring helpers for the processes at either end of the daemon: a
 * camera producer creates its frame ring as a sealed memfd and publishes
 * frames into it; a result reader reads records out of the result ring the
 * daemon handed it, and can wait on many rings (or its own futex words) at
 * once, optionally with a wake guard. The result ring's writer is here too:
 * the daemon writes every result ring, and a reader's tests use it to play
 * the daemon (tests/native/ring_helpers_test.c).
 *
 * Part of <edgeinfer/ring.h>, which is what a producer or reader includes.
 * The layout and rules are in <edgeinfer/abi.h>; handing a ring over and
 * asking for one are in <edgeinfer/handshake.h>.
 */
#ifndef EDGEINFER_CLIENT_H
#define EDGEINFER_CLIENT_H

#include <edgeinfer/abi.h>

#include <fcntl.h>
#include <linux/futex.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

/* Names newer than some libcs. */
#ifndef SYS_futex_waitv
#define SYS_futex_waitv 449
#endif
#ifndef FUTEX2_SIZE_U32
#define FUTEX2_SIZE_U32 0x02
#endif
#ifndef MFD_ALLOW_SEALING
#define MFD_ALLOW_SEALING 0x0002U
#endif

/* ------------------------------------------------------------------ */
/* Ring memory: sealed memfds                                          */
/* ------------------------------------------------------------------ */

/* Creates a memfd of `size` bytes with every page reserved now (no memory is
 * an error here, never a SIGBUS later), mapped read-write. On success the
 * caller owns *fd_out and *base_out (munmap/close). */
static inline int ei__memfd_ring(const char *label, uint64_t size, int *fd_out, uint8_t **base_out, ei_error *err) {
    *fd_out = -1;
    *base_out = NULL;
    int fd = memfd_create(label, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return ei_fail(err, EI_ERR_SYS, errno, "%s: memfd_create: %s", label, strerror(errno));
    int e = posix_fallocate(fd, 0, (off_t)size);
    if (e) {
        close(fd);
        return ei_fail(err, (e == ENOSPC || e == ENOMEM) ? EI_ERR_NOSPACE : EI_ERR_SYS, e,
                       "%s: cannot reserve %llu bytes for the ring: %s", label, (unsigned long long)size, strerror(e));
    }
    void *base = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        e = errno;
        close(fd);
        return ei_fail(err, EI_ERR_SYS, e, "%s: mmap %llu bytes: %s", label, (unsigned long long)size, strerror(e));
    }
    *fd_out = fd;
    *base_out = (uint8_t *)base;
    return EI_OK;
}

static inline int ei__seal(int fd, int seals, const char *label, ei_error *err) {
    if (fcntl(fd, F_ADD_SEALS, seals) != 0)
        return ei_fail(err, EI_ERR_SYS, errno, "%s: sealing the ring: %s", label, strerror(errno));
    return EI_OK;
}

/* Checks an fd someone handed us before anything of it is mapped: a memfd
 * (a regular, unlinked file on the kernel's internal tmpfs), carrying at
 * least `need_seals`, none of `forbid_seals`, opened read-write when
 * `need_rdwr`, and of a size between the header and max_size. Fills *size_out. */
static inline int ei_ring_fd_check(int fd, const char *name, int need_seals, int forbid_seals, int need_rdwr,
                                   uint64_t max_size, uint64_t *size_out, ei_error *err) {
    struct stat st;
    if (fstat(fd, &st) != 0) return ei_fail(err, EI_ERR_SYS, errno, "%s: fstat: %s", name, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return ei_fail(err, EI_ERR_INSECURE, 0, "%s: the fd is not a memfd (not a regular file: mode %06o)", name,
                       (unsigned)st.st_mode);
    struct statfs sf;
    if (fstatfs(fd, &sf) != 0) return ei_fail(err, EI_ERR_SYS, errno, "%s: fstatfs: %s", name, strerror(errno));
    if (sf.f_type != TMPFS_MAGIC)
        return ei_fail(err, EI_ERR_INSECURE, 0, "%s: the fd is not a memfd (file system type 0x%lx; hugetlbfs and "
                       "disk files are refused)", name, (unsigned long)sf.f_type);
    if (st.st_nlink != 0)
        return ei_fail(err, EI_ERR_INSECURE, 0, "%s: the fd is a named file (%lu links), not a memfd: anyone who can "
                       "open the name could write or resize it", name, (unsigned long)st.st_nlink);
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0)
        return ei_fail(err, EI_ERR_INSECURE, 0, "%s: the fd cannot be sealed (not a memfd): %s", name, strerror(errno));
    if ((seals & need_seals) != need_seals)
        return ei_fail(err, EI_ERR_INSECURE, 0, "%s: the memfd is not sealed (seals 0x%x, need 0x%x: "
                       "F_SEAL_SHRINK|F_SEAL_GROW|F_SEAL_SEAL%s)", name, (unsigned)seals, (unsigned)need_seals,
                       (need_seals & F_SEAL_FUTURE_WRITE) ? "|F_SEAL_FUTURE_WRITE" : "");
    if (seals & forbid_seals)
        return ei_fail(err, EI_ERR_INSECURE, 0, "%s: the memfd is write-sealed (seals 0x%x): its producer could not "
                       "write frames into it", name, (unsigned)seals);
    if (need_rdwr) {
        int fl = fcntl(fd, F_GETFL);
        if (fl < 0 || (fl & O_ACCMODE) != O_RDWR)
            return ei_fail(err, EI_ERR_INSECURE, 0, "%s: the fd is not open read-write", name);
    }
    if ((uint64_t)st.st_size < EI_HEADER_SIZE)
        return ei_fail(err, EI_ERR_TRUNCATED, 0, "%s: %llu bytes, smaller than the %u-byte header", name,
                       (unsigned long long)st.st_size, EI_HEADER_SIZE);
    if ((uint64_t)st.st_size > max_size)
        return ei_fail(err, EI_ERR_GEOMETRY, 0, "%s: %llu bytes, larger than the %llu-byte limit for a ring", name,
                       (unsigned long long)st.st_size, (unsigned long long)max_size);
    *size_out = (uint64_t)st.st_size;
    return EI_OK;
}

/* Maps a checked ring fd: read-write (a frame ring's consumer writes its claim
 * in the header) or read-only (a result ring's reader). The caller owns the
 * mapping (munmap(*base_out, size)); the fd stays the caller's. */
static inline int ei_ring_map(int fd, uint64_t size, int writable, const char *name, uint8_t **base_out,
                              ei_error *err) {
    void *base = mmap(NULL, (size_t)size, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        *base_out = NULL;
        return ei_fail(err, EI_ERR_SYS, errno, "%s: mmap %llu bytes%s: %s", name, (unsigned long long)size,
                       writable ? " read-write" : " read-only", strerror(errno));
    }
    *base_out = (uint8_t *)base;
    return EI_OK;
}

/* ------------------------------------------------------------------ */
/* Frame ring: producer                                                */
/* ------------------------------------------------------------------ */

typedef struct ei_frame_producer {
    int fd;                    /* owns: the sealed memfd; hand a copy to the daemon (ei_ingress) */
    uint8_t *base;             /* owns: read-write mapping of the whole ring */
    ei_frame_ring_header *hdr; /* borrowed: == base */
    ei_frame_layout layout;    /* what we created; never re-read from shared memory */
    uint64_t next_seq;         /* seq the next publish gets (1-based) */
    uint32_t latest_slot;      /* slot of our last publish, EI_NO_SLOT before the first */
    uint32_t writing;          /* slot reserved by begin(), EI_NO_SLOT if none */
    uint32_t cursor;           /* where the next slot search starts (round robin) */
} ei_frame_producer;

/* Counts the frame rings this process created (per file that includes ring.h: it is header-only), for the
 * header's `generation`: 1 for the first ring, 2 for the next (after a geometry change, say), ... A producer
 * that counts otherwise (across its own restarts) stores its number in hdr->generation before handing over. */
static inline uint32_t ei__rings_created(void) {
    static _Atomic uint32_t created = 0;
    return atomic_fetch_add(&created, 1) + 1;
}

/* Creates a frame ring as a sealed memfd (`label` names it in /proc/PID/fd).
 * Its size is sealed before anyone else sees it, so it can never shrink under
 * a mapping. Nothing is shared yet: hand p->fd to the daemon with ei_ingress. */
static inline int ei_frame_producer_create(ei_frame_producer *p, const char *label, const ei_frame_geometry *g,
                                           ei_error *err) {
    memset(p, 0, sizeof *p);
    p->fd = -1;
    ei_frame_layout l;
    int rc = ei_frame_layout_from_geometry(g, &l, label, err);
    if (rc) return rc;
    uint8_t *base;
    int fd;
    rc = ei__memfd_ring(label, l.total_size, &fd, &base, err);
    if (rc) return rc;
    ei_frame_ring_header *h = (ei_frame_ring_header *)base;
    memcpy(h->magic, EI_FRAME_MAGIC, 8);
    h->abi_version = EI_ABI_VERSION;
    h->header_size = EI_HEADER_SIZE;
    h->total_size = l.total_size;
    h->slot_count = l.slot_count;
    h->slot_header_size = EI_SLOT_HEADER_SIZE;
    h->slot_stride = l.slot_stride;
    h->payload_capacity = l.payload_capacity;
    h->width = l.width;
    h->height = l.height;
    h->channels = l.channels;
    h->pixel_format = l.pixel_format;
    h->row_stride = l.row_stride;
    h->colorimetry = l.colorimetry;
    /* The consumer's line too is the producer's to initialise: `claimed` must say "no slot" (a zero would
     * be a claim of slot 0) before anyone sees the ring. */
    atomic_store(&h->claimed, EI_NO_SLOT);
    atomic_store(&h->producer_pid, (uint32_t)getpid());
    atomic_store(&h->generation, ei__rings_created());
    rc = ei__seal(fd, EI_FRAME_SEALS, label, err);
    if (rc) {
        munmap(base, l.total_size);
        close(fd);
        return rc;
    }
    p->fd = fd;
    p->base = base;
    p->hdr = h;
    p->layout = l;
    p->next_seq = 1;
    p->latest_slot = EI_NO_SLOT;
    p->writing = EI_NO_SLOT;
    return EI_OK;
}

/* Reserves a slot to write the next frame into and returns its payload.
 * Never blocks: with >= 3 slots one is neither claimed nor latest. */
static inline uint8_t *ei_frame_producer_begin(ei_frame_producer *p) {
    if (p->writing != EI_NO_SLOT) return ei_frame_payload(p->base, &p->layout, p->writing);
    const uint32_t n = p->layout.slot_count;
    for (;;) {
        uint32_t claimed = atomic_load(&p->hdr->claimed);
        uint32_t s = p->cursor;
        for (uint32_t i = 0; i < n; i++, s = (s + 1) % n)
            if (s != claimed && s != p->latest_slot) break;
        ei_frame_slot_header *sh = ei_frame_slot(p->base, &p->layout, s);
        uint64_t old = atomic_load(&sh->word);
        /* Dekker: announce WRITING, then re-check the claim (both seq_cst). */
        atomic_store(&sh->word, (old & ~(uint64_t)0xff) | EI_SLOT_WRITING);
        if (atomic_load(&p->hdr->claimed) == s) {
            /* The consumer claimed it meanwhile and may hold it: give it back untouched. */
            atomic_store(&sh->word, old);
            atomic_fetch_add_explicit(&p->hdr->producer_backoffs, 1, memory_order_relaxed);
            continue;
        }
        p->writing = s;
        p->cursor = (s + 1) % n;
        return ei_frame_payload(p->base, &p->layout, s);
    }
}

/* Publishes the slot reserved by begin() whatever its payload_len says: no check. Internal (and the tool of
 * tests that play a broken producer); a camera calls ei_frame_producer_publish. */
static inline int64_t ei__frame_producer_commit(ei_frame_producer *p, uint64_t capture_mono_ns,
                                                uint64_t capture_real_ns, uint64_t frame_id, uint64_t payload_len) {
    uint32_t s = p->writing;
    if (s == EI_NO_SLOT) return EI_ERR_STATE;
    ei_frame_slot_header *sh = ei_frame_slot(p->base, &p->layout, s);
    uint64_t seq = p->next_seq++;
    sh->capture_mono_ns = capture_mono_ns;
    sh->capture_real_ns = capture_real_ns;
    sh->frame_id = frame_id;
    sh->payload_len = payload_len < p->layout.payload_capacity ? payload_len : p->layout.payload_capacity;
    atomic_store(&sh->word, seq << 8 | EI_SLOT_READY);
    /* `published` first: a consumer that sees `latest` = seq also sees published >= seq, so a
     * `latest` ahead of `published` can only be a lie, never a race. */
    atomic_store(&p->hdr->published, seq);
    atomic_store(&p->hdr->latest, seq << 8 | s);
    /* Dekker with the sleeping consumer: bump the bell, then look for waiters. */
    atomic_fetch_add(&p->hdr->doorbell, 1);
    if (atomic_load(&p->hdr->waiters)) ei_futex_wake(&p->hdr->doorbell);
    p->latest_slot = s;
    p->writing = EI_NO_SLOT;
    return (int64_t)seq;
}

/* Publishes the slot reserved by begin(). payload_len must be the whole frame, ei_frame_bytes(&p->layout)
 * (ei_frame_payload_len: nv12/i420 take height * 3 / 2 rows). Returns the frame's seq (> 0), or a negative
 * ei_status and publishes nothing: EI_ERR_ARG when payload_len is not the frame's length (the slot stays
 * reserved: fill the frame and publish again with the right length), EI_ERR_STATE when nothing was reserved. */
static inline int64_t ei_frame_producer_publish(ei_frame_producer *p, uint64_t capture_mono_ns,
                                                uint64_t capture_real_ns, uint64_t frame_id, uint64_t payload_len) {
    if (p->writing == EI_NO_SLOT) return EI_ERR_STATE;
    if (payload_len != ei_frame_bytes(&p->layout)) return EI_ERR_ARG;
    return ei__frame_producer_commit(p, capture_mono_ns, capture_real_ns, frame_id, payload_len);
}

/* Marks the ring closed: its consumer sees it at once. Keeps the mapping. */
static inline void ei_frame_producer_retire(ei_frame_producer *p) {
    if (!p->base) return;
    atomic_fetch_or(&p->hdr->flags, EI_RING_CLOSED);
    atomic_fetch_add(&p->hdr->doorbell, 1);
    ei_futex_wake(&p->hdr->doorbell);
}

/* retire(), then unmap and close the memfd. The daemon keeps its own mapping
 * until it drops the stream. */
static inline void ei_frame_producer_close(ei_frame_producer *p) {
    if (!p->base) return;
    ei_frame_producer_retire(p);
    munmap(p->base, p->layout.total_size);
    close(p->fd);
    p->base = NULL;
    p->hdr = NULL;
    p->fd = -1;
}

/* ------------------------------------------------------------------ */
/* Waiting on many rings at once                                       */
/* ------------------------------------------------------------------ */

struct ei_futex_waitv { /* the kernel's struct futex_waitv (Linux >= 5.16) */
    uint64_t val;
    uint64_t uaddr;
    uint32_t flags;
    uint32_t reserved;
};

/* A consumer's defence against a ring whose writer rings the doorbell without news (a camera that
 * wants to keep the consumer's CPU busy with wake-ups). More than EI_SPURIOUS_LIMIT wakes without news
 * within EI_SPURIOUS_WINDOW_NS, and ei_wait_any stops sleeping on that doorbell for EI_MUTE_NS: it
 * looks at the ring every EI_MUTED_POLL_NS instead. So that ring's own frames are seen up to 1 ms late
 * meanwhile, and nobody else's are. An honest producer wakes once per frame: it would need 3,200
 * frames/s to be muted. The caller keeps one guard per ring, across calls. */
#define EI_SPURIOUS_LIMIT 32u
#define EI_SPURIOUS_WINDOW_NS 10000000ull /* 10 ms */
#define EI_MUTE_NS 100000000ull           /* 100 ms */
#define EI_MUTED_POLL_NS 1000000ull       /* 1 ms */

typedef struct ei_wake_guard {
    uint64_t window_start_ns; /* start of the current counting window (CLOCK_MONOTONIC) */
    uint64_t muted_until_ns;  /* not slept on before this time; 0 = never muted */
    uint64_t mutes;           /* times muted: for the caller's counters */
    uint32_t spurious;        /* wakes without news in the current window */
    uint32_t reserved;
} ei_wake_guard;

/* Anything whose readiness can be waited for: a doorbell, a waiter counter and a predicate. */
typedef struct ei_waitable {
    const _Atomic uint32_t *doorbell; /* borrowed: futex word (shared, or private to the process) */
    _Atomic uint32_t *waiters;        /* borrowed: waiter counter next to it, or NULL (a read-only ring) */
    int (*ready)(const void *);       /* true when the caller has something to do */
    const void *obj;                  /* borrowed: argument of ready() */
    ei_wake_guard *guard;             /* borrowed: the caller's guard for this ring, or NULL (a trusted writer) */
} ei_waitable;

static inline void ei__wake_guard_note(ei_wake_guard *g, uint64_t now) {
    if (now - g->window_start_ns > EI_SPURIOUS_WINDOW_NS) {
        g->window_start_ns = now;
        g->spurious = 0;
    }
    if (++g->spurious > EI_SPURIOUS_LIMIT) {
        g->muted_until_ns = now + EI_MUTE_NS;
        g->spurious = 0;
        g->mutes++;
    }
}

static inline uint64_t ei__ready_mask(const ei_waitable *w, uint32_t n) {
    uint64_t mask = 0;
    for (uint32_t i = 0; i < n; i++)
        if (w[i].ready(w[i].obj)) mask |= 1ull << i;
    return mask;
}

/* Sleeps until `until`, on the doorbells of w[i] for the i in `slept` (none: a plain sleep). */
static inline void ei__sleep_on(const ei_waitable *w, uint32_t n, uint64_t slept, const uint32_t *bell,
                                uint64_t now, uint64_t until, int use_waitv) {
    static _Atomic int waitv_missing = 0;
    struct ei_futex_waitv fw[EI_MAX_WAIT];
    uint32_t idx[EI_MAX_WAIT], m = 0;
    for (uint32_t i = 0; i < n; i++)
        if (slept >> i & 1) idx[m++] = i;
    if (m == 0) {
        struct timespec ts = {(time_t)(until / 1000000000ull), (long)(until % 1000000000ull)};
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
    } else if (m == 1) {
        ei_futex_wait(w[idx[0]].doorbell, bell[idx[0]], until - now);
    } else if (use_waitv && !atomic_load_explicit(&waitv_missing, memory_order_relaxed)) {
        for (uint32_t k = 0; k < m; k++) {
            fw[k].val = bell[idx[k]];
            fw[k].uaddr = (uint64_t)(uintptr_t)w[idx[k]].doorbell;
            fw[k].flags = FUTEX2_SIZE_U32; /* shared: no FUTEX2_PRIVATE */
            fw[k].reserved = 0;
        }
        struct timespec ts = {(time_t)(until / 1000000000ull), (long)(until % 1000000000ull)};
        if (syscall(SYS_futex_waitv, fw, m, 0, &ts, CLOCK_MONOTONIC) < 0 && errno == ENOSYS)
            atomic_store_explicit(&waitv_missing, 1, memory_order_relaxed);
    } else {
        /* Fallback: sleep on each ring in turn for a short slice. */
        uint64_t slice = 1000000ull / m + 1;
        if (slice > until - now) slice = until - now;
        for (uint32_t k = 0; k < m && !ei__ready_mask(w, n); k++) ei_futex_wait(w[idx[k]].doorbell, bell[idx[k]], slice);
    }
}

/* Waits until at least one of w[0..n) is ready, at most timeout_ns, first
 * spinning up to spin_ns. Returns a bitmask of the ready ones (0 = timed out).
 * use_waitv = 0 forces the fallback (per-ring timed waits in 1 ms slices),
 * which is also used automatically when the kernel lacks futex_waitv.
 * A ring with a guard that rings without news is muted (ei_wake_guard). */
static inline uint64_t ei_wait_any(const ei_waitable *w, uint32_t n, uint64_t timeout_ns, uint64_t spin_ns,
                                   int use_waitv) {
    if (n == 0 || n > EI_MAX_WAIT) return 0;
    uint64_t mask = ei__ready_mask(w, n);
    if (mask) return mask;
    uint64_t now = ei_now_ns(CLOCK_MONOTONIC);
    const uint64_t deadline = now + timeout_ns;
    if (spin_ns) {
        const uint64_t spin_end = now + (spin_ns < timeout_ns ? spin_ns : timeout_ns);
        while (!(mask = ei__ready_mask(w, n))) {
            ei_cpu_relax();
            if (ei_now_ns(CLOCK_MONOTONIC) >= spin_end) break;
        }
        if (mask) return mask;
    }
    uint32_t bell[EI_MAX_WAIT];
    for (;;) {
        /* The doorbells slept on this round: all but the muted ones. */
        now = ei_now_ns(CLOCK_MONOTONIC);
        uint64_t slept = 0;
        for (uint32_t i = 0; i < n; i++)
            if (!w[i].guard || w[i].guard->muted_until_ns <= now) slept |= 1ull << i;
        const uint64_t all = n == 64 ? ~0ull : (1ull << n) - 1;
        /* Dekker with the producer: count ourselves as waiting, read the bells, re-check. (A read-only
         * ring has no counter: its writer wakes on every commit while readers are connected.) */
        for (uint32_t i = 0; i < n; i++)
            if ((slept >> i & 1) && w[i].waiters) atomic_fetch_add(w[i].waiters, 1);
        for (uint32_t i = 0; i < n; i++) bell[i] = atomic_load(w[i].doorbell);
        mask = ei__ready_mask(w, n);
        if (!mask && now < deadline) {
            uint64_t until = deadline;
            if (slept != all && now + EI_MUTED_POLL_NS < until) until = now + EI_MUTED_POLL_NS;
            ei__sleep_on(w, n, slept, bell, now, until, use_waitv);
        }
        for (uint32_t i = 0; i < n; i++)
            if ((slept >> i & 1) && w[i].waiters) atomic_fetch_sub(w[i].waiters, 1);
        if (mask) return mask;
        mask = ei__ready_mask(w, n);
        now = ei_now_ns(CLOCK_MONOTONIC);
        for (uint32_t i = 0; i < n; i++) /* rang, and nothing to do: count it against that ring */
            if ((slept >> i & 1) && w[i].guard && !(mask >> i & 1) && atomic_load(w[i].doorbell) != bell[i])
                ei__wake_guard_note(w[i].guard, now);
        if (mask || now >= deadline) return mask;
    }
}

/* ------------------------------------------------------------------ */
/* Result ring: one writer, any number of read-only readers (seqlock)  */
/* ------------------------------------------------------------------ */

typedef struct ei_result_writer {
    int fd;                     /* owns: the sealed memfd; readers get copies of it */
    uint8_t *base;              /* owns: the one read-write mapping (made before sealing) */
    ei_result_ring_header *hdr; /* borrowed: == base */
    ei_result_layout layout;    /* what we created */
    uint64_t head;              /* number of our last record; private, never read back */
    _Atomic int wake;           /* FUTEX_WAKE on every commit: set while any reader is connected */
} ei_result_writer;

/* Creates a result ring as a memfd, maps it read-write, initialises it and
 * then seals it: no mapping made from now on can write it (F_SEAL_FUTURE_WRITE),
 * and its size is fixed. Hand readers copies of wr->fd. */
static inline int ei_result_writer_create(ei_result_writer *wr, const char *label, uint32_t record_count,
                                          uint64_t payload_capacity, uint32_t generation, ei_error *err) {
    memset(wr, 0, sizeof *wr);
    wr->fd = -1;
    ei_result_layout l;
    int rc = ei_result_layout_make(record_count, payload_capacity, &l, label, err);
    if (rc) return rc;
    uint8_t *base;
    int fd;
    rc = ei__memfd_ring(label, l.total_size, &fd, &base, err);
    if (rc) return rc;
    ei_result_ring_header *h = (ei_result_ring_header *)base;
    memcpy(h->magic, EI_RESULT_MAGIC, 8);
    h->abi_version = EI_ABI_VERSION;
    h->header_size = EI_HEADER_SIZE;
    h->total_size = l.total_size;
    h->record_count = l.record_count;
    h->record_header_size = EI_RECORD_HEADER_SIZE;
    h->record_stride = l.record_stride;
    h->payload_capacity = l.payload_capacity;
    atomic_store(&h->writer_pid, (uint32_t)getpid());
    atomic_store(&h->generation, generation);
    rc = ei__seal(fd, EI_RESULT_SEALS, label, err);
    /* Owner-read only: reopening it through /proc/PID/fd gives another user nothing (the seals already
     * forbid every write; this is defence in depth). */
    if (rc == EI_OK && fchmod(fd, 0400) != 0) rc = ei_fail(err, EI_ERR_SYS, errno, "%s: fchmod: %s", label, strerror(errno));
    if (rc) {
        munmap(base, l.total_size);
        close(fd);
        return rc;
    }
    wr->fd = fd;
    wr->base = base;
    wr->hdr = h;
    wr->layout = l;
    return EI_OK;
}

/* Opens the next record for writing: marks it busy (odd seqlock) and returns
 * its header; the caller fills header fields and payload, then commits. */
static inline ei_result_record_header *ei_result_writer_begin(ei_result_writer *wr) {
    uint64_t n = wr->head + 1;
    ei_result_record_header *r = ei_result_record(wr->base, &wr->layout, n);
    atomic_store_explicit(&r->seqlock, n << 1 | 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release); /* the odd mark is visible before any body store */
    return r;
}

static inline uint8_t *ei_result_payload(ei_result_record_header *r) { return (uint8_t *)r + EI_RECORD_HEADER_SIZE; }

static inline uint64_t ei_result_writer_commit(ei_result_writer *wr, ei_result_record_header *r) {
    uint64_t n = ++wr->head;
    if (r->payload_len > wr->layout.payload_capacity) r->payload_len = (uint32_t)wr->layout.payload_capacity;
    atomic_store_explicit(&r->seqlock, n << 1, memory_order_release);
    atomic_store(&wr->hdr->head, n);
    atomic_fetch_add(&wr->hdr->doorbell, 1);
    /* Readers cannot count themselves (they never write): wake whenever anyone may be listening. */
    if (atomic_load_explicit(&wr->wake, memory_order_relaxed)) ei_futex_wake(&wr->hdr->doorbell);
    return n;
}

/* Marks the ring closed and wakes its readers. Does not unmap or close. */
static inline void ei_result_writer_retire(ei_result_writer *wr) {
    if (!wr->base) return;
    atomic_fetch_or(&wr->hdr->flags, EI_RING_CLOSED);
    atomic_fetch_add(&wr->hdr->doorbell, 1);
    ei_futex_wake(&wr->hdr->doorbell);
}

typedef struct ei_result_reader {
    const uint8_t *base;              /* borrowed: read-only mapping owned by the caller */
    const ei_result_ring_header *hdr; /* borrowed: == base */
    ei_result_layout layout;          /* private validated copy */
    uint64_t next;                    /* number of the next record to read */
    uint64_t missed;                  /* records overwritten before we read them, in total */
    uint32_t seen_flags;              /* ring flags already reported */
} ei_result_reader;

/* Starts reading a result ring already checked (ei_ring_fd_check with
 * EI_RESULT_SEALS: nobody but the daemon's own mapping can write it) and
 * mapped read-only. from_oldest: start at the oldest record still held, else
 * at the next one written. */
static inline int ei_result_reader_init(ei_result_reader *rd, const uint8_t *base, uint64_t size, const char *name,
                                        int from_oldest, ei_error *err) {
    memset(rd, 0, sizeof *rd);
    int rc = ei_result_ring_check(base, size, name, &rd->layout, err);
    if (rc) return rc;
    rd->base = base;
    rd->hdr = (const ei_result_ring_header *)base;
    uint64_t head = atomic_load(&rd->hdr->head);
    uint64_t oldest = head > rd->layout.record_count ? head - rd->layout.record_count + 1 : 1;
    rd->next = from_oldest ? oldest : head + 1;
    return EI_OK;
}

static inline int ei_result_reader_ready(const ei_result_reader *rd) {
    return atomic_load_explicit(&rd->hdr->head, memory_order_acquire) >= rd->next ||
           atomic_load_explicit(&rd->hdr->flags, memory_order_acquire) != rd->seen_flags;
}

static inline int ei__result_ready_cb(const void *r) { return ei_result_reader_ready((const ei_result_reader *)r); }

static inline ei_waitable ei_result_waitable(ei_result_reader *rd) {
    ei_waitable w = {&rd->hdr->doorbell, NULL, ei__result_ready_cb, rd, NULL}; /* no waiter count: read-only */
    return w;
}

/* Record numbers above this cannot be honest: the seqlock word holds n << 1. */
#define EI_MAX_RECORD_NUMBER (UINT64_C(1) << 62)

/* Copies the next record (header + payload_len bytes of payload) into hdr_out
 * and payload_out (payload_cap bytes). Returns 1 when a record was copied, 0
 * when none is available yet (or the writer overwrote every candidate while we
 * looked: call again), -1 when `head` is corrupt (beyond EI_MAX_RECORD_NUMBER,
 * or behind what was already read), EI_ERR_BUFFER when the record's payload
 * does not fit payload_cap: the record is read and consumed, hdr_out is whole
 * (its payload_len says the record's real length) but only the first
 * payload_cap bytes of the payload were copied. A buffer of
 * rd->layout.payload_capacity bytes never gets EI_ERR_BUFFER. *missed_out gets
 * how many records were overwritten before this one could be read (also added
 * to rd->missed). Bounded: a writer can make it return 0, never spin forever. */
static inline int ei_result_reader_next(ei_result_reader *rd, ei_result_record_header *hdr_out, uint8_t *payload_out,
                                        uint64_t payload_cap, uint64_t *missed_out) {
    *missed_out = 0;
    for (uint64_t tries = 0; tries <= (uint64_t)rd->layout.record_count + 2; tries++) {
        uint64_t head = atomic_load_explicit(&rd->hdr->head, memory_order_acquire);
        if (head > EI_MAX_RECORD_NUMBER || head + 1 < rd->next) return -1;
        if (head < rd->next) return 0;
        /* Records older than head - count + 2 may be mid-overwrite: skip ahead. */
        if (head - rd->next + 1 >= rd->layout.record_count) {
            uint64_t skip_to = head - rd->layout.record_count + 2;
            *missed_out += skip_to - rd->next;
            rd->missed += skip_to - rd->next;
            rd->next = skip_to;
        }
        uint64_t n = rd->next;
        const ei_result_record_header *r =
            ei_result_record((uint8_t *)(uintptr_t)rd->base, &rd->layout, n); /* read-only despite the cast */
        uint64_t s1 = atomic_load_explicit(&r->seqlock, memory_order_acquire);
        if (s1 != n << 1) {
            /* Head says n is complete, so a different word means a newer lap overwrote it. */
            *missed_out += 1;
            rd->missed += 1;
            rd->next = n + 1;
            continue;
        }
        memcpy(hdr_out, r, sizeof *hdr_out);
        uint64_t len = hdr_out->payload_len;
        /* The writer never commits more than the capacity; a mapping is never read past it either way. */
        if (len > rd->layout.payload_capacity) len = rd->layout.payload_capacity;
        memcpy(payload_out, (const uint8_t *)r + EI_RECORD_HEADER_SIZE, len > payload_cap ? payload_cap : len);
        atomic_thread_fence(memory_order_acquire); /* copies complete before the re-check */
        uint64_t s2 = atomic_load_explicit(&r->seqlock, memory_order_relaxed);
        if (s2 != s1) continue; /* overwritten while copying: retry, the lap check counts it */
        hdr_out->payload_len = (uint32_t)len;
        rd->next = n + 1;
        return len > payload_cap ? EI_ERR_BUFFER : 1;
    }
    return 0;
}

#endif /* EDGEINFER_CLIENT_H */
