/*
 * A camera that tries to resize its own frame ring while the daemon serves it
 * (tests/reliability/test_isolation.py). ABI 2 rings are memfds sealed
 * with F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL before they are handed over,
 * so every attempt must fail with EPERM and the ring must keep its size.
 *
 *   resize_producer STREAM WIDTH HEIGHT --socket P --attempts N [--fps F] [--wait S]
 *
 * It connects like examples/producer.c, then publishes test-pattern frames
 * (byte i of frame seq = (seq * 7 + i / 64) mod 256, frame id = seq) and after
 * each frame makes one attempt, in turn: ftruncate to 0, ftruncate to the
 * header page, ftruncate to size + 4096, fallocate 4096 bytes past the end.
 * (fallocate PUNCH_HOLE is not prevented by these seals, only by F_SEAL_WRITE,
 * which a frame ring cannot carry: it is not attempted.)
 * Prints "CONNECTED accepted=N" at the start, then, after the last attempt,
 *   "ATTEMPTS total=N eperm=E other=O succeeded=S size_changed=C disconnects=D
 *    zero=a/b header=a/b grow=a/b fallocate=a/b"   (per kind: EPERM / attempts)
 * and goes on publishing until SIGTERM ("DONE frames=N"). Exit 1 if the daemon
 * refuses it or does not accept it within --wait seconds.
 */
#include <edgeinfer/ring.h>

#include <signal.h>
#include <stdlib.h>

static volatile sig_atomic_t stop_requested;
static void on_signal(int sig) { (void)sig; stop_requested = 1; }

static void fill_pattern(uint8_t *payload, const ei_frame_layout *l, uint64_t seq) {
    uint64_t n = ei_frame_bytes(l);
    for (uint64_t i = 0; i < n; i++) payload[i] = (uint8_t)(seq * 7 + (i >> 6));
}

static void pace(uint64_t *next_ns, uint64_t period_ns) {
    if (!period_ns) return;
    *next_ns += period_ns;
    uint64_t now = ei_now_ns(CLOCK_MONOTONIC);
    if (*next_ns > now) {
        struct timespec ts = {(time_t)(*next_ns / 1000000000ull), (long)(*next_ns % 1000000000ull)};
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
    } else {
        *next_ns = now;
    }
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s STREAM WIDTH HEIGHT --socket P --attempts N [--fps F] [--wait S]\n", argv[0]);
        return 2;
    }
    const char *stream = argv[1];
    ei_frame_geometry g = {(uint32_t)atoi(argv[2]), (uint32_t)atoi(argv[3]), EI_PIX_BGR24, 0, 4, 0};
    const char *socket_path = EI_INGRESS_SOCKET;
    long attempts = 1000;
    double fps = 500, wait_s = 10;
    for (int i = 4; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--socket") == 0) socket_path = argv[i + 1];
        else if (strcmp(argv[i], "--attempts") == 0) attempts = atol(argv[i + 1]);
        else if (strcmp(argv[i], "--fps") == 0) fps = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--wait") == 0) wait_s = atof(argv[i + 1]);
        else { fprintf(stderr, "unknown option %s\n", argv[i]); return 2; }
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
        ei_ingress_init(&conn, socket_path, stream, p.fd, &err) != EI_OK ||
        ei_ingress_wait(&conn, (uint64_t)(wait_s * 1e9), &err) != EI_OK) {
        fprintf(stderr, "resize_producer: %s\n", err.msg);
        return 1;
    }
    printf("CONNECTED accepted=%u\n", conn.accepted);
    fflush(stdout);

    const off_t size = (off_t)p.layout.total_size;
    static const char *kinds[4] = {"zero", "header", "grow", "fallocate"};
    long tried[4] = {0}, eperm[4] = {0};
    long other = 0, succeeded = 0, size_changed = 0, disconnects = 0;
    const uint64_t frame_bytes = ei_frame_bytes(&p.layout);
    const uint64_t period_ns = fps > 0 ? (uint64_t)(1e9 / fps) : 0;
    uint64_t next_ns = ei_now_ns(CLOCK_MONOTONIC);
    long long frames = 0;
    int state = conn.state, reported = 0;
    for (long i = 0; !stop_requested; i++) {
        uint8_t *payload = ei_frame_producer_begin(&p);
        uint64_t seq = p.next_seq;
        fill_pattern(payload, &p.layout, seq);
        ei_frame_producer_publish(&p, ei_now_ns(CLOCK_MONOTONIC), ei_now_ns(CLOCK_REALTIME), seq, frame_bytes);
        frames++;
        if (i < attempts) {
            int k = (int)(i % 4), rc;
            switch (k) {
            case 0: rc = ftruncate(p.fd, 0); break;
            case 1: rc = ftruncate(p.fd, EI_HEADER_SIZE); break;
            case 2: rc = ftruncate(p.fd, size + 4096); break;
            default: rc = fallocate(p.fd, 0, size, 4096); break;
            }
            int e = errno;
            tried[k]++;
            if (rc == 0) succeeded++;
            else if (e == EPERM) eperm[k]++;
            else other++;
            struct stat st;
            if (fstat(p.fd, &st) != 0 || st.st_size != size) size_changed++;
        } else if (!reported) {
            reported = 1;
            printf("ATTEMPTS total=%ld eperm=%ld other=%ld succeeded=%ld size_changed=%ld disconnects=%ld",
                   attempts, eperm[0] + eperm[1] + eperm[2] + eperm[3], other, succeeded, size_changed, disconnects);
            for (int k = 0; k < 4; k++) printf(" %s=%ld/%ld", kinds[k], eperm[k], tried[k]);
            printf("\n");
            fflush(stdout);
        }
        int now_state = ei_ingress_step(&conn, ei_now_ns(CLOCK_MONOTONIC));
        if (now_state != state && state == EI_INGRESS_CONNECTED) {
            disconnects++;
            printf("DISCONNECTED %s\n", conn.last_msg);
            fflush(stdout);
        }
        state = now_state;
        pace(&next_ns, period_ns);
    }
    ei_ingress_close(&conn);
    ei_frame_producer_close(&p);
    printf("DONE frames=%lld\n", frames);
    return 0;
}
