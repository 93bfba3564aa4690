/* The linger attack (issue 23, A; issue 35, 12): hands the daemon fds whose close() blocks.
 *
 * Each fd is the client end of a loopback TCP connection whose peer never
 * reads (it is never even accepted), with the send buffer full and SO_LINGER
 * {1, L}: the last close() of it waits up to L seconds for data that cannot
 * leave. This program closes its own copy after sending, so the daemon holds
 * the last reference. What is handed over (--payload):
 *   socket   - the stuck socket itself
 *   nested   - a Unix socket holding, in its queue, a Unix socket holding ... (--depth D levels) the stuck socket
 *   listener - a Unix listener with --queued N connections waiting, the last 8 of them holding a stuck socket
 *              in their queue (a closer that accepts fewer than N closes the listener holding them)
 *   file     - --file PATH opened read-only (a file on tests/adversary/fuse_noflush.c's mount: each close() of
 *              it waits for a FLUSH answer that never comes); this program keeps its own copies open
 * Ways to hand one over (each round, on each socket):
 *   hello   - as the fd of a hello (a producer hello on ingress.sock, a
 *             reader hello on results.sock), for a stream we may not use
 *   extra   - two of them with one hello (the message is malformed)
 *   queued  - a hello without an fd, then a second message carrying one, left
 *             unread in the connection when the daemon closes it
 * then, with --flood N, N more connections to results.sock, each with a reader hello, held open,
 * and the listeners stay open (so the connections stay stuck) until the end.
 *
 * usage: linger --ingress PATH --results PATH --stream NAME --linger L
 *               --rounds N --interval-ms MS --hold S [--payload socket|nested|listener] [--depth D]
 *               [--queued N] [--file PATH] [--flood N]
 * prints SENT=<fds handed over> REPLIES=<replies read> REFUSED=<of them refusals>
 * EPIPE=<connections closed before the message went> LATE=<queued: closed after the hello, before the fd went>
 * CLOSED_BY_DAEMON=<connections the daemon closed> DEPTH=<levels of nesting the kernel took (nested)>
 * FLOOD=<flood connections made> FLOOD_REPLIES=<of them answered by the time all were made, and 5 s more> */
#define _GNU_SOURCE
#include <edgeinfer/ring.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>

static int listener_fd = -1;
static struct sockaddr_in listen_addr;

static void die(const char *what) { perror(what); exit(2); }

static void listen_once(void) {
    listener_fd = socket(AF_INET, SOCK_STREAM, 0);
    if (listener_fd < 0) die("socket");
    int small = 4096;
    setsockopt(listener_fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small); /* inherited by the unaccepted peer */
    memset(&listen_addr, 0, sizeof listen_addr);
    listen_addr.sin_family = AF_INET;
    listen_addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(listener_fd, (struct sockaddr *)&listen_addr, sizeof listen_addr)) die("bind");
    socklen_t len = sizeof listen_addr;
    if (getsockname(listener_fd, (struct sockaddr *)&listen_addr, &len)) die("getsockname");
    if (listen(listener_fd, 4096)) die("listen");
}

/* A connected TCP socket with a full send buffer and SO_LINGER {1, secs}. */
static int stuck_socket(int secs) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0) die("socket");
    int small = 4096;
    setsockopt(s, SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
    if (connect(s, (struct sockaddr *)&listen_addr, sizeof listen_addr)) die("connect");
    static char junk[65536];
    int fl = fcntl(s, F_GETFL);
    fcntl(s, F_SETFL, fl | O_NONBLOCK);
    int full = 0;
    for (int i = 0; i < 100000 && !full; i++) {
        ssize_t n = send(s, junk, sizeof junk, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno != EAGAIN) die("send");
            struct timespec ts = {0, 2000000}; /* the window may still be closing: make sure it is full */
            nanosleep(&ts, NULL);
            full = send(s, junk, sizeof junk, MSG_NOSIGNAL) < 0 && errno == EAGAIN;
        }
    }
    if (!full) { fprintf(stderr, "could not fill the send buffer\n"); exit(2); }
    fcntl(s, F_SETFL, fl);
    struct linger lg = {1, secs};
    if (setsockopt(s, SOL_SOCKET, SO_LINGER, &lg, sizeof lg)) die("SO_LINGER");
    return s;
}

static int sent, replies, refused, closed_by_daemon, epipe, late, depth_taken = -1;
static int send_with(int s, const void *msg, size_t len, const int *fds, int nfds);
static const char *payload = "socket", *file_path = "";
static int depth = 6, queued = 1100;

/* Sends `fd` over `s` (SCM_RIGHTS, one byte of data); 0 or -1 (errno). */
static int pass_fd(int s, int fd) {
    char byte = 'x';
    struct iovec iov = {&byte, 1};
    union { struct cmsghdr align; char buf[CMSG_SPACE(sizeof(int))]; } ctl;
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof(int));
    return sendmsg(s, &mh, MSG_NOSIGNAL) == 1 ? 0 : -1;
}

/* A Unix socket holding `inner` in its queue (we keep no other reference to `inner`), or -1 (errno) if the
 * kernel refuses to nest it (inner is then closed abortively). */
static int wrap(int inner) {
    int sp[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp)) die("socketpair");
    int rc = pass_fd(sp[0], inner), err = errno;
    if (rc) {
        struct linger now = {1, 0};
        setsockopt(inner, SOL_SOCKET, SO_LINGER, &now, sizeof now);
    }
    close(inner);
    close(sp[0]);
    if (rc) { close(sp[1]); errno = err; return -1; }
    return sp[1];
}

/* The fd to hand over, per --payload. */
static int make_payload(int secs) {
    if (!strcmp(payload, "file")) { /* kept open: our own close of it would block too (FLUSH is sent on each) */
        int f = open(file_path, O_RDONLY | O_CLOEXEC);
        if (f < 0) die(file_path);
        return f;
    }
    int fd = stuck_socket(secs);
    if (!strcmp(payload, "nested")) {
        int d = 0;
        for (; d < depth; d++) {
            int outer = wrap(fd);
            if (outer < 0) {
                if (errno != ETOOMANYREFS) die("nest");
                return socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0); /* cannot happen at the depth we ask */
            }
            fd = outer;
        }
        if (depth_taken < 0 || d < depth_taken) depth_taken = d;
        return fd;
    }
    if (!strcmp(payload, "listener")) {
        char path[108];
        snprintf(path, sizeof path, "/tmp/linger-l-%d-%d", (int)getpid(), sent);
        int l = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
        unlink(path);
        if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, queued)) die("listener");
        for (int i = 0; i < queued; i++) {
            int c = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
            if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof a)) die("connect to our listener");
            if (i >= queued - 8) {
                int stuck = i == queued - 8 ? fd : stuck_socket(secs);
                if (pass_fd(c, stuck)) die("pass into a queued connection");
                close(stuck);
            }
            close(c);
        }
        unlink(path);
        return l;
    }
    return fd;
}

/* N connections to `path`, each with a reader hello for `stream`, held open; prints FLOOD= and FLOOD_REPLIES=. */
static void flood(const char *path, const char *stream, int n) {
    ei_hello h;
    ei_error e;
    if (ei_hello_make(&h, EI_ROLE_READER, stream, &e)) { fprintf(stderr, "%s\n", e.msg); exit(2); }
    int *s = calloc(n, sizeof *s), made = 0, answered = 0;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    /* Non-blocking, retried while the backlog is full (EAGAIN), for up to 30 s: a daemon that accepts nothing
     * leaves it full. */
    struct timespec pause = {0, 1000000}, start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (int i = 0; i < n; i++) {
        s[i] = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (s[i] < 0) die("socket");
        int rc;
        while ((rc = connect(s[i], (struct sockaddr *)&a, sizeof a)) && errno == EAGAIN) {
            clock_gettime(CLOCK_MONOTONIC, &now);
            if (now.tv_sec - start.tv_sec > 30) break;
            nanosleep(&pause, NULL);
        }
        if (rc == 0 && send_with(s[i], &h, sizeof h, NULL, 0) == 0) {
            made++;
        } else {
            close(s[i]);
            s[i] = -1;
        }
    }
    struct timespec ts = {5, 0};
    nanosleep(&ts, NULL);
    for (int i = 0; i < n; i++) {
        struct pollfd p = {s[i], POLLIN, 0};
        answered += s[i] >= 0 && poll(&p, 1, 0) > 0 && (p.revents & POLLIN);
    }
    printf("FLOOD=%d\nFLOOD_REPLIES=%d\n", made, answered);
    fflush(stdout);
}

static int connect_to(const char *path) {
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (s < 0) die("socket");
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    if (connect(s, (struct sockaddr *)&a, sizeof a)) die("connect to the daemon");
    return s;
}

/* 0 once sent; -1 if the daemon had closed the connection already (EPIPE: refused before the hello). */
static int send_with(int s, const void *msg, size_t len, const int *fds, int nfds) {
    struct iovec iov = {(void *)msg, len};
    union { struct cmsghdr align; char buf[CMSG_SPACE(4 * sizeof(int))]; } ctl;
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    if (nfds) {
        mh.msg_control = ctl.buf;
        mh.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(nfds * sizeof(int));
        memcpy(CMSG_DATA(cm), fds, nfds * sizeof(int));
    }
    if (sendmsg(s, &mh, MSG_NOSIGNAL) == (ssize_t)len) return 0;
    if (errno == EPIPE || errno == ECONNRESET) return -1;
    die("sendmsg");
    return -1;
}

/* The daemon's reply (or its close), waited for up to 5 s. */
static void read_reply(int s) {
    struct pollfd p = {s, POLLIN, 0};
    if (poll(&p, 1, 5000) <= 0) return;
    ei_reply r;
    ssize_t n = recv(s, &r, sizeof r, MSG_DONTWAIT);
    if (n == (ssize_t)sizeof r) {
        replies++;
        refused += r.status != EI_OK;
        if (poll(&p, 1, 5000) > 0 && recv(s, &r, sizeof r, MSG_DONTWAIT) == 0) closed_by_daemon++;
    } else if (n == 0) {
        closed_by_daemon++;
    }
}

static void attack(const char *path, uint32_t role, const char *stream, const char *how, int secs) {
    ei_hello h;
    ei_error e;
    if (ei_hello_make(&h, role, stream, &e)) { fprintf(stderr, "%s\n", e.msg); exit(2); }
    int fds[2] = {make_payload(secs), strcmp(how, "extra") ? -1 : make_payload(secs)};
    /* Connected after the sockets are stuck, and the message sent at once: it waits in the connection before the
     * daemon even accepts it (a daemon that refuses before reading a hello closes a connection holding it). */
    int s = connect_to(path);
    int rc, delivered = 1, hello_went = 0;
    if (!strcmp(how, "hello")) {
        rc = send_with(s, &h, sizeof h, fds, 1);
    } else if (!strcmp(how, "extra")) {
        rc = send_with(s, &h, sizeof h, fds, 2);
        delivered = 2;
    } else { /* queued: the fd rides a second message, never read */
        rc = send_with(s, &h, sizeof h, NULL, 0);
        hello_went = rc == 0;
        if (rc == 0) rc = send_with(s, &h, sizeof h, fds, 1);
    }
    if (rc == 0) {
        sent += delivered; /* the daemon holds the last reference now */
    } else {
        if (hello_went) late++; /* the daemon answered the hello and closed before the fd's message went */
        else epipe++;
        /* Not delivered: kept open (closing it would hold us on what it hides) until our exit, whose closes do not
         * linger here. */
        fds[0] = fds[1] = -1;
    }
    for (int i = 0; i < 2; i++)
        if (fds[i] >= 0 && strcmp(payload, "file")) close(fds[i]);
    read_reply(s);
    close(s);
}

int main(int argc, char **argv) {
    const char *ingress = NULL, *results = NULL, *stream = "victim";
    int secs = 30, rounds = 4, interval_ms = 500, hold = 0, flood_n = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--ingress")) ingress = argv[i + 1];
        else if (!strcmp(argv[i], "--results")) results = argv[i + 1];
        else if (!strcmp(argv[i], "--stream")) stream = argv[i + 1];
        else if (!strcmp(argv[i], "--linger")) secs = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--interval-ms")) interval_ms = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--hold")) hold = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--payload")) payload = argv[i + 1];
        else if (!strcmp(argv[i], "--depth")) depth = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--file")) file_path = argv[i + 1];
        else if (!strcmp(argv[i], "--queued")) queued = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--flood")) flood_n = atoi(argv[i + 1]);
        else { fprintf(stderr, "unknown option %s\n", argv[i]); return 2; }
    }
    if (!ingress || !results) { fprintf(stderr, "--ingress and --results are required\n"); return 2; }
    listen_once();
    static const char *hows[] = {"hello", "extra", "queued"};
    for (int r = 0; r < rounds; r++) {
        const char *how = hows[r % 3];
        attack(ingress, EI_ROLE_PRODUCER, stream, how, secs);
        attack(results, EI_ROLE_READER, stream, how, secs);
        printf("ROUND=%d %s\n", r, how);
        fflush(stdout);
        struct timespec ts = {interval_ms / 1000, (interval_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (flood_n) flood(results, stream, flood_n);
    printf("SENT=%d\nREPLIES=%d\nREFUSED=%d\nEPIPE=%d\nLATE=%d\nDEPTH=%d\nCLOSED_BY_DAEMON=%d\n", sent, replies,
           refused, epipe, late, depth_taken, closed_by_daemon);
    fflush(stdout);
    sleep(hold); /* the connections stay stuck while the listener lives */
    return 0;
}
