/*
 * Several lanes (processes) consuming one frame ring, one at a time
 * (daemon-internal, not ABI: producers see exactly one consumer).
 *
 * Every stream has a cursor in the daemon's dispatch table, a shared mapping
 * that the control plane and its lanes inherit. A lane that wants to serve a
 * stream claims the cursor (compare-and-swap of `owner`), loads the shared
 * consumer state into its own ei_frame_consumer, acquires, runs, publishes,
 * stores the state back and frees the cursor. So a stream is never served by
 * two lanes at once, and a frame is never served twice.
 *
 * `epoch` is the control plane's count of producers admitted for the stream:
 * a lane still holding the ring of an earlier producer never claims (its
 * detach is on its way), and the first lane to serve a newly admitted ring
 * starts from the ring's `consumed` (ei_frame_consumer_resume): zero for a
 * new ring, where the previous daemon stopped for one handed over again.
 */
#ifndef EDGEINFER_LANES_H
#define EDGEINFER_LANES_H

#include <edgeinfer/ring.h>

#include "consumer.h"

typedef struct ei_stream_cursor {
    _Atomic uint32_t owner;            /* lane id + 1 serving the stream now; 0 = free */
    _Atomic uint32_t epoch;            /* producer generation the state below belongs to */
    _Atomic uint32_t passed_over;      /* picks that went to other streams while this one was ready */
    _Atomic uint32_t seen_flags;       /* ring flags already reported */
    _Atomic uint64_t seen_latest;      /* the `latest` word last consumed, by any lane */
    _Atomic uint64_t last_seq;         /* seq of the last frame taken */
    _Atomic uint64_t pending_since_ns; /* first lane's arrival stamp of news not taken yet; 0 = none */
    /* The journal of the last consumption (ei_lane_consumed), written before the cursor's words above, so that
     * the control plane can settle what a lane that died held (dispatch.py settle_cursors_of): */
    _Atomic uint64_t j_latest;         /* the seen_latest it stores; 0 = none */
    _Atomic uint64_t j_last_seq;       /* the last_seq it stores */
    _Atomic int64_t j_total;           /* the stream's outcome total once it is counted (outcomes + skipped) */
} ei_stream_cursor;

/* What a lane's wait set tests for one stream: its own consumer (for the
 * ring's words) and the shared cursor (for what has been consumed). */
typedef struct ei_lane_view {
    const ei_frame_consumer *c;    /* borrowed: the lane's consumer of the ring */
    ei_stream_cursor *cur;         /* borrowed: the stream's cursor in the dispatch table */
    uint32_t epoch;                /* the producer generation of the lane's ring */
    uint64_t claimed_since;        /* the cursor's arrival stamp when we claimed it */
    const int64_t *outcomes;       /* borrowed: the stream's outcome counters (stats.py), NULL = no journal */
    uint32_t n_outcomes;
} ei_lane_view;

/* News the lane may serve: a `latest` word nobody consumed (a newly published frame), on a free cursor of its
 * epoch. Never the ring's `flags` alone: the camera owns that word, and a flag flipped with every doorbell ring
 * made each ring a wake-up the wake guard could not mute (ei_wake_guard, edgeinfer/client.h; the lanes learn that
 * a camera left from its connection, not from EI_RING_CLOSED). */
static inline int ei_lane_ready(const void *p) {
    const ei_lane_view *v = (const ei_lane_view *)p;
    if (atomic_load_explicit(&v->cur->owner, memory_order_acquire) != 0) return 0;
    uint32_t epoch = atomic_load_explicit(&v->cur->epoch, memory_order_acquire);
    if (epoch > v->epoch) return 0; /* our ring is an earlier producer's: never ours to serve again */
    uint64_t latest = atomic_load_explicit(&v->c->hdr->latest, memory_order_acquire);
    if (epoch < v->epoch) return latest != 0; /* a new ring nobody has served yet */
    return latest != 0 && latest != atomic_load_explicit(&v->cur->seen_latest, memory_order_relaxed);
}

static inline ei_waitable ei_lane_waitable(ei_lane_view *v) {
    ei_frame_consumer *c = (ei_frame_consumer *)v->c;
    ei_waitable w = {&c->hdr->doorbell, &c->hdr->waiters, ei_lane_ready, v, NULL}; /* the caller sets the guard */
    return w;
}

/* Stamps the daemon's arrival time of pending news once, whichever lane sees it first. */
static inline uint64_t ei_lane_note(ei_lane_view *v, uint64_t now_ns) {
    uint64_t since = 0;
    if (atomic_compare_exchange_strong(&v->cur->pending_since_ns, &since, now_ns)) return now_ns;
    return since;
}

/* Claims the stream for lane `lane_id` (>= 1) and loads the shared state into
 * the lane's consumer. 1 = claimed; 0 = another lane holds it, or our ring is
 * an earlier producer's. */
static inline int ei_lane_claim(ei_lane_view *v, ei_frame_consumer *c, uint32_t lane_id) {
    uint32_t free_ = 0;
    if (!atomic_compare_exchange_strong(&v->cur->owner, &free_, lane_id)) return 0;
    ei_stream_cursor *cur = v->cur;
    uint32_t epoch = atomic_load(&cur->epoch);
    if (epoch > v->epoch) {
        atomic_store(&cur->owner, 0);
        return 0;
    }
    if (epoch < v->epoch) { /* first lane on a newly admitted ring: it starts where the ring's last consumer
                             * stopped (a ring handed over again, or restored after a restart), else at zero */
        ei_frame_consumer_resume(c);
        atomic_store(&cur->j_latest, 0); /* the journal was an earlier ring's */
        atomic_store(&cur->seen_latest, c->seen_latest);
        atomic_store(&cur->last_seq, c->last_seq);
        atomic_store(&cur->seen_flags, 0);
        atomic_store(&cur->epoch, v->epoch);
    }
    c->seen_latest = atomic_load(&cur->seen_latest);
    c->last_seq = atomic_load(&cur->last_seq);
    c->seen_flags = atomic_load(&cur->seen_flags);
    c->pending_since_ns = v->claimed_since = atomic_load(&cur->pending_since_ns);
    return 1;
}

/* Stores the lane's consumer state back and frees the stream. If an acquire
 * consumed the arrival stamp, it is cleared (only if it is still the one we
 * loaded). Returns 1 when the stream already has news again (the caller wakes
 * the other lanes). */
static inline int ei_lane_unclaim(ei_lane_view *v, ei_frame_consumer *c) {
    ei_stream_cursor *cur = v->cur;
    atomic_store(&cur->seen_latest, c->seen_latest);
    atomic_store(&cur->last_seq, c->last_seq);
    atomic_store(&cur->seen_flags, c->seen_flags);
    uint64_t consumed = v->claimed_since;
    if (consumed && c->pending_since_ns == 0) atomic_compare_exchange_strong(&cur->pending_since_ns, &consumed, 0);
    /* seq_cst, not release: the load of `latest` below must not be ordered before this store (x86 would). */
    atomic_store(&cur->owner, 0);
    uint64_t latest = atomic_load(&c->hdr->latest);
    return latest != 0 && latest != c->seen_latest;
}

/* Right after an acquire that consumed something (taken or refused): what was consumed goes to the cursor at
 * once, before the frame is run. A lane that dies while running it (a frame that crashes ONNX Runtime) must not
 * leave the frame to the next lane, or one poison frame would take every lane down in turn. `owed`: the outcomes
 * the caller will count for it (the frame's own, and the frames skipped before it). First the journal: the
 * stream's outcome total once they are counted, then the cursor. A lane that dies anywhere after this leaves a
 * journal naming what the cursor says was consumed, with a total its counters have not reached yet: the control
 * plane counts what is missing (dispatch.py settle_cursors_of), exactly once. A lane that dies before the
 * cursor's store leaves the frame to the next lane, uncounted. */
static inline void ei_lane_consumed(ei_lane_view *v, const ei_frame_consumer *c, uint64_t owed) {
    ei_stream_cursor *cur = v->cur;
    if (v->outcomes) {
        uint64_t total = owed > (uint64_t)INT64_MAX ? (uint64_t)INT64_MAX : owed;
        for (uint32_t i = 0; i < v->n_outcomes; i++) { /* saturating: a camera's forged skips cannot wrap it */
            int64_t n = v->outcomes[i];
            total += n > 0 ? (uint64_t)n : 0;
            if (total > (uint64_t)INT64_MAX) total = (uint64_t)INT64_MAX;
        }
        atomic_store(&cur->j_total, (int64_t)total);
        atomic_store(&cur->j_last_seq, c->last_seq);
        atomic_store(&cur->j_latest, c->seen_latest);
    }
    atomic_store(&cur->seen_latest, c->seen_latest);
    atomic_store(&cur->last_seq, c->last_seq);
}

/* The journal's total (what the stream's outcomes add up to once the last consumption is counted). */
static inline int64_t ei_lane_owed_total(const ei_lane_view *v) { return atomic_load(&v->cur->j_total); }

/* Fairness (lanes/pick.py's policy, applied by lanes/loop.py): how often the stream was passed over while ready, by any lane. */
static inline uint32_t ei_lane_passed_over(const ei_lane_view *v) { return atomic_load(&v->cur->passed_over); }
static inline void ei_lane_pass_over(ei_lane_view *v) { atomic_fetch_add(&v->cur->passed_over, 1); }
static inline void ei_lane_picked(ei_lane_view *v) { atomic_store(&v->cur->passed_over, 0); }
static inline uint64_t ei_lane_pending_since(const ei_lane_view *v) { return atomic_load(&v->cur->pending_since_ns); }

/* A writer of a result ring shared by the lanes (each inherited the one
 * writable mapping): continue from the ring's head, whoever wrote it last. */
static inline void ei_result_writer_resume(ei_result_writer *wr) {
    wr->head = atomic_load(&wr->hdr->head);
}

#endif /* EDGEINFER_LANES_H */
