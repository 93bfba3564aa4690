/*
 * ring.h's helpers as a vendor calls them (issue 22, defect 3), compiled against ring.h alone:
 *   frame_len   ei_frame_payload_len per pixel format, and the layout's ei_frame_bytes agrees
 *   publish     ei_frame_producer_publish refuses a payload_len that is not the frame's, and no begin()
 *   buffer      ei_result_reader_next reports a buffer too small (EI_ERR_BUFFER, the real length kept)
 *   futex       ei_futex_wait returns negative ei_status codes, never a positive errno
 *   generation  the producer helper counts the rings it created
 *   transient   EI_ERR_SYS is not transient by itself; its errno decides; a permanent one is not retried
 *   busy        BUSY is retried every EI_BACKOFF_MIN_NS for EI_BUSY_QUICK_NS, then with the doubling backoff
 * Usage: ring_helpers_test DIR (a directory for a socket and a file). Prints "ok NAME" per check; on a
 * failure "FAIL NAME: why" and exit status 1. The clock of the busy check is the test's own (ei_ingress_step
 * takes `now`): nothing here depends on how fast the machine is.
 */
#include <edgeinfer/ring.h>

#include <signal.h>
#include <stdlib.h>
#include <sys/time.h>

static int failures;

#define CHECK(name, cond, ...)                                                 \
    do {                                                                       \
        if (!(cond)) {                                                         \
            printf("FAIL %s: ", name);                                         \
            printf(__VA_ARGS__);                                               \
            printf(" (%s, line %d)\n", #cond, __LINE__);                       \
            failures++;                                                        \
            return;                                                            \
        }                                                                      \
    } while (0)

static void check_frame_len(void) {
    static const struct { uint32_t fmt, w, h, stride; uint64_t want; } cases[] = {
        {EI_PIX_GRAY8, 64, 48, 0, 64 * 48},       {EI_PIX_RGB24, 64, 48, 0, 64 * 48 * 3},
        {EI_PIX_BGR24, 64, 48, 256, 256 * 48},    {EI_PIX_RGBA32, 64, 48, 0, 64 * 48 * 4},
        {EI_PIX_BGRA32, 64, 48, 300, 300 * 48},   {EI_PIX_NV12, 640, 480, 0, 640 * 480 * 3 / 2},
        {EI_PIX_I420, 64, 48, 0, 64 * 48 * 3 / 2}, {EI_PIX_YUYV, 64, 48, 0, 64 * 48 * 2},
        {99, 64, 48, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        uint64_t got = ei_frame_payload_len(cases[i].fmt, cases[i].w, cases[i].h, cases[i].stride);
        CHECK("frame_len", got == cases[i].want, "format %u %ux%u stride %u: %llu, want %llu", cases[i].fmt,
              cases[i].w, cases[i].h, cases[i].stride, (unsigned long long)got, (unsigned long long)cases[i].want);
        if (cases[i].fmt == 99) continue;
        ei_frame_geometry g = {cases[i].w, cases[i].h, cases[i].fmt, cases[i].stride, 3, 0};
        ei_frame_layout l;
        ei_error e;
        CHECK("frame_len", ei_frame_layout_from_geometry(&g, &l, "t", &e) == EI_OK, "%s", e.msg);
        CHECK("frame_len", ei_frame_bytes(&l) == got && l.payload_capacity >= got, "layout says %llu",
              (unsigned long long)ei_frame_bytes(&l));
    }
    printf("ok frame_len\n");
}

static void check_publish(void) {
    ei_frame_producer p;
    ei_error e;
    ei_frame_geometry g = {64, 48, EI_PIX_NV12, 0, 3, 0};
    CHECK("publish", ei_frame_producer_create(&p, "t-publish", &g, &e) == EI_OK, "%s", e.msg);
    int64_t rc = ei_frame_producer_publish(&p, 1, 1, 1, ei_frame_bytes(&p.layout));
    CHECK("publish", rc == EI_ERR_STATE, "publish without begin(): %lld", (long long)rc);
    uint8_t *px = ei_frame_producer_begin(&p);
    memset(px, 7, ei_frame_bytes(&p.layout));
    /* What the old table said (row_stride x height): a third of the frame missing. */
    rc = ei_frame_producer_publish(&p, 1, 1, 1, 64 * 48);
    CHECK("publish", rc == EI_ERR_ARG, "row_stride x height for nv12: %lld", (long long)rc);
    rc = ei_frame_producer_publish(&p, 1, 1, 1, ei_frame_bytes(&p.layout) + 1);
    CHECK("publish", rc == EI_ERR_ARG, "one byte over: %lld", (long long)rc);
    CHECK("publish", atomic_load(&p.hdr->published) == 0 && atomic_load(&p.hdr->latest) == 0,
          "a refused frame was published (published %llu)", (unsigned long long)atomic_load(&p.hdr->published));
    uint32_t reserved = p.writing;
    CHECK("publish", reserved != EI_NO_SLOT && ei_frame_producer_begin(&p) == px, "the slot was not kept");
    rc = ei_frame_producer_publish(&p, 1, 1, 1, 64 * 48 * 3 / 2);
    CHECK("publish", rc == 1, "the right length: %lld", (long long)rc);
    ei_frame_slot_header *sh = ei_frame_slot(p.base, &p.layout, reserved);
    CHECK("publish", sh->payload_len == 4608 && atomic_load(&p.hdr->latest) == (1ull << 8 | reserved),
          "slot %u says %llu bytes", reserved, (unsigned long long)sh->payload_len);
    ei_frame_producer_close(&p);
    printf("ok publish\n");
}

static void check_buffer(void) {
    ei_result_writer wr;
    ei_error e;
    CHECK("buffer", ei_result_writer_create(&wr, "t-results", 4, 256, 1, &e) == EI_OK, "%s", e.msg);
    ei_result_reader rd;
    CHECK("buffer", ei_result_reader_init(&rd, wr.base, wr.layout.total_size, "t-results", 0, &e) == EI_OK, "%s",
          e.msg);
    for (uint32_t len = 200; len <= 201; len++) {
        ei_result_record_header *r = ei_result_writer_begin(&wr);
        r->payload_len = len;
        r->item_count = len;
        for (uint32_t i = 0; i < len; i++) ei_result_payload(r)[i] = (uint8_t)(i + 1);
        ei_result_writer_commit(&wr, r);
    }
    ei_result_record_header h;
    uint8_t buf[256];
    uint64_t missed;
    memset(buf, 0xEE, sizeof buf);
    int got = ei_result_reader_next(&rd, &h, buf, 100, &missed);
    CHECK("buffer", got == EI_ERR_BUFFER, "a 100-byte buffer for a 200-byte record: %d", got);
    CHECK("buffer", h.payload_len == 200 && h.item_count == 200, "payload_len %u (the record's is 200)", h.payload_len);
    CHECK("buffer", buf[0] == 1 && buf[99] == 100 && buf[100] == 0xEE, "copied %u..%u, past the buffer %u", buf[0],
          buf[99], buf[100]);
    got = ei_result_reader_next(&rd, &h, buf, sizeof buf, &missed);
    CHECK("buffer", got == 1 && h.payload_len == 201 && buf[200] == 201 && missed == 0,
          "the next record with room: %d, %u bytes", got, h.payload_len);
    got = ei_result_reader_next(&rd, &h, buf, sizeof buf, &missed);
    CHECK("buffer", got == 0, "nothing more: %d", got);
    ei_result_writer_retire(&wr);
    munmap(wr.base, wr.layout.total_size);
    close(wr.fd);
    printf("ok buffer\n");
}

static void on_alarm(int sig) { (void)sig; }

static void check_futex(void) {
    static _Atomic uint32_t word = 5;
    int rc = ei_futex_wait(&word, 4, 1000000000ull);
    CHECK("futex", rc == EI_OK, "the word had moved on: %d", rc);
    rc = ei_futex_wait(&word, 5, 1000000ull);
    CHECK("futex", rc == EI_ERR_TIMEOUT, "1 ms with nobody waking: %d", rc);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm; /* no SA_RESTART: the sleep is interrupted */
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 0}, {0, 20000}};
    setitimer(ITIMER_REAL, &it, NULL);
    rc = ei_futex_wait(&word, 5, 10000000000ull); /* the signal comes after 20 ms; 10 s bounds it */
    CHECK("futex", rc == EI_ERR_AGAIN, "interrupted by a signal: %d", rc);
    rc = ei_futex_wait((const _Atomic uint32_t *)(uintptr_t)8, 0, 1000000ull);
    CHECK("futex", rc == EI_ERR_SYS && errno == EFAULT, "a bad address: %d (errno %d)", rc, errno);
    printf("ok futex\n");
}

static void check_generation(void) {
    ei_frame_geometry g = {16, 16, EI_PIX_GRAY8, 0, 3, 0};
    ei_frame_producer p[3];
    ei_error e;
    uint32_t first = 0;
    for (uint32_t i = 0; i < 3; i++) {
        CHECK("generation", ei_frame_producer_create(&p[i], "t-gen", &g, &e) == EI_OK, "%s", e.msg);
        uint32_t gen = atomic_load(&p[i].hdr->generation);
        if (i == 0) first = gen;
        CHECK("generation", gen == first + i && gen >= 1, "ring %u of this process has generation %u", i, gen);
        CHECK("generation", atomic_load(&p[i].hdr->claimed) == EI_NO_SLOT, "claimed not initialised");
    }
    for (int i = 0; i < 3; i++) ei_frame_producer_close(&p[i]);
    printf("ok generation\n");
}

static void check_transient(const char *dir) {
    CHECK("transient", !ei_status_transient(EI_ERR_SYS), "EI_ERR_SYS alone counts as transient");
    CHECK("transient", ei_status_transient(EI_ERR_BUSY) && ei_status_transient(EI_ERR_NOT_FOUND) &&
                           ei_status_transient(EI_ERR_AGAIN) && ei_status_transient(EI_ERR_CLOSED) &&
                           ei_status_transient(EI_ERR_TIMEOUT), "a transient status is not");
    CHECK("transient", !ei_status_transient(EI_ERR_DENIED) && !ei_status_transient(EI_ERR_ARG) &&
                           !ei_status_transient(EI_ERR_REFUSED) && !ei_status_transient(EI_ERR_GEOMETRY),
          "a permanent refusal counts as transient");
    ei_error e = {EI_ERR_SYS, EMFILE, "x"};
    CHECK("transient", ei_error_transient(&e), "EMFILE (fds short for a moment) is not transient");
    e.sys_errno = EINVAL;
    CHECK("transient", !ei_error_transient(&e), "EINVAL is transient");
    /* A socket path under a regular file: connect() fails with ENOTDIR, which no retry mends. */
    char file[256], path[300];
    snprintf(file, sizeof file, "%s/not-a-dir", dir);
    int fd = open(file, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    CHECK("transient", fd >= 0, "creating %s: %s", file, strerror(errno));
    close(fd);
    snprintf(path, sizeof path, "%s/ingress.sock", file);
    ei_frame_geometry g = {16, 16, EI_PIX_GRAY8, 0, 3, 0};
    ei_frame_producer p;
    CHECK("transient", ei_frame_producer_create(&p, "t-sys", &g, &e) == EI_OK, "%s", e.msg);
    ei_ingress in;
    CHECK("transient", ei_ingress_init(&in, path, "cam0", p.fd, &e) == EI_OK, "%s", e.msg);
    int rc = ei_ingress_wait(&in, 10000000000ull, &e); /* would retry for 10 s if ENOTDIR counted as transient */
    CHECK("transient", rc == EI_ERR_SYS && e.sys_errno == ENOTDIR && in.attempts == 1,
          "ENOTDIR: status %d errno %d after %u attempts (%s)", rc, e.sys_errno, in.attempts, e.msg);
    ei_ingress_close(&in);
    ei_frame_producer_close(&p);
    printf("ok transient\n");
}

/* The daemon's side of one handshake, played by the test: answer the pending hello with `status`. A
 * refusal closes the connection; an acceptance leaves it in *conn. Returns the exchange's ei_status. */
static int answer(int listener, int status, int *conn) {
    int c = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
    if (c < 0) return EI_ERR_SYS;
    ei_hello h;
    ei_error e;
    int fd = -1;
    int rc = ei_sock_recv(c, &h, sizeof h, &fd, &e);
    if (fd >= 0) close(fd);
    if (rc == EI_OK) rc = ei_reply_send(c, status, status ? "stream cam0 already has its producer" : "", -1, &e);
    if (status != EI_OK || rc != EI_OK) close(c);
    else if (conn) *conn = c;
    return rc;
}

static void check_busy(const char *dir) {
    char path[300];
    snprintf(path, sizeof path, "%s/busy.sock", dir);
    int l = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    CHECK("busy", strlen(path) < sizeof sa.sun_path, "socket path too long: %s", path);
    memcpy(sa.sun_path, path, strlen(path) + 1);
    CHECK("busy", l >= 0 && bind(l, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(l, 8) == 0, "listen %s: %s",
          path, strerror(errno));
    ei_frame_geometry g = {16, 16, EI_PIX_GRAY8, 0, 3, 0};
    ei_frame_producer p;
    ei_ingress in;
    ei_error e;
    CHECK("busy", ei_frame_producer_create(&p, "t-busy", &g, &e) == EI_OK, "%s", e.msg);
    CHECK("busy", ei_ingress_init(&in, path, "cam0", p.fd, &e) == EI_OK, "%s", e.msg);
    const uint64_t start = 1000000000000ull; /* the test's own clock: ei_ingress_step takes `now` */
    uint64_t now = start;
    /* Refused BUSY over and over during EI_BUSY_QUICK_NS: every retry is due EI_BACKOFF_MIN_NS later. */
    int n = 0;
    while (now - start < EI_BUSY_QUICK_NS) {
        CHECK("busy", ei_ingress_step(&in, now) == EI_INGRESS_HANDSHAKE, "attempt %d did not connect: %s", n,
              in.last_msg);
        CHECK("busy", answer(l, EI_ERR_BUSY, NULL) == EI_OK, "the test's daemon could not answer");
        CHECK("busy", ei_ingress_step(&in, now) == EI_INGRESS_DISCONNECTED && in.last_status == EI_ERR_BUSY,
              "attempt %d: state %d status %d", n, in.state, in.last_status);
        CHECK("busy", in.retry_at_ns - now == EI_BACKOFF_MIN_NS, "BUSY %d: the next try in %llu ns, not %llu", n,
              (unsigned long long)(in.retry_at_ns - now), EI_BACKOFF_MIN_NS);
        now = in.retry_at_ns;
        n++;
    }
    /* Still BUSY after that: back to the doubling backoff, from its start. */
    uint64_t want = EI_BACKOFF_MIN_NS;
    for (int k = 0; k < 3; k++, want *= 2) {
        ei_ingress_step(&in, now);
        CHECK("busy", answer(l, EI_ERR_BUSY, NULL) == EI_OK, "the test's daemon could not answer");
        ei_ingress_step(&in, now);
        CHECK("busy", in.state == EI_INGRESS_DISCONNECTED && in.retry_at_ns - now == want,
              "BUSY past the quick period, try %d: next in %llu ns, want %llu", k,
              (unsigned long long)(in.retry_at_ns - now), (unsigned long long)want);
        now = in.retry_at_ns;
    }
    /* Accepted: connected, and a later BUSY run starts quick again. */
    ei_ingress_step(&in, now);
    int c = -1;
    CHECK("busy", answer(l, EI_OK, &c) == EI_OK && ei_ingress_step(&in, now) == EI_INGRESS_CONNECTED && in.busy_since_ns == 0 &&
                      in.backoff_ns == EI_BACKOFF_MIN_NS, "not accepted: state %d", in.state);
    close(c);
    ei_ingress_close(&in);
    ei_frame_producer_close(&p);
    close(l);
    unlink(path);
    printf("ok busy quick=%d\n", n);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    check_frame_len();
    check_publish();
    check_buffer();
    check_futex();
    check_generation();
    check_transient(argv[1]);
    check_busy(argv[1]);
    return failures ? 1 : 0;
}
