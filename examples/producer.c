/*
 * A camera producer in plain C, using only <edgeinfer/ring.h> (ABI 2).
 *
 *   cc -std=gnu11 -O2 -I native/include examples/producer.c -o producer
 *   ./producer cam0 640 480 --fps 30
 *
 * It creates its frame ring as a sealed memfd, hands it to edgeinferd over
 * the ingress socket as stream `cam0`, and publishes frames into it. It never
 * blocks on the daemon: while the daemon is away (restarting, say) it keeps
 * publishing and reconnects with backoff, handing over the same ring.
 *
 * Each frame is a test pattern derived from its sequence number: byte i of
 * frame `seq` is (seq * 7 + i / 64) mod 256, so a reader can check that every
 * frame it gets is whole (see tests/ring_helpers.py).
 *
 * Options:
 *   --frames N        stop after N frames (default: until SIGINT/SIGTERM)
 *   --fps F           pace to F frames per second (default: as fast as possible)
 *   --slots S         ring slots, >= 3 (default 4)
 *   --format F        gray8|rgb24|bgr24|rgba32|bgra32, or nv12|i420|yuyv (YUV as a decoder gives it;
 *                     even width and height) (default bgr24)
 *   --colorimetry C   YUV formats: bt601|bt601-full|bt709|bt709-full (default bt601, limited range)
 *   --socket P        the daemon's ingress socket (default /run/edgeinfer/ingress.sock)
 *   --wait S          wait up to S seconds for the daemon at start (default 10; 0: start publishing at once)
 *   --row-delay-us U  sleep U microseconds after each row (makes writes slow, for crash tests)
 * Prints "CONNECTED accepted=N" whenever the daemon accepts the ring,
 * "DISCONNECTED <why>" when it goes away, "WAITING <why>" if no daemon took
 * it within --wait, and "DONE frames=N" at the end. Exit status 1 if the
 * daemon refuses the stream at start for a reason that will not pass by
 * itself (the reason on stderr).
 */
#include <edgeinfer/ring.h>

#include <signal.h>
#include <stdlib.h>

static volatile sig_atomic_t stop_requested;
static void on_signal(int sig) { (void)sig; stop_requested = 1; }

static uint32_t parse_format(const char *s) {
    static const char *names[] = {"gray8", "rgb24", "bgr24", "rgba32", "bgra32", "nv12", "i420", "yuyv"};
    static const uint32_t codes[] = {EI_PIX_GRAY8, EI_PIX_RGB24, EI_PIX_BGR24, EI_PIX_RGBA32, EI_PIX_BGRA32,
                                     EI_PIX_NV12, EI_PIX_I420, EI_PIX_YUYV};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (strcmp(s, names[i]) == 0) return codes[i];
    fprintf(stderr, "unknown pixel format '%s'\n", s);
    exit(2);
}

static uint32_t parse_colorimetry(const char *s) {
    static const char *names[] = {"bt601", "bt601-full", "bt709", "bt709-full"};
    static const uint32_t codes[] = {EI_COLOUR_BT601, EI_COLOUR_BT601_FULL, EI_COLOUR_BT709, EI_COLOUR_BT709_FULL};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (strcmp(s, names[i]) == 0) return codes[i];
    fprintf(stderr, "unknown colorimetry '%s'\n", s);
    exit(2);
}

static void fill_pattern(uint8_t *payload, const ei_frame_layout *l, uint64_t seq, long row_delay_us) {
    const uint64_t row_bytes = l->row_stride;
    for (uint32_t y = 0; y < l->rows; y++) { /* every row of the frame: a 4:2:0 frame's chroma rows too */
        uint8_t *row = payload + y * row_bytes;
        uint64_t base = y * row_bytes;
        for (uint64_t x = 0; x < row_bytes; x++) row[x] = (uint8_t)(seq * 7 + ((base + x) >> 6));
        if (row_delay_us > 0) usleep((useconds_t)row_delay_us);
    }
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s STREAM WIDTH HEIGHT [--frames N] [--fps F] [--slots S] [--format F] "
                        "[--colorimetry C] [--socket P] [--wait S] [--row-delay-us U]\n", argv[0]);
        return 2;
    }
    const char *stream = argv[1];
    ei_frame_geometry g = {(uint32_t)atoi(argv[2]), (uint32_t)atoi(argv[3]), EI_PIX_BGR24, 0, 4, EI_COLOUR_BT601};
    const char *socket_path = EI_INGRESS_SOCKET;
    long long frames = -1;
    double fps = 0, wait_s = 10;
    long row_delay_us = 0;
    for (int i = 4; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) { fprintf(stderr, "%s needs a value\n", a); return 2; }
        if (strcmp(a, "--frames") == 0) frames = atoll(v);
        else if (strcmp(a, "--fps") == 0) fps = atof(v);
        else if (strcmp(a, "--slots") == 0) g.slot_count = (uint32_t)atoi(v);
        else if (strcmp(a, "--format") == 0) g.pixel_format = parse_format(v);
        else if (strcmp(a, "--colorimetry") == 0) g.colorimetry = parse_colorimetry(v);
        else if (strcmp(a, "--socket") == 0) socket_path = v;
        else if (strcmp(a, "--wait") == 0) wait_s = atof(v);
        else if (strcmp(a, "--row-delay-us") == 0) row_delay_us = atol(v);
        else { fprintf(stderr, "unknown option %s\n", a); return 2; }
        i++;
    }

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    ei_frame_producer p;
    ei_ingress conn;
    ei_error err;
    char label[96];
    snprintf(label, sizeof label, "edgeinfer-frames:%s", stream);
    if (ei_frame_producer_create(&p, label, &g, &err) != EI_OK ||
        ei_ingress_init(&conn, socket_path, stream, p.fd, &err) != EI_OK) {
        fprintf(stderr, "producer: %s\n", err.msg);
        return 1;
    }
    /* At start nothing is being published yet, so waiting for the daemon blocks no one. A refusal that
     * will not pass by itself (not this stream's producer, a bad ring) ends the program; no daemon yet
     * does not: publish anyway, the connection comes when the daemon does. */
    if (wait_s > 0 && ei_ingress_wait(&conn, (uint64_t)(wait_s * 1e9), &err) != EI_OK) {
        if (!ei_error_transient(&err)) {
            fprintf(stderr, "producer: %s\n", err.msg);
            ei_ingress_close(&conn);
            ei_frame_producer_close(&p);
            return 1;
        }
        printf("WAITING %s\n", err.msg);
    }
    int state = conn.state;
    if (state == EI_INGRESS_CONNECTED) printf("CONNECTED accepted=%u\n", conn.accepted);
    fflush(stdout);

    /* The whole frame, which is what payload_len must say (nv12/i420: height * 3 / 2 rows of width bytes):
     * ei_frame_payload_len(format, width, height, row_stride), here of the ring's own geometry. */
    const uint64_t frame_bytes = ei_frame_bytes(&p.layout);
    const uint64_t period_ns = fps > 0 ? (uint64_t)(1e9 / fps) : 0;
    uint64_t next_ns = ei_now_ns(CLOCK_MONOTONIC);
    long long n = 0;
    while (!stop_requested && (frames < 0 || n < frames)) {
        uint8_t *payload = ei_frame_producer_begin(&p); /* never blocks */
        uint64_t seq = p.next_seq;                      /* the seq publish() will assign */
        fill_pattern(payload, &p.layout, seq, row_delay_us);
        int64_t got = ei_frame_producer_publish(&p, ei_now_ns(CLOCK_MONOTONIC), ei_now_ns(CLOCK_REALTIME), seq,
                                                frame_bytes);
        if (got < 0) { /* a wrong payload_len or no begin(): a bug here, said rather than published */
            fprintf(stderr, "producer: publish refused (status %lld)\n", (long long)got);
            break;
        }
        n++;
        /* Connection upkeep: a comparison unless a check or a reconnection is due; never blocks. */
        int now_state = ei_ingress_step(&conn, ei_now_ns(CLOCK_MONOTONIC));
        if (now_state != state) {
            if (now_state == EI_INGRESS_CONNECTED) printf("CONNECTED accepted=%u\n", conn.accepted);
            else if (state == EI_INGRESS_CONNECTED) printf("DISCONNECTED %s\n", conn.last_msg);
            fflush(stdout);
            state = now_state;
        }
        if (period_ns) {
            next_ns += period_ns;
            uint64_t now = ei_now_ns(CLOCK_MONOTONIC);
            if (next_ns > now) {
                struct timespec ts = {(time_t)(next_ns / 1000000000ull), (long)(next_ns % 1000000000ull)};
                clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
            } else {
                next_ns = now; /* running late: do not burst to catch up */
            }
        }
    }
    ei_ingress_close(&conn);
    ei_frame_producer_close(&p);
    printf("DONE frames=%lld\n", n);
    return 0;
}
