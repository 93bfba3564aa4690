/*
 * The frame ring's consumer (daemon-internal, not installed): exactly one per
 * ring, and that one is the daemon. It claims the newest frame (the
 * consumer's half of the claim protocol in <edgeinfer/abi.h>; the producer's
 * half is ei_frame_producer_begin in <edgeinfer/client.h>), accounts for every
 * frame it takes or refuses, and offers the ring to ei_wait_any. Used by
 * native/ring.pyx (through ring_h.pxd), native/lanes.h and the fuzz harness
 * tests/reliability/fuzz_ring.c. A producer or reader never needs it: a
 * second consumer of a ring handed to the daemon would break the claim.
 */
#ifndef EDGEINFER_CONSUMER_H
#define EDGEINFER_CONSUMER_H

#include <edgeinfer/abi.h>
#include <edgeinfer/client.h>

#include <sys/mman.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* Frame ring: consumer (exactly one per ring: the daemon)             */
/* ------------------------------------------------------------------ */

typedef struct ei_frame_consumer {
    uint8_t *base;             /* borrowed: mapping owned by the caller (header RW, slots read-only) */
    ei_frame_ring_header *hdr; /* borrowed: == base */
    ei_frame_layout layout;    /* private validated copy */
    uint64_t last_seq;         /* seq of the last frame taken (acquired or refused as short) */
    uint64_t seen_latest;      /* the `latest` word last consumed: only a different word is news */
    uint64_t pending_since_ns; /* CLOCK_MONOTONIC when the consumer first saw news, 0 = none pending */
    uint32_t held;             /* slot we hold, EI_NO_SLOT if none */
    uint32_t seen_flags;       /* ring flags already reported to the caller */
} ei_frame_consumer;

/* Metadata of an acquired frame (copied out of the slot header). */
typedef struct ei_frame_info {
    uint64_t seq;
    uint64_t capture_mono_ns;
    uint64_t capture_real_ns;
    uint64_t frame_id;
    uint64_t payload_len;
    uint64_t pending_since_ns; /* when the consumer first saw news (the daemon's own arrival time) */
    uint32_t slot;
    uint32_t generation;
} ei_frame_info;

/* Starts consuming a ring already checked (ei_ring_fd_check) and mapped
 * read-write (ei_ring_map): validates the header into a private layout and
 * makes the slots read-only to us. Leaves the consumer's line of the header as
 * it is: the daemon's lanes (several processes taking turns on one ring) join
 * it this way, with others possibly asleep on it (counted in `waiters`). */
static inline int ei_frame_consumer_join(ei_frame_consumer *c, uint8_t *base, uint64_t size, const char *name,
                                         ei_error *err) {
    memset(c, 0, sizeof *c);
    int rc = ei_frame_ring_check(base, size, name, &c->layout, err);
    if (rc) return rc;
    /* Frames are read-only to the consumer: a stray write faults instead of corrupting them. */
    if (mprotect(base + EI_HEADER_SIZE, (size_t)size - EI_HEADER_SIZE, PROT_READ) != 0)
        return ei_fail(err, EI_ERR_SYS, errno, "%s: mprotect: %s", name, strerror(errno));
    c->base = base;
    c->hdr = (ei_frame_ring_header *)base;
    c->held = EI_NO_SLOT;
    return EI_OK;
}

/* Where a consumer that adopts a ring (a restarted daemon, or a producer
 * handing the same ring over again) starts counting: after `consumed`, the
 * last frame an earlier consumer of this ring took or refused. Frames up to it
 * were that consumer's to account for and are not counted again; the ones
 * published after it, which nobody took, are counted once, as skipped, by the
 * adopter when it takes its first frame. A `consumed` beyond `published` was
 * not written by a consumer: ignored (counted from the ring's first frame). */
static inline void ei_frame_consumer_resume(ei_frame_consumer *c) {
    uint64_t consumed = atomic_load(&c->hdr->consumed);
    uint64_t latest = atomic_load(&c->hdr->latest);
    if (consumed > atomic_load(&c->hdr->published)) consumed = 0;
    c->last_seq = consumed;
    c->seen_latest = consumed != 0 && latest >> 8 == consumed ? latest : 0; /* already consumed: not news */
}

/* ei_frame_consumer_join, then drops whatever a previous consumer (a process
 * that died) left in the consumer's line: the one consumer of a ring. Carries
 * on counting from where it stopped (ei_frame_consumer_resume). */
static inline int ei_frame_consumer_init(ei_frame_consumer *c, uint8_t *base, uint64_t size, const char *name,
                                         ei_error *err) {
    int rc = ei_frame_consumer_join(c, base, size, name, err);
    if (rc) return rc;
    atomic_store(&c->hdr->claimed, EI_NO_SLOT);
    atomic_store(&c->hdr->waiters, 0);
    atomic_store(&c->hdr->consumer_pid, (uint32_t)getpid());
    ei_frame_consumer_resume(c);
    return EI_OK;
}

/* Something new for the caller: a `latest` word not consumed yet, or a flag change. */
static inline int ei_frame_consumer_ready(const ei_frame_consumer *c) {
    uint64_t latest = atomic_load_explicit(&c->hdr->latest, memory_order_acquire);
    return (latest != 0 && latest != c->seen_latest) ||
           atomic_load_explicit(&c->hdr->flags, memory_order_acquire) != c->seen_flags;
}

/* Records the daemon's own arrival time of news (for deadlines that a
 * producer's clock cannot buy): the first time news is seen since the last
 * acquire. Returns the pending-since time, 0 if nothing is pending. */
static inline uint64_t ei_frame_consumer_note(ei_frame_consumer *c, uint64_t now_ns) {
    uint64_t latest = atomic_load_explicit(&c->hdr->latest, memory_order_acquire);
    if (latest == 0 || latest == c->seen_latest) return 0;
    if (!c->pending_since_ns) c->pending_since_ns = now_ns;
    return c->pending_since_ns;
}

/* Claims the newest complete frame if `latest` changed since the last look.
 * Returns 1 (claimed, *out filled), 0 (nothing new), EI_ERR_STATE (already
 * holding one), EI_ERR_SHORT (the frame's payload_len is short: skipped, with
 * *out filled except for the slot) or EI_ERR_CORRUPT (the producer wrote a
 * `latest` that names no published frame: skipped). A bad word is consumed
 * once: it is never retried, and it never stops the frames after it. */
static inline int ei_frame_consumer_acquire(ei_frame_consumer *c, ei_frame_info *out) {
    if (c->held != EI_NO_SLOT) return EI_ERR_STATE;
    ei_frame_ring_header *h = c->hdr;
    uint64_t latest = atomic_load(&h->latest);
    for (int tries = 0;; tries++) {
        if (latest == 0 || latest == c->seen_latest) return 0;
        c->seen_latest = latest;
        out->pending_since_ns = c->pending_since_ns;
        c->pending_since_ns = 0;
        uint64_t seq = latest >> 8;
        uint32_t slot = (uint32_t)(latest & 0xff);
        /* `published` is stored before `latest`: a seq beyond it was never published. */
        if (slot >= c->layout.slot_count || seq > atomic_load(&h->published)) return EI_ERR_CORRUPT;
        if (seq <= c->last_seq) {
            /* Backwards: never honest. Resynchronise so that the frames after it are served. */
            c->last_seq = seq;
            atomic_store_explicit(&h->consumed, seq, memory_order_relaxed);
            return EI_ERR_CORRUPT;
        }
        /* Dekker: announce the claim, then check the slot still holds `seq` (both seq_cst). */
        atomic_store(&h->claimed, slot);
        ei_frame_slot_header *sh = ei_frame_slot(c->base, &c->layout, slot);
        if (atomic_load(&sh->word) == (seq << 8 | EI_SLOT_READY)) {
            uint64_t len = sh->payload_len;
            out->seq = seq;
            out->capture_mono_ns = sh->capture_mono_ns;
            out->capture_real_ns = sh->capture_real_ns;
            out->frame_id = sh->frame_id;
            out->payload_len = len;
            out->slot = slot;
            out->generation = atomic_load_explicit(&h->generation, memory_order_relaxed);
            c->last_seq = seq;
            /* Accounted for from here on (taken, or refused below): a consumer adopting the ring after us
             * starts after it (ei_frame_consumer_resume). Relaxed: that consumer comes after a syscall. */
            atomic_store_explicit(&h->consumed, seq, memory_order_relaxed);
            if (len > c->layout.payload_capacity) {
                atomic_store(&h->claimed, EI_NO_SLOT);
                return EI_ERR_CORRUPT;
            }
            if (len < ei_frame_bytes(&c->layout)) {
                atomic_store(&h->claimed, EI_NO_SLOT);
                return EI_ERR_SHORT;
            }
            c->held = slot;
            atomic_fetch_add_explicit(&h->claims, 1, memory_order_relaxed);
            return 1;
        }
        /* The slot no longer holds `seq`. An honest producer only rewrites it after publishing a newer
         * frame, so `latest` has moved on (seq_cst: its store precedes the WRITING store we saw): take
         * that one. A `latest` that did not move names a frame that is not there: a lie. */
        atomic_store(&h->claimed, EI_NO_SLOT);
        atomic_fetch_add_explicit(&h->claim_retries, 1, memory_order_relaxed);
        uint64_t again = atomic_load(&h->latest);
        if (again == latest || tries >= 1000) return EI_ERR_CORRUPT;
        latest = again;
    }
}

static inline void ei_frame_consumer_release(ei_frame_consumer *c) {
    if (c->held == EI_NO_SLOT) return;
    atomic_store(&c->hdr->claimed, EI_NO_SLOT);
    c->held = EI_NO_SLOT;
}

/* ------------------------------------------------------------------ */
/* A consumer among the rings ei_wait_any waits on                     */
/* ------------------------------------------------------------------ */

static inline int ei__frame_ready_cb(const void *c) { return ei_frame_consumer_ready((const ei_frame_consumer *)c); }

static inline ei_waitable ei_frame_waitable(ei_frame_consumer *c) {
    ei_waitable w = {&c->hdr->doorbell, &c->hdr->waiters, ei__frame_ready_cb, c, NULL};
    return w;
}

#endif /* EDGEINFER_CONSUMER_H */
