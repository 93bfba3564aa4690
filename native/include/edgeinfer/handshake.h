/*
 * The edgeinfer handshake and the connections built on it: Unix
 * SOCK_SEQPACKET, one message each way, fds by SCM_RIGHTS, identity by
 * SO_PEERCRED. A producer hands its frame ring over and keeps the connection
 * (ei_ingress: non-blocking, reconnects with backoff, says which failures are
 * transient); a reader asks for a stream's result ring and attaches to it
 * (ei_results_connect, ei_result_reader_attach). The daemon's side of each
 * message (ei_hello_check, ei_reply_send, ei_peer_cred, ei_sock_recv_fds) is
 * here too, so that both ends speak from one definition.
 *
 * Part of <edgeinfer/ring.h>, which is what a producer or reader includes.
 */
#ifndef EDGEINFER_HANDSHAKE_H
#define EDGEINFER_HANDSHAKE_H

#include <edgeinfer/abi.h>
#include <edgeinfer/client.h>

#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* The handshake: Unix SOCK_SEQPACKET, one message each way, fds by    */
/* SCM_RIGHTS, identity by SO_PEERCRED                                 */
/* ------------------------------------------------------------------ */

/* A non-blocking, close-on-exec SEQPACKET connection to `path`. Returns the fd
 * or an ei_status: EI_ERR_NOT_FOUND (no socket / no daemon listening), EI_ERR_DENIED
 * (no permission on the socket), EI_ERR_AGAIN (its backlog is full). */
static inline int ei_sock_connect(const char *path, ei_error *err) {
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof sa.sun_path) return ei_fail(err, EI_ERR_ARG, 0, "socket path too long: %s", path);
    strcpy(sa.sun_path, path);
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0) return ei_fail(err, EI_ERR_SYS, errno, "socket: %s", strerror(errno));
    if (connect(s, (struct sockaddr *)&sa, sizeof sa) == 0) return s;
    int e = errno;
    close(s);
    if (e == ENOENT || e == ECONNREFUSED)
        return ei_fail(err, EI_ERR_NOT_FOUND, e, "no edgeinferd listens on %s (%s)", path, strerror(e));
    if (e == EACCES || e == EPERM)
        return ei_fail(err, EI_ERR_DENIED, e, "%s: permission denied (only the socket's group, normally edgeinfer, "
                       "may connect)", path);
    if (e == EAGAIN) return ei_fail(err, EI_ERR_AGAIN, e, "%s: the daemon's backlog is full", path);
    return ei_fail(err, EI_ERR_SYS, e, "connect %s: %s", path, strerror(e));
}

/* Sends one message, with `fd` attached by SCM_RIGHTS when fd >= 0. Never
 * blocks and never raises SIGPIPE. */
static inline int ei_sock_send(int sock, const void *msg, size_t len, int fd, ei_error *err) {
    struct iovec iov = {(void *)(uintptr_t)msg, len};
    struct msghdr mh;
    memset(&mh, 0, sizeof mh);
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    if (fd >= 0) {
        memset(&ctl, 0, sizeof ctl);
        mh.msg_control = ctl.buf;
        mh.msg_controllen = sizeof ctl.buf;
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &fd, sizeof(int));
    }
    ssize_t n = sendmsg(sock, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n == (ssize_t)len) return EI_OK;
    if (n >= 0) return ei_fail(err, EI_ERR_PROTOCOL, 0, "short send (%zd of %zu bytes)", n, len);
    if (errno == EAGAIN) return ei_fail(err, EI_ERR_WOULDBLOCK, EAGAIN, "the peer's socket buffer is full");
    if (errno == EPIPE || errno == ECONNRESET) return ei_fail(err, EI_ERR_CLOSED, errno, "the peer closed the connection");
    return ei_fail(err, EI_ERR_SYS, errno, "sendmsg: %s", strerror(errno));
}

/* The most fds one message can carry (the kernel's SCM_MAX_FD). */
#define EI_SOCK_MAX_FDS 253

/* Closes an fd a peer sent, without ever blocking on it: a socket is first set
 * to SO_LINGER {1, 0} (an abortive close), so that a TCP socket whose send
 * buffer is full cannot hold close() for its linger time. (A peer can make a
 * close block in other ways, a Unix socket holding such a socket in its queue
 * say: the daemon closes received fds on a thread of their own.) */
static inline void ei_fd_close_received(int fd) {
    struct linger abort_now = {1, 0};
    (void)setsockopt(fd, SOL_SOCKET, SO_LINGER, &abort_now, sizeof abort_now); /* ENOTSOCK: not a socket */
    close(fd);
}

/* Receives one message of exactly `len` bytes without blocking, and hands
 * every fd that came with it to the caller: fds[0 .. *nfds), room for
 * EI_SOCK_MAX_FDS, so that the kernel never drops one here (dropping the last
 * reference to a lingering socket would block this call). The caller owns
 * them whatever the return. Returns EI_OK, EI_ERR_WOULDBLOCK (nothing yet),
 * EI_ERR_CLOSED (the peer closed), EI_ERR_AGAIN (the fds could not be taken:
 * this process is at its open-file limit), or EI_ERR_PROTOCOL (wrong size). */
static inline int ei_sock_recv_fds(int sock, void *msg, size_t len, int fds[EI_SOCK_MAX_FDS], int *nfds,
                                   ei_error *err) {
    *nfds = 0;
    char over[1];
    struct iovec iov[2] = {{msg, len}, {over, sizeof over}};
    struct msghdr mh;
    memset(&mh, 0, sizeof mh);
    mh.msg_iov = iov;
    mh.msg_iovlen = 2;
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(EI_SOCK_MAX_FDS * sizeof(int))];
    } ctl;
    mh.msg_control = ctl.buf;
    mh.msg_controllen = sizeof ctl.buf;
    ssize_t n = recvmsg(sock, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) {
        if (errno == EAGAIN) return ei_fail(err, EI_ERR_WOULDBLOCK, EAGAIN, "no message yet");
        if (errno == ECONNRESET) return ei_fail(err, EI_ERR_CLOSED, errno, "the peer closed the connection");
        return ei_fail(err, EI_ERR_SYS, errno, "recvmsg: %s", strerror(errno));
    }
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
        size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k && *nfds < EI_SOCK_MAX_FDS; i++)
            memcpy(&fds[(*nfds)++], CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
    }
    if (n == 0 && *nfds == 0) return ei_fail(err, EI_ERR_CLOSED, 0, "the peer closed the connection");
    /* With room for every fd a message can carry, only the receiver's own open-file limit truncates. */
    if (mh.msg_flags & MSG_CTRUNC)
        return ei_fail(err, EI_ERR_AGAIN, EMFILE, "the message's fds could not be received (the receiver is at its "
                       "open-file limit); try again");
    if ((size_t)n != len || (mh.msg_flags & MSG_TRUNC))
        return ei_fail(err, EI_ERR_PROTOCOL, 0, "malformed message (wrong message size: %zd bytes)", n);
    return EI_OK;
}

/* Receives one message of exactly `len` bytes without blocking, and at most
 * one fd (*fd_out, -1 if none; pass fd_out NULL to accept none). Every fd
 * beyond what is accepted is closed here (ei_fd_close_received), never
 * leaked. Returns EI_OK, EI_ERR_WOULDBLOCK (nothing yet), EI_ERR_CLOSED (the
 * peer closed), or EI_ERR_PROTOCOL (wrong size, truncated, too many fds). */
static inline int ei_sock_recv(int sock, void *msg, size_t len, int *fd_out, ei_error *err) {
    if (fd_out) *fd_out = -1;
    int fds[EI_SOCK_MAX_FDS], nfds = 0;
    int rc = ei_sock_recv_fds(sock, msg, len, fds, &nfds, err);
    int keep = rc == EI_OK && fd_out && nfds == 1;
    for (int i = keep; i < nfds; i++) ei_fd_close_received(fds[i]);
    if (rc != EI_OK) return rc;
    if (nfds > (fd_out ? 1 : 0))
        return ei_fail(err, EI_ERR_PROTOCOL, 0, "malformed message (more fds than %s: %zu bytes, %d fds)",
                       fd_out ? "one" : "none", len, nfds);
    if (keep) *fd_out = fds[0];
    return EI_OK;
}

/* Fills a hello for `stream`. */
static inline int ei_hello_make(ei_hello *h, uint32_t role, const char *stream, ei_error *err) {
    size_t len = strlen(stream);
    if (!ei_stream_name_ok(stream, len))
        return ei_fail(err, EI_ERR_ARG, 0, "invalid stream name '%.80s': 1-%u of letters, digits, '_' or '-', "
                       "starting with a letter or digit", stream, EI_STREAM_NAME_MAX);
    memset(h, 0, sizeof *h);
    memcpy(h->magic, EI_HELLO_MAGIC, 8);
    h->abi_version = EI_ABI_VERSION;
    h->role = role;
    memcpy(h->stream, stream, len);
    return EI_OK;
}

/* The daemon's side: checks a received hello. Fills stream_out (NUL-terminated). */
static inline int ei_hello_check(const ei_hello *h, char stream_out[EI_STREAM_NAME_MAX + 1], ei_error *err) {
    if (memcmp(h->magic, EI_HELLO_MAGIC, 8) != 0)
        return ei_fail(err, EI_ERR_PROTOCOL, 0, "not an edgeinfer hello (bad magic)");
    if (h->abi_version != EI_ABI_VERSION)
        return ei_fail(err, EI_ERR_ABI, 0, "client speaks ABI %u, this daemon ABI %u", h->abi_version, EI_ABI_VERSION);
    if (h->role != EI_ROLE_PRODUCER && h->role != EI_ROLE_READER)
        return ei_fail(err, EI_ERR_PROTOCOL, 0, "unknown role %u", h->role);
    size_t len = strnlen(h->stream, EI_STREAM_NAME_MAX);
    for (size_t i = len; i < EI_STREAM_NAME_MAX; i++)
        if (h->stream[i]) return ei_fail(err, EI_ERR_PROTOCOL, 0, "stream name not NUL-padded");
    if (!ei_stream_name_ok(h->stream, len))
        return ei_fail(err, EI_ERR_ARG, 0, "invalid stream name (1-%u of letters, digits, '_' or '-')",
                       EI_STREAM_NAME_MAX);
    memcpy(stream_out, h->stream, len);
    stream_out[len] = 0;
    return EI_OK;
}

/* The daemon's side: one reply (with fd attached when fd >= 0). */
static inline int ei_reply_send(int sock, int status, const char *msg, int fd, ei_error *err) {
    ei_reply r;
    memset(&r, 0, sizeof r);
    memcpy(r.magic, EI_REPLY_MAGIC, 8);
    r.abi_version = EI_ABI_VERSION;
    r.status = status;
    snprintf(r.msg, sizeof r.msg, "%s", msg ? msg : "");
    return ei_sock_send(sock, &r, sizeof r, fd, err);
}

/* A client's side: receives one reply (and its fd, when fd_out != NULL).
 * EI_OK when the daemon accepted; its refusal's status and words otherwise. */
static inline int ei_reply_recv(int sock, int *fd_out, ei_error *err) {
    ei_reply r;
    int rc = ei_sock_recv(sock, &r, sizeof r, fd_out, err);
    if (rc) return rc;
    if (memcmp(r.magic, EI_REPLY_MAGIC, 8) != 0 || r.abi_version != EI_ABI_VERSION) {
        if (fd_out && *fd_out >= 0) { close(*fd_out); *fd_out = -1; }
        return ei_fail(err, EI_ERR_PROTOCOL, 0, "not an edgeinfer ABI %u reply", EI_ABI_VERSION);
    }
    r.msg[EI_MSG_LEN - 1] = 0;
    if (r.status == EI_OK) return EI_OK;
    if (fd_out && *fd_out >= 0) { close(*fd_out); *fd_out = -1; }
    return ei_fail(err, r.status < 0 ? r.status : EI_ERR_REFUSED, 0, "edgeinferd: %s", r.msg);
}

/* 1 while the peer keeps the connection open, 0 once it closed (or said
 * goodbye: a message is pending). Never blocks. */
static inline int ei_sock_alive(int sock) {
    struct pollfd p = {sock, POLLIN | POLLRDHUP, 0};
    int n = poll(&p, 1, 0);
    return n == 0 || (n < 0 && errno == EINTR);
}

/* The credentials of the peer of a connected Unix socket, as the kernel
 * recorded them at connect() (SO_PEERCRED). */
static inline int ei_peer_cred(int sock, uint32_t *uid, uint32_t *gid, int32_t *pid, ei_error *err) {
    struct ucred uc;
    socklen_t len = sizeof uc;
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &uc, &len) != 0)
        return ei_fail(err, EI_ERR_SYS, errno, "SO_PEERCRED: %s", strerror(errno));
    *uid = uc.uid;
    *gid = uc.gid;
    *pid = uc.pid;
    return EI_OK;
}

/* Waits (poll) until `sock` is readable or `timeout_ns` passes. */
static inline int ei__wait_readable(int sock, uint64_t timeout_ns) {
    struct pollfd p = {sock, POLLIN, 0};
    int ms = (int)((timeout_ns + 999999) / 1000000);
    int n = poll(&p, 1, ms < 0 ? 0 : ms);
    return n > 0;
}

/* ------------------------------------------------------------------ */
/* A producer's connection: hand the ring over, keep the connection,   */
/* reconnect with backoff. Never blocks.                               */
/* ------------------------------------------------------------------ */

enum ei_ingress_state {
    EI_INGRESS_DISCONNECTED = 0, /* no connection; the next attempt is due at retry_at_ns */
    EI_INGRESS_HANDSHAKE = 1,    /* hello sent with the ring; waiting for the reply */
    EI_INGRESS_CONNECTED = 2,    /* the daemon accepted the ring and holds the connection */
};

#define EI_BACKOFF_MIN_NS 50000000ull      /* first retry after 50 ms */
#define EI_BACKOFF_MAX_NS 5000000000ull    /* then doubling up to 5 s */
#define EI_BUSY_QUICK_NS 2000000000ull     /* BUSY (the stream's previous producer not gone yet: a camera restarting)
                                              is retried every EI_BACKOFF_MIN_NS for this long, then with the backoff */
#define EI_HANDSHAKE_TIMEOUT_NS 30000000000ull /* the daemon may build and warm a model session meanwhile */
#define EI_ALIVE_CHECK_NS 100000000ull     /* liveness check every 100 ms while connected */

typedef struct ei_ingress {
    int sock;                  /* owns: the connection to the daemon, -1 while disconnected */
    int ring_fd;               /* borrowed: the ring handed over at each (re)connection */
    int state;                 /* enum ei_ingress_state */
    int last_status;           /* ei_status of the last failure or refusal; EI_OK after an acceptance */
    uint64_t retry_at_ns;      /* CLOCK_MONOTONIC: when to try to connect next */
    uint64_t backoff_ns;       /* the current backoff; doubles per failure, reset on acceptance */
    uint64_t sent_at_ns;       /* when the hello went out (handshake timeout) */
    uint64_t check_at_ns;      /* next liveness check while connected */
    uint32_t accepted;         /* handshakes the daemon accepted so far */
    uint32_t attempts;         /* connection attempts so far */
    ei_hello hello;            /* what is sent on every (re)connection */
    char path[108];            /* the daemon's ingress socket */
    char last_msg[320];        /* why the last attempt failed (the daemon's words for a refusal) */
    int last_errno;            /* errno of the last failure when last_status is EI_ERR_SYS, else 0 */
    uint64_t busy_since_ns;    /* when the current run of BUSY refusals began, 0 if none */
} ei_ingress;

static inline int ei_ingress_init(ei_ingress *in, const char *path, const char *stream, int ring_fd, ei_error *err) {
    memset(in, 0, sizeof *in);
    in->sock = -1;
    in->ring_fd = ring_fd;
    in->backoff_ns = EI_BACKOFF_MIN_NS;
    int rc = ei_hello_make(&in->hello, EI_ROLE_PRODUCER, stream, err);
    if (rc) return rc;
    if (strlen(path) >= sizeof in->path) return ei_fail(err, EI_ERR_ARG, 0, "socket path too long: %s", path);
    strcpy(in->path, path);
    return EI_OK;
}

static inline void ei__ingress_drop(ei_ingress *in, uint64_t now_ns, const ei_error *why) {
    if (in->sock >= 0) close(in->sock);
    in->sock = -1;
    in->state = EI_INGRESS_DISCONNECTED;
    if (why && why->code == EI_ERR_BUSY) {
        /* The previous producer of the stream (this camera before its restart) is about to go: look again
         * soon, not after a backoff that doubled while it went. */
        if (!in->busy_since_ns) in->busy_since_ns = now_ns;
        if (now_ns - in->busy_since_ns < EI_BUSY_QUICK_NS) {
            in->retry_at_ns = now_ns + EI_BACKOFF_MIN_NS;
            in->backoff_ns = EI_BACKOFF_MIN_NS;
            goto said;
        }
    } else {
        in->busy_since_ns = 0;
    }
    in->retry_at_ns = now_ns + in->backoff_ns;
    in->backoff_ns = in->backoff_ns * 2 > EI_BACKOFF_MAX_NS ? EI_BACKOFF_MAX_NS : in->backoff_ns * 2;
said:
    if (why) {
        in->last_status = why->code;
        in->last_errno = why->code == EI_ERR_SYS ? why->sys_errno : 0;
        snprintf(in->last_msg, sizeof in->last_msg, "%s", why->msg);
    }
}

/* Advances the connection by whatever can be done now, never blocking:
 * connect and send the ring when a retry is due, take the reply, notice a
 * closed connection (then retry after a backoff). Cheap when nothing is due:
 * call it once per frame. Returns the state. */
static inline int ei_ingress_step(ei_ingress *in, uint64_t now_ns) {
    ei_error e;
    switch (in->state) {
    case EI_INGRESS_DISCONNECTED: {
        if (now_ns < in->retry_at_ns) return in->state;
        in->attempts++;
        int s = ei_sock_connect(in->path, &e);
        if (s < 0) { ei__ingress_drop(in, now_ns, &e); return in->state; }
        in->sock = s;
        if (ei_sock_send(s, &in->hello, sizeof in->hello, in->ring_fd, &e) != EI_OK) {
            ei__ingress_drop(in, now_ns, &e);
            return in->state;
        }
        in->state = EI_INGRESS_HANDSHAKE;
        in->sent_at_ns = now_ns;
        return in->state;
    }
    case EI_INGRESS_HANDSHAKE: {
        int rc = ei_reply_recv(in->sock, NULL, &e);
        if (rc == EI_ERR_WOULDBLOCK) {
            if (now_ns - in->sent_at_ns > EI_HANDSHAKE_TIMEOUT_NS) {
                ei_fail(&e, EI_ERR_TIMEOUT, 0, "%s: no reply to the handshake within %llu s", in->path,
                        EI_HANDSHAKE_TIMEOUT_NS / 1000000000ull);
                ei__ingress_drop(in, now_ns, &e);
            }
            return in->state;
        }
        if (rc != EI_OK) { ei__ingress_drop(in, now_ns, &e); return in->state; }
        in->state = EI_INGRESS_CONNECTED;
        in->accepted++;
        in->busy_since_ns = 0;
        in->last_errno = 0;
        in->last_status = EI_OK;
        in->last_msg[0] = 0;
        in->backoff_ns = EI_BACKOFF_MIN_NS;
        in->check_at_ns = now_ns + EI_ALIVE_CHECK_NS;
        return in->state;
    }
    default: /* connected */
        if (now_ns < in->check_at_ns) return in->state;
        in->check_at_ns = now_ns + EI_ALIVE_CHECK_NS;
        if (ei_sock_alive(in->sock)) return in->state;
        /* Closed, or a goodbye (a reply saying why the daemon dropped the stream) before the close. */
        if (ei_reply_recv(in->sock, NULL, &e) == EI_OK || e.code == EI_ERR_WOULDBLOCK)
            ei_fail(&e, EI_ERR_CLOSED, 0, "the daemon closed the connection");
        ei__ingress_drop(in, now_ns, &e);
        return in->state;
    }
}

/* 1 for a failure that can pass by itself: retry. Transient are EI_ERR_NOT_FOUND (no daemon yet),
 * EI_ERR_BUSY (the stream's previous producer not gone yet), EI_ERR_AGAIN (a saturated daemon, a stream
 * cooling down after geometry churn, a full backlog), EI_ERR_CLOSED (the daemon went away, e.g. restarting)
 * and EI_ERR_TIMEOUT (no reply in time). 0 for everything else: a refusal that stays until someone changes
 * the configuration or the camera (DENIED, ARG, GEOMETRY, INSECURE, ABI, PROTOCOL, REFUSED, ...), and
 * EI_ERR_SYS, whose errno decides: see ei_error_transient. */
static inline int ei_status_transient(int status) {
    return status == EI_ERR_NOT_FOUND || status == EI_ERR_BUSY || status == EI_ERR_AGAIN || status == EI_ERR_CLOSED ||
           status == EI_ERR_TIMEOUT;
}

/* 1 for the errnos of a failed system call that pass by themselves: EINTR, EAGAIN, and a shortage of memory
 * (ENOMEM, ENOBUFS) or of file descriptors (EMFILE, ENFILE). Any other errno (EINVAL, EBADF, ENOTSOCK,
 * EPROTOTYPE, ENAMETOOLONG, ELOOP, ...) is a mistake that retrying repeats forever. */
static inline int ei_errno_transient(int e) {
    return e == EINTR || e == EAGAIN || e == ENOMEM || e == ENOBUFS || e == EMFILE || e == ENFILE;
}

/* ei_status_transient, and an EI_ERR_SYS by its errno (ei_errno_transient). */
static inline int ei_error_transient(const ei_error *e) {
    return ei_status_transient(e->code) || (e->code == EI_ERR_SYS && ei_errno_transient(e->sys_errno));
}

/* Blocks up to timeout_ns for the first acceptance (for a producer starting
 * up: nothing is being published yet). EI_OK once connected; else the last
 * failure: the daemon's refusal, EI_ERR_NOT_FOUND (no daemon) or EI_ERR_TIMEOUT.
 * A refusal that cannot pass by waiting (EI_ERR_DENIED, EI_ERR_ARG, geometry,
 * a ring the daemon rejects) or a system call failure that will not pass
 * (EI_ERR_SYS with an errno ei_errno_transient calls permanent) returns at once. */
static inline int ei_ingress_wait(ei_ingress *in, uint64_t timeout_ns, ei_error *err) {
    uint64_t deadline = ei_now_ns(CLOCK_MONOTONIC) + timeout_ns;
    for (;;) {
        uint64_t now = ei_now_ns(CLOCK_MONOTONIC);
        int st = ei_ingress_step(in, now);
        if (st == EI_INGRESS_CONNECTED) return EI_OK;
        int s = in->last_status;
        if (st == EI_INGRESS_DISCONNECTED && s && !ei_status_transient(s) &&
            !(s == EI_ERR_SYS && ei_errno_transient(in->last_errno)))
            return ei_fail(err, s, in->last_errno, "%s", in->last_msg);
        if (now >= deadline)
            return ei_fail(err, s ? s : EI_ERR_TIMEOUT, in->last_errno, "%s", s ? in->last_msg : "no connection in time");
        if (st == EI_INGRESS_HANDSHAKE) {
            ei__wait_readable(in->sock, deadline - now < 100000000ull ? deadline - now : 100000000ull);
        } else {
            uint64_t until = in->retry_at_ns < deadline ? in->retry_at_ns : deadline;
            if (until > now) {
                struct timespec ts = {(time_t)((until - now) / 1000000000ull), (long)((until - now) % 1000000000ull)};
                nanosleep(&ts, NULL);
            }
        }
    }
}

static inline void ei_ingress_close(ei_ingress *in) {
    if (in->sock >= 0) close(in->sock);
    in->sock = -1;
    in->state = EI_INGRESS_DISCONNECTED;
}

/* ------------------------------------------------------------------ */
/* A reader's connection: ask for a stream's result ring               */
/* ------------------------------------------------------------------ */

/* Connects to the results socket, asks for `stream`, and waits up to
 * timeout_ns for the answer. On success *sock_out is the connection (keep it:
 * when it closes, the daemon is gone and the ring will not move again) and
 * *ring_fd_out the result ring (map it read-only). The caller owns both. */
static inline int ei_results_connect(const char *path, const char *stream, uint64_t timeout_ns, int *sock_out,
                                     int *ring_fd_out, ei_error *err) {
    *sock_out = *ring_fd_out = -1;
    ei_hello h;
    int rc = ei_hello_make(&h, EI_ROLE_READER, stream, err);
    if (rc) return rc;
    int s = ei_sock_connect(path, err);
    if (s < 0) return s;
    rc = ei_sock_send(s, &h, sizeof h, -1, err);
    uint64_t deadline = ei_now_ns(CLOCK_MONOTONIC) + timeout_ns;
    while (rc == EI_OK) {
        rc = ei_reply_recv(s, ring_fd_out, err);
        if (rc != EI_ERR_WOULDBLOCK) break;
        uint64_t now = ei_now_ns(CLOCK_MONOTONIC);
        if (now >= deadline) {
            rc = ei_fail(err, EI_ERR_TIMEOUT, 0, "%s: no reply within the timeout", path);
            break;
        }
        ei__wait_readable(s, deadline - now);
        rc = EI_OK; /* nothing yet: look again */
    }
    if (rc == EI_OK && *ring_fd_out < 0) rc = ei_fail(err, EI_ERR_PROTOCOL, 0, "%s: accepted, but no ring came", path);
    if (rc) {
        close(s);
        return rc;
    }
    *sock_out = s;
    return EI_OK;
}

/* Checks, maps (read-only) and starts reading a result ring fd from the
 * daemon. On success the caller owns *base_out (munmap(*base_out, *size_out));
 * the fd stays the caller's. */
static inline int ei_result_reader_attach(ei_result_reader *rd, int ring_fd, const char *name, int from_oldest,
                                          const uint8_t **base_out, uint64_t *size_out, ei_error *err) {
    uint64_t size = 0;
    int rc = ei_ring_fd_check(ring_fd, name, EI_RESULT_SEALS, 0, 0, (uint64_t)EI_MAX_RECORDS * (EI_MAX_PAYLOAD + 4096),
                              &size, err);
    if (rc) return rc;
    uint8_t *base;
    rc = ei_ring_map(ring_fd, size, 0, name, &base, err);
    if (rc) return rc;
    rc = ei_result_reader_init(rd, base, size, name, from_oldest, err);
    if (rc) {
        munmap(base, size);
        return rc;
    }
    *base_out = base;
    *size_out = size;
    return EI_OK;
}

#endif /* EDGEINFER_HANDSHAKE_H */
