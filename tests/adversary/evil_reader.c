/*
 * The worst result reader we can think of, for the isolation tests: it gets a stream's result ring the
 * honest way (the daemon lets it read), then tries to write, resize, forge and disturb. Plain C on
 * ring.h and libc, run as an unprivileged user. Prints "KEY=VALUE" lines.
 *
 *   evil_reader --socket P --stream S --attack A [--count N] [--seconds T]
 *
 * Attacks:
 *   write       every way we know to write or resize the ring, through the fd we got and through a
 *               reopened /proc/self/fd: each prints "<what>=<errno name or OK>"; WRITES_THAT_WORKED=<n>
 *   futex-spam  FUTEX_WAKE the ring's doorbell as fast as possible for T s: WAKES=<n>
 *   hold        open N reader connections and keep them T s: ACCEPTED=<n> REFUSED=<n> FIRST_REFUSAL=<why>
 *               STILL_HELD=<accepted connections the daemon had not closed after T s>
 *   silent      for T s keep N connections open on --socket (either socket: no stream needed) without ever
 *               sending a hello, opening a new one for each the daemon closes: CONNECTS=<n> AGAIN=<n>
 *               DENIED=<n> TIMED_OUT=<n> (refusals heard, by status; TIMED_OUT: dropped as silent)
 *               OTHER=<n> FIRST_REFUSAL=<status why> HELD_AT_END=<n>
 */
#include <edgeinfer/ring.h>

#include <signal.h>
#include <stdlib.h>

static const char *sock_path = EI_RESULTS_SOCKET, *stream = "cam0", *attack = "";
static long count = 10;
static double seconds = 3;
static int worked;

static void report(const char *what, int rc) {
    int e = errno;
    if (rc == 0) worked++;
    printf("%s=%s\n", what, rc == 0 ? "OK" : strerrorname_np(e) ? strerrorname_np(e) : "?");
}

static void try_writes(int fd, uint64_t size, const char *via) {
    char what[96];
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    snprintf(what, sizeof what, "%s.mmap_rw_shared", via);
    report(what, m == MAP_FAILED ? -1 : 0);
    if (m != MAP_FAILED) { memset(m, 0x42, 64); munmap(m, size); }
    void *ro = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    if (ro != MAP_FAILED) {
        snprintf(what, sizeof what, "%s.mprotect_rw", via);
        report(what, mprotect(ro, size, PROT_READ | PROT_WRITE));
        snprintf(what, sizeof what, "%s.madvise_remove", via);
        report(what, madvise(ro, 4096, MADV_REMOVE));
        munmap(ro, size);
    }
    char forged[128] = "forged result 90 degrees 0.999";
    snprintf(what, sizeof what, "%s.pwrite", via);
    report(what, pwrite(fd, forged, sizeof forged, EI_HEADER_SIZE) == (ssize_t)sizeof forged ? 0 : -1);
    snprintf(what, sizeof what, "%s.pwrite_head", via);
    uint64_t head = UINT64_C(1) << 62;
    report(what, pwrite(fd, &head, 8, 128) == 8 ? 0 : -1);
    snprintf(what, sizeof what, "%s.ftruncate_4096", via);
    report(what, ftruncate(fd, 4096));
    snprintf(what, sizeof what, "%s.ftruncate_grow", via);
    report(what, ftruncate(fd, (off_t)size + 4096));
    snprintf(what, sizeof what, "%s.fallocate_punch", via);
    report(what, fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096));
    snprintf(what, sizeof what, "%s.add_seal_write", via);
    report(what, fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE));
}

int main(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "--socket")) sock_path = v;
        else if (!strcmp(a, "--stream")) stream = v;
        else if (!strcmp(a, "--attack")) attack = v;
        else if (!strcmp(a, "--count")) count = atol(v);
        else if (!strcmp(a, "--seconds")) seconds = atof(v);
        else { fprintf(stderr, "unknown option %s\n", a); return 2; }
    }
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    ei_error e;
    int sock, fd;
    if (!strcmp(attack, "hold")) {
        long accepted = 0, refused = 0, held = 0;
        int *socks = calloc((size_t)count, sizeof *socks);
        for (long i = 0; i < count; i++) {
            int rc = ei_results_connect(sock_path, stream, 10000000000ull, &sock, &fd, &e);
            if (rc == EI_OK) { socks[accepted++] = sock; close(fd); }
            else if (!refused++) printf("FIRST_REFUSAL=%d %s\n", rc, e.msg);
        }
        printf("ACCEPTED=%ld\nREFUSED=%ld\n", accepted, refused);
        usleep((useconds_t)(seconds * 1e6));
        for (long i = 0; i < accepted; i++) held += ei_sock_alive(socks[i]);
        printf("STILL_HELD=%ld\n", held);
        return 0;
    }
    if (!strcmp(attack, "silent")) {
        int *s = malloc((size_t)count * sizeof *s);
        for (long i = 0; i < count; i++) s[i] = -1;
        long connects = 0, again = 0, denied = 0, timed_out = 0, other = 0, held = 0;
        char first[sizeof e.msg + 16] = "";
        uint64_t end = ei_now_ns(CLOCK_MONOTONIC) + (uint64_t)(seconds * 1e9);
        while (ei_now_ns(CLOCK_MONOTONIC) < end) {
            for (long i = 0; i < count; i++) {
                if (s[i] >= 0) {
                    if (ei_sock_alive(s[i])) continue;
                    int rc = ei_reply_recv(s[i], NULL, &e); /* the daemon's words, if it said any */
                    if (rc == EI_ERR_AGAIN) again++;
                    else if (rc == EI_ERR_DENIED) denied++;
                    else if (rc == EI_ERR_PROTOCOL) timed_out++;
                    else other++;
                    if (!first[0]) snprintf(first, sizeof first, "%d %s", rc, e.msg);
                    close(s[i]);
                }
                s[i] = ei_sock_connect(sock_path, &e);
                connects += s[i] >= 0;
            }
            usleep(5000);
        }
        for (long i = 0; i < count; i++) held += s[i] >= 0 && ei_sock_alive(s[i]);
        printf("CONNECTS=%ld\nAGAIN=%ld\nDENIED=%ld\nTIMED_OUT=%ld\nOTHER=%ld\nFIRST_REFUSAL=%s\nHELD_AT_END=%ld\n",
               connects, again, denied, timed_out, other, first, held);
        return 0;
    }
    int rc = ei_results_connect(sock_path, stream, 10000000000ull, &sock, &fd, &e);
    if (rc != EI_OK) { printf("REFUSED=%d %s\n", rc, e.msg); return 0; }
    struct stat st;
    fstat(fd, &st);
    printf("CONNECTED size=%lld\n", (long long)st.st_size);
    if (!strcmp(attack, "write")) {
        try_writes(fd, (uint64_t)st.st_size, "fd");
        char path[64];
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        int again = open(path, O_RDWR);
        report("reopen_rdwr", again < 0 ? -1 : 0);
        if (again >= 0) { worked--; try_writes(again, (uint64_t)st.st_size, "reopened"); }
        int ro = open(path, O_RDONLY);
        report("reopen_rdonly", ro < 0 ? -1 : 0);
        if (ro >= 0) worked--; /* reading is what readers may do */
        printf("WRITES_THAT_WORKED=%d\n", worked);
        return 0;
    }
    if (!strcmp(attack, "futex-spam")) {
        const uint8_t *base = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        if (base == MAP_FAILED) { printf("MMAP=%s\n", strerror(errno)); return 3; }
        const _Atomic uint32_t *bell = &((const ei_result_ring_header *)base)->doorbell;
        uint64_t end = ei_now_ns(CLOCK_MONOTONIC) + (uint64_t)(seconds * 1e9);
        long wakes = 0;
        while (ei_now_ns(CLOCK_MONOTONIC) < end) {
            syscall(SYS_futex, (const uint32_t *)bell, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
            wakes++;
        }
        printf("WAKES=%ld\n", wakes);
        return 0;
    }
    fprintf(stderr, "unknown attack '%s'\n", attack);
    return 2;
}
