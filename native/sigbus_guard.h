/*
 * SIGBUS guard for the daemon's frame-ring mappings (daemon-internal, not ABI).
 *
 * A frame ring is a memfd that its producer seals (F_SEAL_SHRINK|F_SEAL_GROW|
 * F_SEAL_SEAL) before handing the fd over, and the daemon refuses one that is
 * not sealed, so no mapping of it can lose pages: this guard is defence in
 * depth (docs/decisions/0014). Should a mapping lose pages all the same (a
 * kernel or seal assumption broken), every later read of them would raise
 * SIGBUS — in a lane's loop, in an ONNX Runtime worker reading the frame in
 * place, or in the status thread — and the default action would kill the
 * daemon and every other camera with it.
 *
 * The guard keeps a table of the consumer mappings. Its SIGBUS handler, for
 * a fault inside a registered mapping, maps anonymous zero pages over the rest
 * of that mapping (MAP_FIXED) and returns: the faulting load re-executes and
 * reads zeros. The entry is marked hit; the daemon checks the mark (one atomic
 * load), drops what it read from that ring and detaches. A fault anywhere else
 * goes to the previous handler (or the default action), as if the guard were
 * not there.
 *
 * The handler only reads the table, calls mmap (a raw system call in glibc,
 * async-signal-safe in practice though not on POSIX's list) and sigaction.
 */
#ifndef EDGEINFER_SIGBUS_GUARD_H
#define EDGEINFER_SIGBUS_GUARD_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define EI_GUARD_SLOTS 256 /* mappings guarded at once: well above the streams one daemon serves */

typedef struct ei_guard_entry {
    _Atomic uintptr_t start; /* first byte of the mapping; 0 = free entry */
    _Atomic uintptr_t end;   /* one past its last byte */
    _Atomic uint32_t hit;    /* set by the handler once it replaced pages of this mapping */
} ei_guard_entry;

static ei_guard_entry ei__guard_table[EI_GUARD_SLOTS];
static struct sigaction ei__guard_prev;     /* the disposition before ours, for faults that are not ours */
static _Atomic int ei__guard_installed;     /* 0 none, 1 installing, 2 installed */
static _Atomic uint64_t ei__guard_hits;     /* faults absorbed, process-wide */
static uintptr_t ei__guard_page_mask;       /* ~(page size - 1), set before the handler is installed */

static void ei__guard_handler(int sig, siginfo_t *si, void *uctx) {
    uintptr_t addr = (uintptr_t)si->si_addr;
    if (si->si_code > 0) { /* a real fault (not kill -BUS): is it in one of our mappings? */
        for (int i = 0; i < EI_GUARD_SLOTS; i++) {
            uintptr_t start = atomic_load(&ei__guard_table[i].start);
            uintptr_t end = atomic_load(&ei__guard_table[i].end);
            if (!start || addr < start || addr >= end) continue;
            if (atomic_load(&ei__guard_table[i].start) != start) continue; /* entry reused while we read it */
            uintptr_t page = addr & ei__guard_page_mask;
            if (mmap((void *)page, end - page, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1,
                     0) == MAP_FAILED)
                break; /* cannot absorb it: let the previous disposition have it */
            atomic_store(&ei__guard_table[i].hit, 1);
            atomic_fetch_add(&ei__guard_hits, 1);
            return; /* the faulting load re-executes on zero pages */
        }
    }
    if (ei__guard_prev.sa_flags & SA_SIGINFO) {
        ei__guard_prev.sa_sigaction(sig, si, uctx);
    } else if (ei__guard_prev.sa_handler != SIG_DFL && ei__guard_prev.sa_handler != SIG_IGN) {
        ei__guard_prev.sa_handler(sig);
    } else {
        /* Default action: restore it; a fault re-executes and terminates as it would have, a sent
         * signal is raised again (blocked until we return). */
        sigaction(sig, &ei__guard_prev, NULL);
        if (si->si_code <= 0) raise(sig);
    }
}

/* Installs the handler once per process (first guarded mapping). 0, or an errno. */
static inline int ei__guard_install(void) {
    int expected = 0;
    if (!atomic_compare_exchange_strong(&ei__guard_installed, &expected, 1)) {
        while (atomic_load(&ei__guard_installed) == 1) {
        }
        return atomic_load(&ei__guard_installed) == 2 ? 0 : EINVAL;
    }
    ei__guard_page_mask = ~(uintptr_t)(sysconf(_SC_PAGESIZE) - 1);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = ei__guard_handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, &ei__guard_prev) != 0) {
        int e = errno;
        atomic_store(&ei__guard_installed, 0);
        return e;
    }
    atomic_store(&ei__guard_installed, 2);
    return 0;
}

/* Guards [base, base + size). Returns the entry index, or -1 (errno set: table full, or the handler
 * could not be installed); the mapping then works unguarded. */
static inline int ei_guard_add(void *base, size_t size) {
    int e = ei__guard_install();
    if (e) {
        errno = e;
        return -1;
    }
    for (int i = 0; i < EI_GUARD_SLOTS; i++) {
        uintptr_t free_entry = 0;
        /* Claim by start while end is still 0 (an empty range the handler never matches), then open it. */
        if (atomic_compare_exchange_strong(&ei__guard_table[i].start, &free_entry, (uintptr_t)base)) {
            atomic_store(&ei__guard_table[i].hit, 0);
            atomic_store(&ei__guard_table[i].end, (uintptr_t)base + size);
            return i;
        }
    }
    errno = ENOSPC;
    return -1;
}

/* 1 if the handler replaced pages of this mapping (its contents are no longer the producer's). */
static inline int ei_guard_hit(int idx) {
    return idx >= 0 && idx < EI_GUARD_SLOTS && atomic_load(&ei__guard_table[idx].hit);
}

/* Stops guarding an entry. Call before munmap: once unmapped the range may be reused by other memory
 * the handler must never map over. No thread can fault in the range then: the caller unmaps only when
 * nothing refers to the memory any more. */
static inline void ei_guard_remove(int idx) {
    if (idx < 0 || idx >= EI_GUARD_SLOTS) return;
    atomic_store(&ei__guard_table[idx].end, 0); /* close the range first, then free the entry */
    atomic_store(&ei__guard_table[idx].start, 0);
}

static inline uint64_t ei_guard_hits(void) { return atomic_load(&ei__guard_hits); }

#endif /* EDGEINFER_SIGBUS_GUARD_H */
