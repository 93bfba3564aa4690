/*
 * A result reader in plain C, using only <edgeinfer/ring.h> (ABI 2).
 *
 *   cc -std=gnu11 -O2 -I native/include examples/reader.c -o reader
 *   ./reader cam0 --count 10
 *
 * It asks edgeinferd for stream `cam0`'s result ring over the results socket
 * (the daemon checks who we are against the stream's `readers`), maps the
 * ring read-only and prints one line per result. It writes no shared memory.
 * When the daemon goes away (the connection closes) it reconnects with
 * backoff and reads the new ring from its start. Handed the same ring again
 * (the same daemon closed the connection for a new reader: docs/abi.md, "Who
 * is a party"), it reads on where it was.
 *
 * Options:
 *   --socket P      the daemon's results socket (default /run/edgeinfer/results.sock)
 *   --count N       stop after N results (default: never)
 *   --timeout S     stop after S seconds without a result (default: never)
 *   --from-oldest   start with the oldest record the ring still holds
 * Output per result: "RESULT n=<number> seq=<frame seq> id=<frame id> status=<s> kind=<k> items=<i>
 * model=<name> version=<v> latency_us=<capture to done> missed=<m>", and for a record of several
 * outputs (payload kind 4, the raw decoder's `outputs`) one more line per output: "TENSOR name=<name>
 * index=<output index> dtype=<ONNX type code> shape=<AxBxC>". Exit status 1 if the daemon
 * refuses (the reason on stderr), 3 if --timeout passed.
 */
#include <edgeinfer/ring.h>

#include <signal.h>
#include <stdlib.h>

static volatile sig_atomic_t stop_requested;
static void on_signal(int sig) { (void)sig; stop_requested = 1; }

/* An EI_KIND_TENSORS payload, one line per output: "TENSOR name=<name> index=<i> dtype=<onnx code> shape=AxB".
 * Every length is checked against the payload: the daemon writes it, but a reader trusts no length it did not
 * check. */
static void print_tensors(const uint8_t *payload, uint32_t len, uint32_t count) {
    uint64_t off = 0;
    for (uint32_t i = 0; i < count; i++) {
        ei_tensor_desc d;
        if (off + sizeof d > len) break;
        memcpy(&d, payload + off, sizeof d);
        off += sizeof d;
        uint64_t elems = 1;
        static const uint8_t size_of[17] = {0, 4, 1, 1, 2, 2, 4, 8, 0, 1, 2, 8, 4, 8, 0, 0, 2};
        if (d.ndim > EI_TENSOR_MAX_DIMS || d.dtype > 16 || !size_of[d.dtype]) break;
        printf("TENSOR name=%.32s index=%u dtype=%u shape=", d.name, d.index, d.dtype);
        for (uint32_t k = 0; k < d.ndim; k++) {
            printf(k ? "x%u" : "%u", d.dims[k]);
            elems *= d.dims[k];
        }
        printf("\n");
        uint64_t bytes = elems * size_of[d.dtype];
        off += (bytes + EI_TENSOR_ALIGN - 1) / EI_TENSOR_ALIGN * EI_TENSOR_ALIGN;
    }
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s STREAM [--socket P] [--count N] [--timeout S] [--from-oldest]\n", argv[0]);
        return 2;
    }
    const char *stream = argv[1];
    const char *socket_path = EI_RESULTS_SOCKET;
    long long count = -1;
    double timeout_s = 0;
    int from_oldest = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--from-oldest") == 0) { from_oldest = 1; continue; }
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) { fprintf(stderr, "%s needs a value\n", a); return 2; }
        if (strcmp(a, "--socket") == 0) socket_path = v;
        else if (strcmp(a, "--count") == 0) count = atoll(v);
        else if (strcmp(a, "--timeout") == 0) timeout_s = atof(v);
        else { fprintf(stderr, "unknown option %s\n", a); return 2; }
        i++;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    static uint8_t payload[1 << 20];
    long long n = 0;
    int first = 1;
    uint64_t backoff_ns = EI_BACKOFF_MIN_NS;
    uint64_t last_result = ei_now_ns(CLOCK_MONOTONIC);
    ei_result_reader rd;
    const uint8_t *base = NULL; /* the ring mapped, kept while it is not CLOSED: it may be handed again */
    uint64_t size = 0;
    struct stat held = {0};     /* its st_dev and st_ino: the same memfd if it comes again */
    while (!stop_requested && (count < 0 || n < count)) {
        int sock, ring_fd;
        ei_error err;
        int rc = ei_results_connect(socket_path, stream, 10000000000ull, &sock, &ring_fd, &err);
        if (rc != EI_OK) {
            if (!ei_error_transient(&err)) { /* a refusal: this reader may not read this stream */
                fprintf(stderr, "reader: %s\n", err.msg);
                return 1;
            }
            struct timespec ts = {(time_t)(backoff_ns / 1000000000ull), (long)(backoff_ns % 1000000000ull)};
            nanosleep(&ts, NULL);
            backoff_ns = backoff_ns * 2 > EI_BACKOFF_MAX_NS ? EI_BACKOFF_MAX_NS : backoff_ns * 2;
        } else {
            backoff_ns = EI_BACKOFF_MIN_NS;
            struct stat st;
            if (base && fstat(ring_fd, &st) == 0 && st.st_dev == held.st_dev && st.st_ino == held.st_ino) {
                printf("ATTACHED generation=%u (the same ring: reading on)\n", (unsigned)atomic_load(&rd.hdr->generation));
            } else {
                if (base) munmap((void *)(uintptr_t)base, size);
                base = NULL;
                /* A ring met after the first one is new since we started: read it from its start. */
                if (ei_result_reader_attach(&rd, ring_fd, stream, from_oldest || !first, &base, &size, &err) != EI_OK) {
                    fprintf(stderr, "reader: %s\n", err.msg);
                    return 1;
                }
                fstat(ring_fd, &held);
                printf("ATTACHED generation=%u\n", (unsigned)atomic_load(&rd.hdr->generation));
            }
            first = 0;
            fflush(stdout);
            ei_waitable w = ei_result_waitable(&rd);
            while (!stop_requested && (count < 0 || n < count)) {
                ei_result_record_header h;
                uint64_t missed;
                int got = ei_result_reader_next(&rd, &h, payload, sizeof payload, &missed);
                if (got == EI_ERR_BUFFER) { /* said, never cut silently; the next record is read on */
                    fprintf(stderr, "reader: %s: record n=%llu has %u payload bytes, more than this reader's %zu: "
                            "skipped\n", stream, (unsigned long long)(rd.next - 1), h.payload_len, sizeof payload);
                    continue;
                }
                if (got < 0) {
                    fprintf(stderr, "reader: %s: result ring head is corrupt; reconnecting\n", stream);
                    munmap((void *)(uintptr_t)base, size);
                    base = NULL; /* not to be read on, even if handed again */
                    break;
                }
                if (got) {
                    printf("RESULT n=%llu seq=%llu id=%llu status=%u kind=%u items=%u model=%.32s version=%.16s "
                           "latency_us=%llu missed=%llu\n", (unsigned long long)(rd.next - 1),
                           (unsigned long long)h.frame_seq, (unsigned long long)h.frame_id, h.status, h.payload_kind,
                           h.item_count, h.model_name, h.model_version,
                           (unsigned long long)((h.done_mono_ns - h.capture_mono_ns) / 1000),
                           (unsigned long long)missed);
                    if (h.payload_kind == EI_KIND_TENSORS)
                        print_tensors(payload, h.payload_len, h.item_count);
                    fflush(stdout);
                    n++;
                    last_result = ei_now_ns(CLOCK_MONOTONIC);
                    continue;
                }
                if (timeout_s > 0 && ei_now_ns(CLOCK_MONOTONIC) - last_result > (uint64_t)(timeout_s * 1e9)) {
                    stop_requested = 2;
                    break;
                }
                /* The connection is the daemon's liveness: closed means this ring will not move again. */
                if ((atomic_load(&rd.hdr->flags) & EI_RING_CLOSED) || !ei_sock_alive(sock)) break;
                ei_wait_any(&w, 1, 100000000ull, 0, 1); /* 100 ms slices, to look at the connection */
            }
            if (base && (atomic_load(&rd.hdr->flags) & EI_RING_CLOSED)) { /* done: it will not move again */
                munmap((void *)(uintptr_t)base, size);
                base = NULL;
            }
            close(ring_fd);
            close(sock);
        }
        if (timeout_s > 0 && ei_now_ns(CLOCK_MONOTONIC) - last_result > (uint64_t)(timeout_s * 1e9)) {
            stop_requested = 2;
        }
    }
    return stop_requested == 2 ? 3 : 0;
}
