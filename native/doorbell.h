/*
 * A process-private doorbell the real-time loop can sleep on together with
 * its rings (daemon-internal, not ABI): the control plane rings it when it
 * has news for the loop (a stream attached or detached, a model swapped), so
 * the loop never polls for them.
 *
 * The futex word lives in ordinary process memory; ei_wait_any's shared
 * futex calls work on it too (the kernel keys a shared futex on private
 * memory by address space and address).
 */
#ifndef EDGEINFER_DOORBELL_H
#define EDGEINFER_DOORBELL_H

#include <edgeinfer/ring.h>

typedef struct ei_doorbell {
    _Atomic uint32_t word;    /* futex word: +1 on every ring */
    _Atomic uint32_t pending; /* 1 from ring() until the loop takes it */
} ei_doorbell;

static inline int ei__doorbell_ready(const void *b) {
    return atomic_load(&((const ei_doorbell *)b)->pending) != 0;
}

static inline ei_waitable ei_doorbell_waitable(ei_doorbell *b) {
    ei_waitable w = {&b->word, NULL, ei__doorbell_ready, b, NULL}; /* no waiter count: ring() always wakes; ours: no guard */
    return w;
}

/* Control plane: there is news. */
static inline void ei_doorbell_ring(ei_doorbell *b) {
    atomic_store(&b->pending, 1);
    atomic_fetch_add(&b->word, 1);
    ei_futex_wake(&b->word);
}

/* The loop: 1 if there was news since the last take. */
static inline int ei_doorbell_take(ei_doorbell *b) { return (int)atomic_exchange(&b->pending, 0); }

#endif /* EDGEINFER_DOORBELL_H */
