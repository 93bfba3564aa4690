/*
 * The worst camera we can think of, for the isolation tests (the one that resizes its ring is
 * resize_producer.c). Plain C on ring.h and libc, so it runs as
 * any unprivileged user. One attack per run; it prints what it saw as "KEY=VALUE" lines and exits 0 when
 * it ran its attack (whether the attack worked is for the test to judge from the daemon's side).
 *
 *   evil_producer --socket P --stream S --attack A [--width W --height H] [--count N] [--fps F]
 *                 [--seconds T] [--target-pid PID] [--format F]
 *
 * Attacks:
 *   impersonate     hand over a valid ring as stream S (someone else's): REFUSED=<why> or ACCEPTED
 *   latest-jump     serve S honestly at F fps for T s; halfway, one 8-byte write of latest = seq 2^50, held
 *                   300 ms before the next frame
 *   backdate        publish as fast as possible for T s, capture time = now - N ms (N = --count)
 *   short           publish T s of frames whose payload_len is 100 bytes
 *   geometry-cycle  N times: a new ring of a new size as S, one frame, hang up: ACCEPTED=<n> REFUSED=<n>
 *   flood           publish as fast as possible for T s
 *   forge-ids       serve S at F fps for T s with frame ids 2^63 + n and 2^64 - 1 in turn, and every 10th
 *                   frame a seq jump of 2^50 (a forged skip): PUBLISHED=<frames> JUMPS=<n>
 *   bell-spam       for T s, bump the ring's doorbell and FUTEX_WAKE it as fast as possible, publishing a real
 *                   frame only at F fps: WAKES=<calls> WOKEN=<sleepers the kernel woke> PUBLISHED=<frames>
 *   flag-flip       bell-spam, but every ring also flips a bit of the ring's `flags` word (EI_RING_CLOSED and an
 *                   undefined bit in turn), so each ring looks like news: same output, FLIPS=<flag changes>
 *   rehand          for T s, hand the same ring over as S again and again (a new connection each time, the
 *                   last one hung up first), publishing at F fps meanwhile: ACCEPTED=<n> REFUSED=<n>
 *                   FIRST_REFUSAL=<status> <why> PUBLISHED=<frames>
 *   procfd          try to open every /proc/PID/fd/N of --target-pid read-write: OPENED=<n> DENIED=<n>
 *   fd-KIND         a hello for S with a bad fd: KIND = none, pipe, socket, unsealed, devshm, write-sealed,
 *                   huge (a sparse ring over any sane limit), many (8 fds), garbage (random bytes, no fd),
 *                   abi1 (an ABI 1 hello), after (a valid handshake, then more data): REPLY=<status> <why>
 *   slowloris       open N connections and never say hello: CLOSED_BY_DAEMON=<n> within T s
 */
#include <edgeinfer/ring.h>

#include <dirent.h>
#include <signal.h>
#include <stdlib.h>

static const char *sock_path = EI_INGRESS_SOCKET, *stream = "cam0", *attack = "";
static uint32_t width = 64, height = 48, fmt = EI_PIX_BGR24;
static long count = 1000, target_pid = 0;
static double fps = 0, seconds = 3;

static void die(const char *what, const ei_error *e) {
    fprintf(stderr, "evil_producer: %s: %s\n", what, e ? e->msg : strerror(errno));
    exit(3);
}

static void make_ring(ei_frame_producer *p, uint32_t w, uint32_t h) {
    ei_error e;
    ei_frame_geometry g = {w, h, fmt, 0, 4, 0};
    if (ei_frame_producer_create(p, "evil", &g, &e) != EI_OK) die("create", &e);
}

/* Hands the ring over as `name`, once (no retry): 0 when accepted, else the refusal status (message in *e). */
static int hand_over(ei_ingress *in, const char *name, int ring_fd, ei_error *e) {
    if (ei_ingress_init(in, sock_path, name, ring_fd, e) != EI_OK) return e->code;
    uint64_t deadline = ei_now_ns(CLOCK_MONOTONIC) + 10000000000ull;
    int st = ei_ingress_step(in, ei_now_ns(CLOCK_MONOTONIC));
    while (st == EI_INGRESS_HANDSHAKE && ei_now_ns(CLOCK_MONOTONIC) < deadline) {
        struct pollfd pf = {in->sock, POLLIN, 0};
        poll(&pf, 1, 100);
        st = ei_ingress_step(in, ei_now_ns(CLOCK_MONOTONIC));
    }
    if (st == EI_INGRESS_CONNECTED) return EI_OK;
    return ei_fail(e, in->last_status ? in->last_status : EI_ERR_TIMEOUT, 0, "%s", in->last_msg);
}

/* A ring of the configured size handed over as `stream`: 1 and "CONNECTED", or 0 and "REFUSED=<why>". */
static int connect_as_stream(ei_frame_producer *p, ei_ingress *in) {
    ei_error e;
    make_ring(p, width, height);
    int rc = hand_over(in, stream, p->fd, &e);
    if (rc != EI_OK) { printf("REFUSED=%d %s\n", rc, e.msg); return 0; }
    printf("CONNECTED\n");
    return 1;
}

static void publish_for(ei_frame_producer *p, ei_ingress *in, double secs, uint64_t backdate_ns, uint64_t len,
                        int jump_halfway) {
    uint64_t end = ei_now_ns(CLOCK_MONOTONIC) + (uint64_t)(secs * 1e9), half = end - (uint64_t)(secs * 5e8);
    uint64_t period = fps > 0 ? (uint64_t)(1e9 / fps) : 0, next = ei_now_ns(CLOCK_MONOTONIC);
    long n = 0, jumped = 0;
    for (;;) {
        uint64_t now = ei_now_ns(CLOCK_MONOTONIC);
        if (now >= end) break;
        uint8_t *px = ei_frame_producer_begin(p);
        memset(px, (int)(p->next_seq & 0xff), ei_frame_bytes(&p->layout));
        /* The unchecked commit: ei_frame_producer_publish refuses a payload_len that is not the frame's. */
        ei__frame_producer_commit(p, now - backdate_ns, ei_now_ns(CLOCK_REALTIME), p->next_seq,
                                  len ? len : ei_frame_bytes(&p->layout));
        n++;
        if (jump_halfway && !jumped && now >= half) { /* the attack of the issue: one write of `latest` */
            atomic_store(&p->hdr->latest, (UINT64_C(1) << 50) << 8 | 0);
            atomic_fetch_add(&p->hdr->doorbell, 1);
            jumped = 1;
            /* held 300 ms before the next frame overwrites it: on a loaded machine a lane may not run within one
               frame period, and would never see the forged value (the test would then prove nothing) */
            struct timespec hold = {0, 300000000L};
            nanosleep(&hold, NULL);
            next = ei_now_ns(CLOCK_MONOTONIC);
        }
        if (in) ei_ingress_step(in, now);
        if (period) {
            next += period;
            now = ei_now_ns(CLOCK_MONOTONIC);
            if (next > now) {
                struct timespec ts = {(time_t)((next - now) / 1000000000ull), (long)((next - now) % 1000000000ull)};
                nanosleep(&ts, NULL);
            } else {
                next = now;
            }
        }
    }
    printf("PUBLISHED=%ld\nJUMPED=%ld\n", n, jumped);
}

/* Sends a hello for `stream` with `fds` attached (n of them; -1 entries skipped) and prints the reply. */
static void send_with_fds(const void *msg, size_t len, const int *fds, int n) {
    ei_error e;
    int s = ei_sock_connect(sock_path, &e);
    if (s < 0) die("connect", &e);
    struct iovec iov = {(void *)(uintptr_t)msg, len};
    struct msghdr mh;
    memset(&mh, 0, sizeof mh);
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    char ctl[CMSG_SPACE(16 * sizeof(int))];
    if (n > 0) {
        memset(ctl, 0, sizeof ctl);
        mh.msg_control = ctl;
        mh.msg_controllen = CMSG_SPACE(n * sizeof(int));
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(n * sizeof(int));
        memcpy(CMSG_DATA(cm), fds, n * sizeof(int));
    }
    if (sendmsg(s, &mh, MSG_NOSIGNAL) < 0) die("sendmsg", NULL);
    struct pollfd pf = {s, POLLIN, 0};
    poll(&pf, 1, 10000);
    int rc = ei_reply_recv(s, NULL, &e);
    printf("REPLY=%d %s\n", rc, rc ? e.msg : "accepted");
    close(s);
}

static int fd_of_kind(const char *kind, ei_frame_producer *p) {
    if (!strcmp(kind, "pipe")) { int pf[2]; if (pipe(pf)) die("pipe", NULL); return pf[0]; }
    if (!strcmp(kind, "socket")) { int sv[2]; if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) die("sp", NULL); return sv[0]; }
    if (!strcmp(kind, "devshm")) {
        char path[64];
        snprintf(path, sizeof path, "/dev/shm/evil-%d", (int)getpid());
        int fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
        if (fd < 0) die("devshm", NULL);
        unlink(path);
        if (ftruncate(fd, (off_t)p->layout.total_size)) die("ftruncate", NULL);
        if (pwrite(fd, p->base, EI_HEADER_SIZE, 0) != EI_HEADER_SIZE) die("pwrite", NULL);
        return fd;
    }
    int fd = memfd_create("evil-kind", MFD_ALLOW_SEALING);
    uint64_t size = !strcmp(kind, "huge") ? (UINT64_C(1) << 40) : p->layout.total_size;
    if (ftruncate(fd, (off_t)size)) die("ftruncate", NULL);
    /* A sealed ring whose header lies about its pixels: a colorimetry on a BGR ring, or an NV12 claim of an
     * odd width (the graph would read the wrong bytes as chroma). */
    uint8_t hdr[EI_HEADER_SIZE];
    memcpy(hdr, p->base, EI_HEADER_SIZE);
    ei_frame_ring_header *h = (ei_frame_ring_header *)hdr;
    if (!strcmp(kind, "colour-on-rgb")) h->colorimetry = 9;
    if (!strcmp(kind, "yuv-odd")) {
        h->pixel_format = EI_PIX_NV12;
        h->channels = 1;
        h->width = h->row_stride = h->width | 1;
    }
    if (pwrite(fd, hdr, EI_HEADER_SIZE, 0) != EI_HEADER_SIZE) die("pwrite", NULL);
    if (!strcmp(kind, "unsealed")) return fd;
    int seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
    if (!strcmp(kind, "write-sealed")) seals |= F_SEAL_WRITE;
    if (fcntl(fd, F_ADD_SEALS, seals)) die("seal", NULL);
    return fd;
}

static void attack_fd(const char *kind) {
    ei_frame_producer p;
    make_ring(&p, width, height);
    ei_hello h;
    ei_error e;
    if (ei_hello_make(&h, EI_ROLE_PRODUCER, stream, &e) != EI_OK) die("hello", &e);
    if (!strcmp(kind, "none")) { send_with_fds(&h, sizeof h, NULL, 0); return; }
    if (!strcmp(kind, "garbage")) {
        char junk[128];
        for (size_t i = 0; i < sizeof junk; i++) junk[i] = (char)(rand() & 0xff);
        send_with_fds(junk, sizeof junk, NULL, 0);
        return;
    }
    if (!strcmp(kind, "abi1")) { h.abi_version = 1; send_with_fds(&h, sizeof h, &p.fd, 1); return; }
    if (!strcmp(kind, "many")) {
        int fds[8];
        for (int i = 0; i < 8; i++) fds[i] = p.fd;
        send_with_fds(&h, sizeof h, fds, 8);
        return;
    }
    if (!strcmp(kind, "after")) { /* a proper handshake, then more bytes on the connection */
        ei_ingress in;
        int rc = hand_over(&in, stream, p.fd, &e);
        printf("HANDSHAKE=%d\n", rc);
        if (rc == EI_OK) {
            send(in.sock, "more", 4, MSG_NOSIGNAL);
            struct pollfd pf = {in.sock, POLLIN, 0};
            poll(&pf, 1, 10000);
            rc = ei_reply_recv(in.sock, NULL, &e);
            printf("REPLY=%d %s\n", rc, rc ? e.msg : "nothing");
        }
        return;
    }
    int fd = fd_of_kind(kind, &p);
    send_with_fds(&h, sizeof h, &fd, 1);
}

int main(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "--socket")) sock_path = v;
        else if (!strcmp(a, "--stream")) stream = v;
        else if (!strcmp(a, "--attack")) attack = v;
        else if (!strcmp(a, "--width")) width = (uint32_t)atoi(v);
        else if (!strcmp(a, "--height")) height = (uint32_t)atoi(v);
        else if (!strcmp(a, "--count")) count = atol(v);
        else if (!strcmp(a, "--fps")) fps = atof(v);
        else if (!strcmp(a, "--seconds")) seconds = atof(v);
        else if (!strcmp(a, "--target-pid")) target_pid = atol(v);
        else if (!strcmp(a, "--format")) fmt = !strcmp(v, "gray8") ? EI_PIX_GRAY8 : EI_PIX_BGR24;
        else { fprintf(stderr, "unknown option %s\n", a); return 2; }
    }
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    ei_frame_producer p;
    ei_ingress in;
    ei_error e;
    if (!strcmp(attack, "impersonate")) {
        make_ring(&p, width, height);
        int rc = hand_over(&in, stream, p.fd, &e);
        if (rc == EI_OK) printf("ACCEPTED\n");
        else printf("REFUSED=%d %s\n", rc, e.msg);
        return 0;
    }
    if (!strcmp(attack, "latest-jump") || !strcmp(attack, "backdate") || !strcmp(attack, "short") ||
        !strcmp(attack, "flood")) {
        if (!connect_as_stream(&p, &in)) return 0;
        publish_for(&p, &in, seconds, !strcmp(attack, "backdate") ? (uint64_t)count * 1000000ull : 0,
                    !strcmp(attack, "short") ? 100 : 0, !strcmp(attack, "latest-jump"));
        return 0;
    }
    if (!strcmp(attack, "forge-ids")) {
        if (!connect_as_stream(&p, &in)) return 0;
        uint64_t now = ei_now_ns(CLOCK_MONOTONIC), end = now + (uint64_t)(seconds * 1e9);
        long published = 0, jumps = 0;
        while ((now = ei_now_ns(CLOCK_MONOTONIC)) < end) {
            if (published % 10 == 9) { /* the daemon sees 2^50 frames skipped: counters must saturate, not wrap */
                p.next_seq += UINT64_C(1) << 50;
                jumps++;
            }
            uint8_t *px = ei_frame_producer_begin(&p);
            memset(px, (int)(published & 0xff), ei_frame_bytes(&p.layout));
            uint64_t id = published % 2 ? UINT64_MAX : (UINT64_C(1) << 63) + (uint64_t)published;
            ei_frame_producer_publish(&p, now, ei_now_ns(CLOCK_REALTIME), id, ei_frame_bytes(&p.layout));
            published++;
            ei_ingress_step(&in, now);
            struct timespec ts = {0, fps > 0 ? (long)(1e9 / fps) : 1000000L};
            nanosleep(&ts, NULL);
        }
        printf("PUBLISHED=%ld\nJUMPS=%ld\n", published, jumps);
        return 0;
    }
    if (!strcmp(attack, "bell-spam") || !strcmp(attack, "flag-flip")) {
        if (!connect_as_stream(&p, &in)) return 0;
        uint64_t now = ei_now_ns(CLOCK_MONOTONIC), end = now + (uint64_t)(seconds * 1e9), next = now;
        uint64_t period = fps > 0 ? (uint64_t)(1e9 / fps) : 0;
        long wakes = 0, woken = 0, published = 0, flips = 0;
        const int flip = !strcmp(attack, "flag-flip");
        while ((now = ei_now_ns(CLOCK_MONOTONIC)) < end) {
            if (period && now >= next) {
                ei_frame_producer_begin(&p);
                ei_frame_producer_publish(&p, now, ei_now_ns(CLOCK_REALTIME), p.next_seq, ei_frame_bytes(&p.layout));
                published++;
                next += period;
            }
            for (int k = 0; k < 64; k++) { /* rung, with nothing new in the ring */
                if (flip) { /* ...but a flag changed: CLOSED, then an undefined bit, then back to 0 */
                    atomic_store(&p.hdr->flags, (uint32_t)(flips % 3 == 0 ? EI_RING_CLOSED : flips % 3 == 1 ? 0x100u : 0u));
                    flips++;
                }
                atomic_fetch_add(&p.hdr->doorbell, 1);
                int n = ei_futex_wake(&p.hdr->doorbell);
                wakes++;
                if (n > 0) woken += n;
            }
            ei_ingress_step(&in, now);
        }
        printf("WAKES=%ld\nWOKEN=%ld\nPUBLISHED=%ld\nFLIPS=%ld\n", wakes, woken, published, flips);
        return 0;
    }
    if (!strcmp(attack, "rehand")) {
        /* One ring, handed over again and again: the geometry never changes, so only a count of hand-overs
         * can stop it. Each accepted connection is hung up before the next one. */
        make_ring(&p, width, height);
        uint64_t now = ei_now_ns(CLOCK_MONOTONIC), end = now + (uint64_t)(seconds * 1e9), next = now;
        uint64_t period = fps > 0 ? (uint64_t)(1e9 / fps) : 0;
        long accepted = 0, refused = 0, published = 0;
        while ((now = ei_now_ns(CLOCK_MONOTONIC)) < end) {
            int rc = hand_over(&in, stream, p.fd, &e);
            if (rc == EI_OK) {
                accepted++;
            } else {
                refused++;
                if (refused == 1) printf("FIRST_REFUSAL=%d %s\n", rc, e.msg);
            }
            /* A few frames on it, then hang up and hand it over again (about 40 times a second). */
            for (uint64_t until = now + 25000000ull; (now = ei_now_ns(CLOCK_MONOTONIC)) < until && now < end;) {
                if (period && now >= next) {
                    ei_frame_producer_begin(&p);
                    ei_frame_producer_publish(&p, now, ei_now_ns(CLOCK_REALTIME), p.next_seq,
                                              ei_frame_bytes(&p.layout));
                    published++;
                    next += period;
                }
                usleep(1000);
            }
            if (in.sock >= 0) ei_ingress_close(&in);
        }
        printf("ACCEPTED=%ld\nREFUSED=%ld\nPUBLISHED=%ld\n", accepted, refused, published);
        return 0;
    }
    if (!strcmp(attack, "geometry-cycle")) {
        long accepted = 0, refused = 0;
        for (long i = 0; i < count; i++) {
            make_ring(&p, width + 8 * (uint32_t)(i % 50), height + 8 * (uint32_t)(i % 50));
            int rc = hand_over(&in, stream, p.fd, &e);
            if (rc == EI_OK) {
                accepted++;
                ei_frame_producer_begin(&p);
                ei_frame_producer_publish(&p, ei_now_ns(CLOCK_MONOTONIC), 0, 1, ei_frame_bytes(&p.layout));
                usleep(20000);
            } else {
                refused++;
                if (refused == 1) printf("FIRST_REFUSAL=%d %s\n", rc, e.msg);
            }
            ei_ingress_close(&in);
            ei_frame_producer_close(&p);
        }
        printf("ACCEPTED=%ld\nREFUSED=%ld\n", accepted, refused);
        return 0;
    }
    if (!strcmp(attack, "procfd")) {
        char dir[64], path[384];
        snprintf(dir, sizeof dir, "/proc/%ld/fd", target_pid);
        long opened = 0, denied = 0;
        DIR *d = opendir(dir);
        if (!d) { printf("OPENED=0\nDENIED=all (%s: %s)\n", dir, strerror(errno)); return 0; }
        struct dirent *de;
        while ((de = readdir(d))) {
            if (de->d_name[0] == '.') continue;
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            int fd = open(path, O_RDWR);
            if (fd >= 0) { opened++; close(fd); } else denied++;
        }
        closedir(d);
        printf("OPENED=%ld\nDENIED=%ld\n", opened, denied);
        return 0;
    }
    if (!strncmp(attack, "fd-", 3)) { attack_fd(attack + 3); return 0; }
    if (!strcmp(attack, "slowloris")) {
        int *s = calloc((size_t)count, sizeof *s);
        long opened = 0;
        for (long i = 0; i < count; i++) {
            s[i] = ei_sock_connect(sock_path, &e);
            opened += s[i] >= 0;
        }
        uint64_t end = ei_now_ns(CLOCK_MONOTONIC) + (uint64_t)(seconds * 1e9);
        long closed = 0;
        while (ei_now_ns(CLOCK_MONOTONIC) < end) usleep(50000);
        for (long i = 0; i < count; i++)
            if (s[i] >= 0 && !ei_sock_alive(s[i])) closed++;
        printf("OPENED=%ld\nCLOSED_BY_DAEMON=%ld\n", opened, closed);
        return 0;
    }
    fprintf(stderr, "unknown attack '%s'\n", attack);
    return 2;
}
