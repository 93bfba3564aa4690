/*
 * Coverage-guided fuzz target (libFuzzer, with AddressSanitizer and
 * UndefinedBehaviorSanitizer) for the reader side of native/include/edgeinfer/ring.h:
 * what a producer controls and the daemon (or an integrator's result reader)
 * trusts after validation.
 *
 * Input: the bytes of one segment, followed by an optional "script".
 *   - If the bytes pass ei_frame_ring_check, the segment is copied into a heap
 *     buffer of exactly the validated total_size (so ASan flags any read past
 *     the ring), every slot's payload region is touched as the daemon's
 *     zero-copy views see it, and the frame consumer acquires/releases; each
 *     further 8 bytes of the script is stored into `latest` before the next
 *     acquire (what a lying producer does while the consumer runs).
 *   - Same for ei_result_ring_check and ei_result_reader_next; the script
 *     words go into `head`.
 * Build and run: tests/reliability/test_native_fuzz.py (clang -fsanitize=fuzzer).
 */
#include "edgeinfer/ring.h"

#include <stdlib.h>

static volatile uint8_t sink; /* keeps the touches from being optimised away */

/* Touches the first and last byte of [p, p + n): ASan reports the range if either end is outside. */
static void touch(const uint8_t *p, uint64_t n) {
    if (n == 0) return;
    sink ^= p[0];
    sink ^= p[n - 1];
}

static uint64_t script_word(const uint8_t *script, size_t script_len, size_t i) {
    uint64_t w = 0;
    memcpy(&w, script + i * 8, sizeof w < script_len - i * 8 ? sizeof w : script_len - i * 8);
    return w;
}

static void fuzz_frames(const uint8_t *data, size_t size) {
    ei_frame_layout layout;
    ei_error err;
    if (ei_frame_ring_check(data, size, "fuzz", &layout, &err) != EI_OK) return;
    /* Owned here: exactly the validated ring, so a read beyond total_size is a heap overflow. */
    uint8_t *base = malloc(layout.total_size);
    if (!base) return;
    memcpy(base, data, layout.total_size);
    const uint8_t *script = data + layout.total_size;
    size_t script_len = size - layout.total_size;

    /* The daemon's per-slot views: payload_capacity bytes, the image inside it row_stride x height. */
    for (uint32_t s = 0; s < layout.slot_count; s++) {
        uint8_t *payload = ei_frame_payload(base, &layout, s);
        touch(payload, layout.payload_capacity);
        touch(payload, (uint64_t)layout.row_stride * layout.height);
    }
    /* What ei_frame_consumer_open sets up after mapping (the mapping itself is not fuzzed here). */
    ei_frame_consumer c;
    memset(&c, 0, sizeof c);
    c.base = base;
    c.hdr = (ei_frame_ring_header *)base;
    c.layout = layout;
    c.held = EI_NO_SLOT;
    atomic_store(&c.hdr->claimed, EI_NO_SLOT);
    for (size_t i = 0; i <= (script_len + 7) / 8 && i < 64; i++) {
        if (i > 0) atomic_store(&c.hdr->latest, script_word(script, script_len, i - 1));
        (void)ei_frame_consumer_ready(&c);
        ei_frame_info info;
        if (ei_frame_consumer_acquire(&c, &info) == 1) {
            touch(ei_frame_payload(c.base, &c.layout, info.slot), info.payload_len);
            ei_frame_consumer_release(&c);
        }
    }
    free(base);
}

static void fuzz_results(const uint8_t *data, size_t size) {
    ei_result_layout layout;
    ei_error err;
    if (ei_result_ring_check(data, size, "fuzz", &layout, &err) != EI_OK) return;
    uint8_t *base = malloc(layout.total_size); /* owned here, exactly the validated ring */
    if (!base) return;
    memcpy(base, data, layout.total_size);
    const uint8_t *script = data + layout.total_size;
    size_t script_len = size - layout.total_size;
    /* The reader's copy-out buffer, as ResultReader sizes it: the ring's payload capacity. */
    uint8_t *payload = malloc(layout.payload_capacity ? layout.payload_capacity : 1);
    if (!payload) {
        free(base);
        return;
    }
    /* What ei_result_reader_open sets up after mapping, from the oldest record held. */
    ei_result_reader rd;
    memset(&rd, 0, sizeof rd);
    rd.base = base;
    rd.hdr = (ei_result_ring_header *)base;
    rd.layout = layout;
    uint64_t head = atomic_load(&rd.hdr->head);
    rd.next = head > layout.record_count ? head - layout.record_count + 1 : 1;
    for (size_t i = 0; i <= (script_len + 7) / 8 && i < 64; i++) {
        if (i > 0) atomic_store(&rd.hdr->head, script_word(script, script_len, i - 1));
        (void)ei_result_reader_ready(&rd);
        ei_result_record_header hdr;
        uint64_t missed;
        /* Bounded by the record count: the reader must not spin on a lying head. */
        for (uint32_t k = 0; k <= layout.record_count; k++) {
            int got = ei_result_reader_next(&rd, &hdr, payload, layout.payload_capacity, &missed);
            if (got != 1) break;
            if (hdr.payload_len > layout.payload_capacity) abort(); /* the reader promised to clamp it */
            touch(payload, hdr.payload_len);
        }
    }
    free(payload);
    free(base);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_frames(data, size);
    fuzz_results(data, size);
    return 0;
}
