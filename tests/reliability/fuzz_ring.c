/*
 * Coverage-guided fuzz target (libFuzzer, with AddressSanitizer and
 * UndefinedBehaviorSanitizer) for the reader side of native/include/edgeinfer/ring.h
 * (ABI 2) and the daemon's frame consumer (native/consumer.h): what a producer
 * (or a client of the daemon's sockets) controls and the daemon, or an
 * integrator's result reader, trusts after validation.
 *
 * One input is read three ways:
 *   - as a frame ring followed by a "script": ei_frame_ring_check on all of it
 *     (the size checks), then, when the header's total_size fits the input, the
 *     first total_size bytes are copied into a buffer the fuzzer controls and
 *     handed to ei_frame_consumer_init (which validates the header again and
 *     makes the slots read-only); every slot's payload is touched as the
 *     daemon's zero-copy views see it, and the consumer acquires/releases once
 *     per script entry: each 16 bytes of the script are stored into `latest`
 *     and `published` before the next acquire (a lying producer rewriting them
 *     while the daemon runs);
 *   - as a result ring and a script: ei_result_ring_check, ei_result_reader_init
 *     (from the oldest record when the script's length is even, else from the
 *     next one), and ei_result_reader_next until it has nothing, once per script
 *     word, each word stored into `head` first;
 *   - as a hello (the first 128 bytes, zero-padded): ei_hello_check, whose
 *     accepted stream name must be a valid one.
 * The ring buffer is exactly the validated ring followed by memory poisoned for
 * ASan (and a PROT_NONE page), so any read beyond the ring is reported.
 * Build and run: tests/reliability/test_native_fuzz.py (clang -fsanitize=fuzzer).
 */
#include "edgeinfer/ring.h"
#include "consumer.h" /* the daemon's frame consumer: native/, not installed */

#include <sanitizer/asan_interface.h> /* ASAN_(UN)POISON_MEMORY_REGION: no-ops in the coverage build */
#include <stdlib.h>

#define REGION (64u << 10) /* > -max_len: every ring an input can declare fits */

static volatile uint8_t sink; /* keeps the touches from being optimised away */
static uint8_t *region;       /* REGION bytes, then a PROT_NONE page */

/* Touches the first and last byte of [p, p + n): ASan reports the range if either end is outside. */
static void touch(const uint8_t *p, uint64_t n) {
    if (n == 0) return;
    sink ^= p[0];
    sink ^= p[n - 1];
}

/* The ring's bytes in a buffer of our own (page-aligned, as a mapping is: the consumer mprotects its
 * slots), with everything after the ring poisoned. */
static uint8_t *ring_buffer(const uint8_t *data, size_t n) {
    if (!region) {
        region = mmap(NULL, REGION + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (region == MAP_FAILED || mprotect(region + REGION, 4096, PROT_NONE) != 0) abort();
    }
    if (mprotect(region, REGION, PROT_READ | PROT_WRITE) != 0) abort(); /* the last consumer made slots read-only */
    ASAN_UNPOISON_MEMORY_REGION(region, REGION);
    memcpy(region, data, n);
    ASAN_POISON_MEMORY_REGION(region + n, REGION - n);
    return region;
}

/* The ring's declared size, if the input holds it and at least that many bytes (0 otherwise). */
static uint64_t declared_size(const uint8_t *data, size_t size) {
    uint64_t total;
    if (size < 24) return 0;
    memcpy(&total, data + 16, sizeof total); /* total_size: the same offset in both headers */
    return total >= EI_HEADER_SIZE && total <= size && total <= REGION ? total : 0;
}

static uint64_t script_word(const uint8_t *script, size_t script_len, size_t off, int *present) {
    uint64_t w = 0;
    *present = off < script_len;
    if (*present) memcpy(&w, script + off, script_len - off < sizeof w ? script_len - off : sizeof w);
    return w;
}

static void fuzz_frames(const uint8_t *data, size_t size) {
    ei_frame_layout layout;
    ei_error err;
    (void)ei_frame_ring_check(data, size, "fuzz", &layout, &err); /* all of it: too long, too short, ... */
    uint64_t total = declared_size(data, size);
    if (!total) return;
    uint8_t *base = ring_buffer(data, total);
    const uint8_t *script = data + total;
    size_t script_len = size - total;
    ei_frame_consumer c;
    if (ei_frame_consumer_init(&c, base, total, "fuzz", &err) != EI_OK) return;
    /* The daemon's per-slot views: payload_capacity bytes, the image inside it row_stride x height. */
    for (uint32_t s = 0; s < c.layout.slot_count; s++) {
        uint8_t *payload = ei_frame_payload(c.base, &c.layout, s);
        touch(payload, c.layout.payload_capacity);
        touch(payload, ei_frame_bytes(&c.layout));
    }
    ei_frame_ring_header *h = (ei_frame_ring_header *)base;
    for (size_t i = 0; i <= (script_len + 15) / 16 && i < 64; i++) {
        if (i > 0) { /* the producer rewrites `latest` (and `published`, when the entry has it) */
            int has_latest, has_published;
            uint64_t latest = script_word(script, script_len, (i - 1) * 16, &has_latest);
            uint64_t published = script_word(script, script_len, (i - 1) * 16 + 8, &has_published);
            if (has_published) atomic_store(&h->published, published);
            if (has_latest) atomic_store(&h->latest, latest);
        }
        if (ei_frame_consumer_ready(&c)) (void)ei_frame_consumer_note(&c, 1 + i);
        ei_frame_info info;
        if (ei_frame_consumer_acquire(&c, &info) == 1) {
            if (info.payload_len > c.layout.payload_capacity || info.slot >= c.layout.slot_count) abort();
            touch(ei_frame_payload(c.base, &c.layout, info.slot), info.payload_len);
            ei_frame_consumer_release(&c);
        }
    }
}

static void fuzz_results(const uint8_t *data, size_t size) {
    ei_result_layout layout;
    ei_error err;
    (void)ei_result_ring_check(data, size, "fuzz", &layout, &err);
    uint64_t total = declared_size(data, size);
    if (!total) return;
    uint8_t *base = ring_buffer(data, total);
    const uint8_t *script = data + total;
    size_t script_len = size - total;
    ei_result_reader rd;
    if (ei_result_reader_init(&rd, base, total, "fuzz", script_len % 2 == 0, &err) != EI_OK) return;
    /* The reader's copy-out buffer, as ResultReader sizes it: the ring's payload capacity. */
    uint8_t *payload = malloc(rd.layout.payload_capacity ? rd.layout.payload_capacity : 1);
    if (!payload) return;
    ei_result_ring_header *h = (ei_result_ring_header *)base; /* the writer's view of the same bytes */
    for (size_t i = 0; i <= (script_len + 7) / 8 && i < 64; i++) {
        int present;
        if (i > 0) atomic_store(&h->head, script_word(script, script_len, (i - 1) * 8, &present));
        (void)ei_result_reader_ready(&rd);
        ei_result_record_header hdr;
        uint64_t missed;
        /* Bounded by the record count: the reader must not spin on a lying head. */
        for (uint32_t k = 0; k <= rd.layout.record_count; k++) {
            int got = ei_result_reader_next(&rd, &hdr, payload, rd.layout.payload_capacity, &missed);
            if (got != 1) break;
            if (hdr.payload_len > rd.layout.payload_capacity) abort(); /* the reader promised to clamp it */
            touch(payload, hdr.payload_len);
        }
    }
    free(payload);
}

static void fuzz_hello(const uint8_t *data, size_t size) {
    ei_hello *h = malloc(sizeof *h); /* exactly one hello on the heap: ASan sees any read past it */
    if (!h) return;
    memset(h, 0, sizeof *h);
    memcpy(h, data, size < sizeof *h ? size : sizeof *h);
    char name[EI_STREAM_NAME_MAX + 1];
    ei_error err;
    if (ei_hello_check(h, name, &err) == EI_OK) {
        size_t len = strnlen(name, sizeof name);
        if (len > EI_STREAM_NAME_MAX || !ei_stream_name_ok(name, len)) abort(); /* accepted a name it must not */
    }
    free(h);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_hello(data, size);
    fuzz_frames(data, size);
    fuzz_results(data, size);
    return 0;
}
