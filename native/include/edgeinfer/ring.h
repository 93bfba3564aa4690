/*
 * edgeinfer shared-memory ABI, version 1.
 *
 * The single source of truth for the layout of frame rings and result rings
 * and for the protocol that moves frames through them. Header-only C11
 * (stdatomic + Linux futex syscalls): a camera producer includes this file and
 * needs no library. Compile with -std=gnu11 (or define _GNU_SOURCE before any
 * system header) on Linux x86_64 or aarch64. docs/abi.md explains every field,
 * the slot state machine and why the memory ordering is sufficient.
 *
 * Byte order is the host's: producer and consumer share one machine.
 */
#ifndef EDGEINFER_RING_H
#define EDGEINFER_RING_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifdef __cplusplus
#error "ring.h is C11: include it from a C translation unit"
#endif

/* Open-file-description locks (Linux >= 3.15); older libcs lack the names. */
#ifndef F_OFD_GETLK
#define F_OFD_GETLK 36
#define F_OFD_SETLK 37
#endif
#ifndef SYS_futex_waitv
#define SYS_futex_waitv 449
#endif
#ifndef FUTEX2_SIZE_U32
#define FUTEX2_SIZE_U32 0x02
#endif

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "64-bit atomics must be lock-free (address-free across processes)");
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "32-bit atomics must be lock-free (address-free across processes)");

/* ------------------------------------------------------------------ */
/* Constants                                                           */
/* ------------------------------------------------------------------ */

#define EI_ABI_VERSION 1u
#define EI_FRAME_MAGIC "EIFRAME1"   /* 8 bytes, no NUL stored */
#define EI_RESULT_MAGIC "EIRESLT1"
#define EI_HEADER_SIZE 4096u        /* header page; slot 0 / record 0 starts here */
#define EI_SLOT_HEADER_SIZE 64u     /* payload starts this far into a slot */
#define EI_RECORD_HEADER_SIZE 128u  /* payload starts this far into a result record */
#define EI_ALIGN 64u                /* slot stride, record stride and payloads are multiples of this */
#define EI_MIN_SLOTS 3u             /* claimed + latest + one to write: the producer never waits */
#define EI_MAX_SLOTS 64u            /* slot index must fit the low 8 bits of `latest` */
#define EI_MIN_RECORDS 2u
#define EI_MAX_RECORDS 65536u
#define EI_MAX_DIM 16384u           /* width and height limit */
#define EI_MAX_PAYLOAD (1ull << 30) /* one slot payload / record payload limit */
#define EI_NO_SLOT 0xFFFFFFFFu      /* `claimed` value when the consumer holds nothing */
#define EI_MAX_WAIT 64u             /* rings one ei_wait_any call can sleep on */
#define EI_NAME_MAX 200u            /* segment name length limit */
#define EI_MODEL_NAME_LEN 32u
#define EI_MODEL_VERSION_LEN 16u

/* Lock bytes (OFD locks on the segment file): held for the life of the holder,
 * released by the kernel when it dies, so liveness needs no pid checks. */
#define EI_LOCK_PRODUCER 0 /* frame producer / result writer */
#define EI_LOCK_CONSUMER 1 /* the one frame consumer */

/* Pixel formats: all 8 bits per channel, interleaved (HWC). */
enum ei_pixel_format {
    EI_PIX_GRAY8 = 1,
    EI_PIX_RGB24 = 2,
    EI_PIX_BGR24 = 3,
    EI_PIX_RGBA32 = 4,
    EI_PIX_BGRA32 = 5,
};

/* Slot state, the low 8 bits of a slot's `word` (the high 56 bits are the seq). */
enum ei_slot_state {
    EI_SLOT_EMPTY = 0,   /* never written */
    EI_SLOT_WRITING = 1, /* the producer owns it; contents undefined */
    EI_SLOT_READY = 2,   /* holds the complete frame `seq` */
};

/* Ring flags (header `flags`), set by the producer / writer. */
enum ei_ring_flags {
    EI_RING_CLOSED = 1u,     /* the producer closed it cleanly and unlinked it */
    EI_RING_SUPERSEDED = 2u, /* a new segment now stands under this name: reattach */
};

/* Status codes returned by every function below (negative = error). */
enum ei_status {
    EI_OK = 0,
    EI_ERR_SYS = -1,           /* a system call failed; ei_error.sys_errno says which errno */
    EI_ERR_TRUNCATED = -2,     /* file smaller than its header or its declared size */
    EI_ERR_MAGIC = -3,         /* not an edgeinfer segment of the expected kind */
    EI_ERR_ABI = -4,           /* an ABI version this code does not understand */
    EI_ERR_GEOMETRY = -5,      /* geometry fields inconsistent or out of bounds */
    EI_ERR_INSECURE = -6,      /* world-writable, or not a regular file */
    EI_ERR_OWNER = -7,         /* owned by a user outside the allowed set */
    EI_ERR_PRODUCER_BUSY = -8, /* another live producer / writer owns the name */
    EI_ERR_CONSUMER_BUSY = -9, /* another live consumer is attached */
    EI_ERR_NOSPACE = -10,      /* the shared-memory filesystem is full */
    EI_ERR_ARG = -11,          /* a bad argument from the caller */
    EI_ERR_NOT_FOUND = -12,    /* no segment of that name */
    EI_ERR_CORRUPT = -13,      /* a producer-written number failed its bounds check */
    EI_ERR_STATE = -14,        /* call out of order (e.g. acquire while holding) */
};

typedef struct ei_error {
    int code;       /* an ei_status */
    int sys_errno;  /* errno for EI_ERR_SYS / EI_ERR_NOSPACE, else 0 */
    char msg[320];  /* human-readable, names the segment and the problem */
} ei_error;

/* ------------------------------------------------------------------ */
/* Shared-memory layout                                                */
/* ------------------------------------------------------------------ */

/* Frame ring header: the first EI_HEADER_SIZE bytes of `edgeinfer.<stream>`.
 * Lines 0-1 are written once before the segment gets its name, then never. */
typedef struct ei_frame_ring_header {
    /* line 0-1: identity and geometry (immutable once linked) */
    char magic[8];              /* EI_FRAME_MAGIC */
    uint32_t abi_version;       /* EI_ABI_VERSION */
    uint32_t header_size;       /* EI_HEADER_SIZE: offset of slot 0 */
    uint64_t total_size;        /* header_size + slot_count * slot_stride */
    uint32_t slot_count;        /* EI_MIN_SLOTS..EI_MAX_SLOTS */
    uint32_t slot_header_size;  /* EI_SLOT_HEADER_SIZE: payload offset inside a slot */
    uint64_t slot_stride;       /* bytes from one slot to the next, multiple of EI_ALIGN */
    uint64_t payload_capacity;  /* >= row_stride * height; payload bytes available per slot */
    uint32_t width;             /* pixels */
    uint32_t height;            /* pixels */
    uint32_t channels;          /* bytes per pixel, implied by pixel_format */
    uint32_t pixel_format;      /* enum ei_pixel_format */
    uint32_t row_stride;        /* bytes per row, >= width * channels */
    uint32_t reserved0[15];     /* zero */
    /* line 2: written by the producer */
    _Atomic uint64_t latest;           /* seq << 8 | slot of the newest complete frame; 0 = none yet */
    _Atomic uint32_t doorbell;         /* futex word: +1 on every publish and flag change */
    _Atomic uint32_t flags;            /* enum ei_ring_flags */
    _Atomic uint32_t producer_pid;     /* informational: the producer's pid (in its namespace) */
    _Atomic uint32_t generation;       /* 1 + generation of the segment this one replaced */
    _Atomic uint64_t published;        /* frames published into this segment */
    _Atomic uint64_t producer_backoffs;/* slot picks abandoned because the consumer claimed it */
    uint8_t reserved1[24];
    /* line 3: written by the consumer */
    _Atomic uint32_t claimed;          /* slot the consumer holds, EI_NO_SLOT if none */
    _Atomic uint32_t waiters;          /* consumers asleep on `doorbell`: producer wakes only if > 0 */
    _Atomic uint32_t consumer_pid;     /* informational: the attached consumer's pid */
    uint32_t reserved2;
    _Atomic uint64_t claims;           /* frames the consumer acquired */
    _Atomic uint64_t claim_retries;    /* claims that lost a race and were retried */
    uint8_t reserved3[32];
} ei_frame_ring_header;

/* Each slot starts with this; the payload follows at slot_header_size. */
typedef struct ei_frame_slot_header {
    _Atomic uint64_t word;    /* seq << 8 | enum ei_slot_state */
    uint64_t capture_mono_ns; /* CLOCK_MONOTONIC at capture */
    uint64_t capture_real_ns; /* CLOCK_REALTIME at capture */
    uint64_t frame_id;        /* the producer's own frame number */
    uint64_t payload_len;     /* bytes of payload written, <= payload_capacity */
    uint8_t reserved[24];
} ei_frame_slot_header;

/* Result ring header: the first EI_HEADER_SIZE bytes of `edgeinfer.<stream>.results`. */
typedef struct ei_result_ring_header {
    /* line 0-1: identity and geometry (immutable once linked) */
    char magic[8];              /* EI_RESULT_MAGIC */
    uint32_t abi_version;       /* EI_ABI_VERSION */
    uint32_t header_size;       /* EI_HEADER_SIZE: offset of record 0 */
    uint64_t total_size;        /* header_size + record_count * record_stride */
    uint32_t record_count;      /* EI_MIN_RECORDS..EI_MAX_RECORDS */
    uint32_t record_header_size;/* EI_RECORD_HEADER_SIZE: payload offset inside a record */
    uint64_t record_stride;     /* multiple of EI_ALIGN */
    uint64_t payload_capacity;  /* payload bytes available per record */
    uint8_t reserved0[80];
    /* line 2: written by the writer */
    _Atomic uint64_t head;      /* number of the newest complete record (1-based); 0 = none */
    _Atomic uint32_t doorbell;  /* futex word: +1 per record and per flag change */
    _Atomic uint32_t flags;     /* enum ei_ring_flags */
    _Atomic uint32_t writer_pid;/* informational */
    _Atomic uint32_t generation;/* 1 + generation of the segment this one replaced */
    uint8_t reserved1[40];
    /* line 3: written by readers */
    _Atomic uint32_t waiters;   /* readers asleep on `doorbell` */
    uint8_t reserved2[60];
} ei_result_ring_header;

/* Result record n (1-based) lives at index (n - 1) % record_count. */
typedef struct ei_result_record_header {
    _Atomic uint64_t seqlock;  /* n << 1 when complete, n << 1 | 1 while being written */
    uint64_t frame_seq;        /* frame ring seq of the input frame */
    uint64_t frame_id;         /* producer's frame id of the input */
    uint64_t capture_mono_ns;  /* copied from the frame */
    uint64_t capture_real_ns;  /* copied from the frame */
    uint64_t start_mono_ns;    /* inference started */
    uint64_t done_mono_ns;     /* result published */
    uint32_t status;           /* 0 = ok; see docs/abi.md */
    uint32_t payload_kind;     /* 0 = none, 1 = classification, 2 = detection, 3 = raw */
    uint32_t payload_len;      /* bytes of payload, <= payload_capacity */
    uint32_t item_count;       /* rows in the payload */
    char model_name[EI_MODEL_NAME_LEN];       /* NUL-padded */
    char model_version[EI_MODEL_VERSION_LEN]; /* NUL-padded */
    uint8_t reserved[8];
} ei_result_record_header;

_Static_assert(sizeof(ei_frame_ring_header) == 256, "frame header layout");
_Static_assert(offsetof(ei_frame_ring_header, latest) == 128, "frame header layout");
_Static_assert(offsetof(ei_frame_ring_header, claimed) == 192, "frame header layout");
_Static_assert(sizeof(ei_frame_slot_header) == EI_SLOT_HEADER_SIZE, "slot header layout");
_Static_assert(sizeof(ei_result_ring_header) == 256, "result header layout");
_Static_assert(offsetof(ei_result_ring_header, head) == 128, "result header layout");
_Static_assert(offsetof(ei_result_ring_header, waiters) == 192, "result header layout");
_Static_assert(sizeof(ei_result_record_header) == EI_RECORD_HEADER_SIZE, "record header layout");

/* ------------------------------------------------------------------ */
/* Small helpers                                                       */
/* ------------------------------------------------------------------ */

static inline uint64_t ei_align_up(uint64_t v) { return (v + EI_ALIGN - 1) & ~(uint64_t)(EI_ALIGN - 1); }

static inline uint64_t ei_now_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline void ei_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline uint32_t ei_pixel_channels(uint32_t fmt) {
    switch (fmt) {
    case EI_PIX_GRAY8: return 1;
    case EI_PIX_RGB24: case EI_PIX_BGR24: return 3;
    case EI_PIX_RGBA32: case EI_PIX_BGRA32: return 4;
    default: return 0;
    }
}

static inline int ei_fail(ei_error *err, int code, int sys_errno, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#include <stdarg.h>
static inline int ei_fail(ei_error *err, int code, int sys_errno, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
        err->sys_errno = sys_errno;
    }
    return code;
}

static inline int ei_futex_wake(_Atomic uint32_t *addr) {
    /* Shared (not FUTEX_PRIVATE): the waiter is another process. */
    return (int)syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Sleeps while *addr == expected, at most timeout_ns. 0 on wake/mismatch, ETIMEDOUT, or EINTR. */
static inline int ei_futex_wait(_Atomic uint32_t *addr, uint32_t expected, uint64_t timeout_ns) {
    struct timespec ts = {(time_t)(timeout_ns / 1000000000ull), (long)(timeout_ns % 1000000000ull)};
    if (syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT, expected, &ts, NULL, 0) == 0) return 0;
    return errno == EAGAIN ? 0 : errno;
}

/* Build "<dir>/<name>"; the name must be a plain file name. */
static inline int ei_segment_path(char *out, size_t outlen, const char *dir, const char *name, ei_error *err) {
    size_t n = strlen(name);
    if (n == 0 || n > EI_NAME_MAX || strchr(name, '/') || name[0] == '.')
        return ei_fail(err, EI_ERR_ARG, 0, "invalid segment name '%s': 1-%u characters, no '/', not starting with '.'",
                       name, EI_NAME_MAX);
    if ((size_t)snprintf(out, outlen, "%s/%s", dir, name) >= outlen)
        return ei_fail(err, EI_ERR_ARG, 0, "segment path too long: %s/%s", dir, name);
    return EI_OK;
}

/* One OFD lock request (F_OFD_SETLK / F_OFD_GETLK) of `type` on one byte. */
static inline int ei__ofd_lock(int fd, int cmd, short type, int byte, short *type_out) {
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = byte;
    fl.l_len = 1;
    int rc = fcntl(fd, cmd, &fl);
    if (type_out) *type_out = fl.l_type;
    return rc;
}

/* Takes (nonblocking) an OFD write lock on one byte of the segment; 0 on success. */
static inline int ei_lock_byte(int fd, int byte) { return ei__ofd_lock(fd, F_OFD_SETLK, F_WRLCK, byte, NULL); }

/* Drops a lock explicitly. Closing the fd is not enough while the segment is
 * mapped: the mapping keeps the open file description, and its locks, alive. */
static inline void ei_unlock_byte(int fd, int byte) { ei__ofd_lock(fd, F_OFD_SETLK, F_UNLCK, byte, NULL); }

/* 1 when some other open file description holds lock `byte` (its owner is alive). */
static inline int ei_lock_held(int fd, int byte) {
    short type = F_UNLCK;
    if (ei__ofd_lock(fd, F_OFD_GETLK, F_WRLCK, byte, &type) != 0) return 0;
    return type != F_UNLCK;
}

/* Refuses a segment that anyone may write, that is not a plain file, or whose
 * owner is not in allowed_uids (n_allowed == 0: any owner). */
static inline int ei_check_owner(int fd, const char *name, const uint32_t *allowed_uids, size_t n_allowed,
                                 struct stat *st, ei_error *err) {
    if (fstat(fd, st) != 0) return ei_fail(err, EI_ERR_SYS, errno, "%s: fstat: %s", name, strerror(errno));
    if (!S_ISREG(st->st_mode)) return ei_fail(err, EI_ERR_INSECURE, 0, "%s: not a regular file", name);
    if (st->st_mode & S_IWOTH)
        return ei_fail(err, EI_ERR_INSECURE, 0, "%s: world-writable (mode %04o); producers must create segments 0660",
                       name, (unsigned)(st->st_mode & 07777));
    if (n_allowed) {
        for (size_t i = 0; i < n_allowed; i++)
            if (allowed_uids[i] == (uint32_t)st->st_uid) return EI_OK;
        return ei_fail(err, EI_ERR_OWNER, 0, "%s: owned by uid %u, which is not an allowed producer", name,
                       (unsigned)st->st_uid);
    }
    return EI_OK;
}

/* Opens an existing segment for a reader: never through a symlink. Returns fd or an ei_status. */
static inline int ei__open_existing(const char *path, const char *dir, const char *name, ei_error *err) {
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd >= 0) return fd;
    if (errno == ENOENT) return ei_fail(err, EI_ERR_NOT_FOUND, ENOENT, "%s: no such segment in %s", name, dir);
    if (errno == ELOOP) return ei_fail(err, EI_ERR_INSECURE, 0, "%s: is a symbolic link; refusing it", name);
    if (errno == EACCES)
        return ei_fail(err, EI_ERR_INSECURE, EACCES, "%s: permission denied (a producer outside our group? "
                       "segments must be group-readable by the consumer)", name);
    return ei_fail(err, EI_ERR_SYS, errno, "%s: open: %s", name, strerror(errno));
}

/* ------------------------------------------------------------------ */
/* Segment creation: a fully initialised segment appears under its    */
/* name atomically (temp file + link/rename), so a reader never sees  */
/* a half-written header.                                             */
/* ------------------------------------------------------------------ */

typedef struct ei_new_segment {
    int fd;          /* owns: the new segment's fd, holding the EI_LOCK_PRODUCER lock */
    uint8_t *base;   /* owns: read-write mapping of the whole segment */
    size_t size;
    char tmp_path[PATH_MAX];
    char path[PATH_MAX];
    uint32_t generation; /* generation to stamp: 1 + the replaced segment's */
    int old_fd;          /* owns: the segment being replaced (locked), or -1 */
} ei_new_segment;

/* Opens the name's current segment, if any, and makes sure nobody alive owns it.
 * On success *old_fd is -1 (no segment) or an fd whose producer lock we now hold. */
static inline int ei__take_over_name(const char *path, const char *name, int *old_fd, uint32_t *old_generation,
                                     size_t gen_offset, ei_error *err) {
    *old_fd = -1;
    *old_generation = 0;
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        if (errno == ENOENT) return EI_OK;
        return ei_fail(err, EI_ERR_SYS, errno, "%s: cannot open the existing segment: %s", name, strerror(errno));
    }
    if (ei_lock_byte(fd, EI_LOCK_PRODUCER) != 0) {
        int e = errno;
        close(fd);
        if (e == EAGAIN || e == EACCES)
            return ei_fail(err, EI_ERR_PRODUCER_BUSY, 0, "%s: another live producer owns this segment", name);
        return ei_fail(err, EI_ERR_SYS, e, "%s: lock: %s", name, strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) == 0 && (uint64_t)st.st_size >= EI_HEADER_SIZE) {
        uint32_t g = 0;
        if (pread(fd, &g, sizeof g, (off_t)gen_offset) == (ssize_t)sizeof g) *old_generation = g;
    }
    *old_fd = fd;
    return EI_OK;
}

static inline int ei__segment_begin(ei_new_segment *s, const char *dir, const char *name, uint64_t size,
                                    unsigned mode, long gid, size_t gen_offset, ei_error *err) {
    memset(s, 0, sizeof *s);
    s->fd = -1;
    s->old_fd = -1;
    int rc = ei_segment_path(s->path, sizeof s->path, dir, name, err);
    if (rc) return rc;
    if ((size_t)snprintf(s->tmp_path, sizeof s->tmp_path, "%s/.%s.%d.tmp", dir, name, (int)getpid()) >=
        sizeof s->tmp_path)
        return ei_fail(err, EI_ERR_ARG, 0, "segment path too long: %s/%s", dir, name);
    uint32_t old_gen = 0;
    rc = ei__take_over_name(s->path, name, &s->old_fd, &old_gen, gen_offset, err);
    if (rc) return rc;
    s->generation = old_gen + 1;
    unlink(s->tmp_path); /* a leftover of a crashed earlier run of this very pid */
    s->fd = open(s->tmp_path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode & 0777);
    if (s->fd < 0) {
        rc = ei_fail(err, EI_ERR_SYS, errno, "%s: cannot create %s: %s", name, s->tmp_path, strerror(errno));
        goto fail;
    }
    fchmod(s->fd, mode & 0777); /* the umask must not widen or narrow the access control */
    if (gid >= 0 && fchown(s->fd, (uid_t)-1, (gid_t)gid) != 0) {
        rc = ei_fail(err, EI_ERR_SYS, errno, "%s: cannot give the segment to group %ld: %s", name, gid, strerror(errno));
        goto fail;
    }
    /* Reserve every page now: a full /dev/shm is this error, never a SIGBUS later. */
    int e = posix_fallocate(s->fd, 0, (off_t)size);
    if (e) {
        rc = ei_fail(err, e == ENOSPC ? EI_ERR_NOSPACE : EI_ERR_SYS, e, "%s: cannot reserve %llu bytes in %s: %s",
                     name, (unsigned long long)size, dir, strerror(e));
        goto fail;
    }
    s->base = (uint8_t *)mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
    if (s->base == MAP_FAILED) {
        s->base = NULL;
        rc = ei_fail(err, EI_ERR_SYS, errno, "%s: mmap %llu bytes: %s", name, (unsigned long long)size,
                     strerror(errno));
        goto fail;
    }
    s->size = size;
    if (ei_lock_byte(s->fd, EI_LOCK_PRODUCER) != 0) {
        rc = ei_fail(err, EI_ERR_SYS, errno, "%s: lock: %s", name, strerror(errno));
        goto fail;
    }
    return EI_OK;
fail:
    if (s->base) munmap(s->base, s->size);
    if (s->fd >= 0) { close(s->fd); unlink(s->tmp_path); }
    if (s->old_fd >= 0) close(s->old_fd);
    s->base = NULL;
    s->fd = s->old_fd = -1;
    return rc;
}

/* Gives the initialised segment its name, then tells readers of the segment
 * it replaced to reattach. `flags_off`/`bell_off` locate those words in the old header. */
static inline int ei__segment_commit(ei_new_segment *s, const char *name, size_t flags_off, size_t bell_off,
                                     ei_error *err) {
    int rc = EI_OK;
    if (s->old_fd >= 0) {
        /* We hold the dead owner's lock: no one else can be replacing it. */
        if (rename(s->tmp_path, s->path) != 0)
            rc = ei_fail(err, EI_ERR_SYS, errno, "%s: rename into place: %s", name, strerror(errno));
        else {
            void *old = mmap(NULL, EI_HEADER_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, s->old_fd, 0);
            struct stat st;
            if (old != MAP_FAILED && fstat(s->old_fd, &st) == 0 && (uint64_t)st.st_size >= EI_HEADER_SIZE) {
                atomic_fetch_or((_Atomic uint32_t *)((uint8_t *)old + flags_off), EI_RING_SUPERSEDED);
                atomic_fetch_add((_Atomic uint32_t *)((uint8_t *)old + bell_off), 1);
                ei_futex_wake((_Atomic uint32_t *)((uint8_t *)old + bell_off));
            }
            if (old != MAP_FAILED) munmap(old, EI_HEADER_SIZE);
        }
        close(s->old_fd);
        s->old_fd = -1;
    } else if (link(s->tmp_path, s->path) != 0) {
        /* EEXIST: another producer created the name since we looked. */
        rc = errno == EEXIST ? ei_fail(err, EI_ERR_PRODUCER_BUSY, 0, "%s: another producer created it concurrently", name)
                             : ei_fail(err, EI_ERR_SYS, errno, "%s: link into place: %s", name, strerror(errno));
        unlink(s->tmp_path);
    } else {
        unlink(s->tmp_path);
    }
    if (rc) {
        munmap(s->base, s->size);
        close(s->fd);
        s->base = NULL;
        s->fd = -1;
    }
    return rc;
}

/* Marks a segment closed, wakes its readers and unlinks its name if the name
 * still refers to this very segment. Does not unmap or close. */
static inline void ei__segment_retire(int fd, const char *path, _Atomic uint32_t *flags, _Atomic uint32_t *bell,
                                      int unlink_name) {
    ei_unlock_byte(fd, EI_LOCK_PRODUCER); /* the name is free for the next producer now */
    atomic_fetch_or(flags, EI_RING_CLOSED);
    atomic_fetch_add(bell, 1);
    ei_futex_wake(bell);
    if (unlink_name) {
        struct stat mine, named;
        if (fstat(fd, &mine) == 0 && stat(path, &named) == 0 && mine.st_ino == named.st_ino &&
            mine.st_dev == named.st_dev)
            unlink(path);
    }
}

/* ------------------------------------------------------------------ */
/* Frame ring: geometry and validation                                 */
/* ------------------------------------------------------------------ */

/* What a producer asks for. */
typedef struct ei_frame_geometry {
    uint32_t width, height;
    uint32_t pixel_format; /* enum ei_pixel_format */
    uint32_t row_stride;   /* 0 = packed (width * channels) */
    uint32_t slot_count;   /* EI_MIN_SLOTS..EI_MAX_SLOTS */
} ei_frame_geometry;

/* A private, validated copy of a frame ring's geometry. Readers use only this,
 * never the shared header, so a producer cannot change it under them. */
typedef struct ei_frame_layout {
    uint64_t total_size;
    uint64_t slot_stride;
    uint64_t payload_capacity;
    uint32_t slot_count;
    uint32_t width, height, channels, pixel_format, row_stride;
} ei_frame_layout;

static inline int ei_frame_layout_from_geometry(const ei_frame_geometry *g, ei_frame_layout *out, const char *name,
                                                ei_error *err) {
    uint32_t ch = ei_pixel_channels(g->pixel_format);
    if (!ch) return ei_fail(err, EI_ERR_ARG, 0, "%s: unknown pixel format %u", name, g->pixel_format);
    if (g->width == 0 || g->height == 0 || g->width > EI_MAX_DIM || g->height > EI_MAX_DIM)
        return ei_fail(err, EI_ERR_ARG, 0, "%s: frame size %ux%u outside 1..%u", name, g->width, g->height, EI_MAX_DIM);
    if (g->slot_count < EI_MIN_SLOTS || g->slot_count > EI_MAX_SLOTS)
        return ei_fail(err, EI_ERR_ARG, 0, "%s: %u slots; need %u..%u", name, g->slot_count, EI_MIN_SLOTS,
                       EI_MAX_SLOTS);
    uint64_t packed = (uint64_t)g->width * ch;
    uint64_t row = g->row_stride ? g->row_stride : packed;
    if (row < packed || row > UINT32_MAX)
        return ei_fail(err, EI_ERR_ARG, 0, "%s: row stride %llu smaller than a row (%llu bytes)", name,
                       (unsigned long long)row, (unsigned long long)packed);
    out->width = g->width;
    out->height = g->height;
    out->channels = ch;
    out->pixel_format = g->pixel_format;
    out->row_stride = (uint32_t)row;
    out->slot_count = g->slot_count;
    out->payload_capacity = ei_align_up(row * g->height);
    out->slot_stride = ei_align_up(EI_SLOT_HEADER_SIZE + out->payload_capacity);
    out->total_size = EI_HEADER_SIZE + (uint64_t)g->slot_count * out->slot_stride;
    return EI_OK;
}

/* Validates a mapped frame ring header against the file size and fills a
 * private layout. Reads the shared header once, into a local copy, so the
 * checks and the result agree even if the producer scribbles concurrently. */
static inline int ei_frame_ring_check(const void *base, uint64_t file_size, const char *name, ei_frame_layout *out,
                                      ei_error *err) {
    if (file_size < EI_HEADER_SIZE)
        return ei_fail(err, EI_ERR_TRUNCATED, 0, "%s: %llu bytes, smaller than the %u-byte header", name,
                       (unsigned long long)file_size, EI_HEADER_SIZE);
    ei_frame_ring_header h;
    memcpy(&h, base, offsetof(ei_frame_ring_header, latest)); /* immutable part only */
    if (memcmp(h.magic, EI_FRAME_MAGIC, 8) != 0) {
        if (memcmp(h.magic, EI_RESULT_MAGIC, 8) == 0)
            return ei_fail(err, EI_ERR_MAGIC, 0, "%s: is a result ring, not a frame ring", name);
        return ei_fail(err, EI_ERR_MAGIC, 0, "%s: not an edgeinfer frame ring (bad magic)", name);
    }
    if (h.abi_version != EI_ABI_VERSION)
        return ei_fail(err, EI_ERR_ABI, 0, "%s: ABI version %u, this build understands %u", name, h.abi_version,
                       EI_ABI_VERSION);
    ei_frame_geometry g = {h.width, h.height, h.pixel_format, h.row_stride, h.slot_count};
    ei_error sub;
    if (h.header_size != EI_HEADER_SIZE || h.slot_header_size != EI_SLOT_HEADER_SIZE)
        return ei_fail(err, EI_ERR_GEOMETRY, 0, "%s: header size %u / slot header size %u, expected %u / %u", name,
                       h.header_size, h.slot_header_size, EI_HEADER_SIZE, EI_SLOT_HEADER_SIZE);
    if (h.row_stride == 0 || ei_frame_layout_from_geometry(&g, out, name, &sub) != EI_OK)
        return ei_fail(err, EI_ERR_GEOMETRY, 0, "%s: bad geometry: %s", name, h.row_stride ? sub.msg : "row stride 0");
    if (h.channels != out->channels)
        return ei_fail(err, EI_ERR_GEOMETRY, 0, "%s: %u channels does not match pixel format %u", name, h.channels,
                       h.pixel_format);
    if (h.payload_capacity < (uint64_t)out->row_stride * out->height || h.payload_capacity > EI_MAX_PAYLOAD ||
        h.slot_stride < EI_SLOT_HEADER_SIZE + h.payload_capacity || h.slot_stride % EI_ALIGN ||
        h.slot_stride > EI_SLOT_HEADER_SIZE + EI_MAX_PAYLOAD)
        return ei_fail(err, EI_ERR_GEOMETRY, 0, "%s: slot stride %llu / payload capacity %llu do not hold a %ux%u frame",
                       name, (unsigned long long)h.slot_stride, (unsigned long long)h.payload_capacity, h.width,
                       h.height);
    out->payload_capacity = h.payload_capacity;
    out->slot_stride = h.slot_stride;
    out->total_size = EI_HEADER_SIZE + (uint64_t)h.slot_count * h.slot_stride;
    if (h.total_size != out->total_size)
        return ei_fail(err, EI_ERR_GEOMETRY, 0, "%s: declared size %llu, geometry needs %llu", name,
                       (unsigned long long)h.total_size, (unsigned long long)out->total_size);
    if (file_size < out->total_size)
        return ei_fail(err, EI_ERR_TRUNCATED, 0, "%s: file is %llu bytes, its geometry needs %llu", name,
                       (unsigned long long)file_size, (unsigned long long)out->total_size);
    return EI_OK;
}

static inline ei_frame_slot_header *ei_frame_slot(uint8_t *base, const ei_frame_layout *l, uint32_t slot) {
    return (ei_frame_slot_header *)(base + EI_HEADER_SIZE + (uint64_t)slot * l->slot_stride);
}

static inline uint8_t *ei_frame_payload(uint8_t *base, const ei_frame_layout *l, uint32_t slot) {
    return (uint8_t *)ei_frame_slot(base, l, slot) + EI_SLOT_HEADER_SIZE;
}

/* ------------------------------------------------------------------ */
/* Frame ring: producer                                                */
/* ------------------------------------------------------------------ */

typedef struct ei_frame_producer {
    int fd;                    /* owns: segment fd, holding the producer lock for our lifetime */
    uint8_t *base;             /* owns: read-write mapping of the whole segment */
    ei_frame_ring_header *hdr; /* borrowed: == base */
    ei_frame_layout layout;    /* what we created; never re-read from shared memory */
    uint64_t next_seq;         /* seq the next publish gets (1-based) */
    uint32_t latest_slot;      /* slot of our last publish, EI_NO_SLOT before the first */
    uint32_t writing;          /* slot reserved by begin(), EI_NO_SLOT if none */
    uint32_t cursor;           /* where the next slot search starts (round robin) */
    char path[PATH_MAX];
} ei_frame_producer;

/* Creates the frame ring `name` in `dir` (normally /dev/shm), replacing a
 * segment of that name whose producer is dead. Fails with EI_ERR_PRODUCER_BUSY
 * if a live producer owns it. mode and gid are the access control (normally
 * 0660 and the `edgeinfer` group; gid -1 keeps the creator's group). */
static inline int ei_frame_producer_open(ei_frame_producer *p, const char *dir, const char *name,
                                         const ei_frame_geometry *g, unsigned mode, long gid, ei_error *err) {
    memset(p, 0, sizeof *p);
    p->fd = -1;
    ei_frame_layout l;
    int rc = ei_frame_layout_from_geometry(g, &l, name, err);
    if (rc) return rc;
    if (mode & S_IWOTH) return ei_fail(err, EI_ERR_ARG, 0, "%s: refusing a world-writable mode %04o", name, mode);
    ei_new_segment s;
    rc = ei__segment_begin(&s, dir, name, l.total_size, mode, gid, offsetof(ei_frame_ring_header, generation), err);
    if (rc) return rc;
    ei_frame_ring_header *h = (ei_frame_ring_header *)s.base;
    memcpy(h->magic, EI_FRAME_MAGIC, 8);
    h->abi_version = EI_ABI_VERSION;
    h->header_size = EI_HEADER_SIZE;
    h->total_size = l.total_size;
    h->slot_count = l.slot_count;
    h->slot_header_size = EI_SLOT_HEADER_SIZE;
    h->slot_stride = l.slot_stride;
    h->payload_capacity = l.payload_capacity;
    h->width = l.width;
    h->height = l.height;
    h->channels = l.channels;
    h->pixel_format = l.pixel_format;
    h->row_stride = l.row_stride;
    atomic_store(&h->claimed, EI_NO_SLOT);
    atomic_store(&h->producer_pid, (uint32_t)getpid());
    atomic_store(&h->generation, s.generation);
    rc = ei__segment_commit(&s, name, offsetof(ei_frame_ring_header, flags), offsetof(ei_frame_ring_header, doorbell),
                            err);
    if (rc) return rc;
    p->fd = s.fd;
    p->base = s.base;
    p->hdr = h;
    p->layout = l;
    p->next_seq = 1;
    p->latest_slot = EI_NO_SLOT;
    p->writing = EI_NO_SLOT;
    memcpy(p->path, s.path, sizeof p->path);
    return EI_OK;
}

/* Reserves a slot to write the next frame into and returns its payload.
 * Never blocks: with >= 3 slots one is neither claimed nor latest. */
static inline uint8_t *ei_frame_producer_begin(ei_frame_producer *p) {
    if (p->writing != EI_NO_SLOT) return ei_frame_payload(p->base, &p->layout, p->writing);
    const uint32_t n = p->layout.slot_count;
    for (;;) {
        uint32_t claimed = atomic_load(&p->hdr->claimed);
        uint32_t s = p->cursor;
        for (uint32_t i = 0; i < n; i++, s = (s + 1) % n)
            if (s != claimed && s != p->latest_slot) break;
        ei_frame_slot_header *sh = ei_frame_slot(p->base, &p->layout, s);
        uint64_t old = atomic_load(&sh->word);
        /* Dekker: announce WRITING, then re-check the claim (both seq_cst). */
        atomic_store(&sh->word, (old & ~(uint64_t)0xff) | EI_SLOT_WRITING);
        if (atomic_load(&p->hdr->claimed) == s) {
            /* The consumer claimed it meanwhile and may hold it: give it back untouched. */
            atomic_store(&sh->word, old);
            atomic_fetch_add_explicit(&p->hdr->producer_backoffs, 1, memory_order_relaxed);
            continue;
        }
        p->writing = s;
        p->cursor = (s + 1) % n;
        return ei_frame_payload(p->base, &p->layout, s);
    }
}

/* Publishes the slot reserved by begin(). Returns the frame's seq, 0 if nothing was reserved. */
static inline uint64_t ei_frame_producer_publish(ei_frame_producer *p, uint64_t capture_mono_ns,
                                                 uint64_t capture_real_ns, uint64_t frame_id, uint64_t payload_len) {
    uint32_t s = p->writing;
    if (s == EI_NO_SLOT) return 0;
    ei_frame_slot_header *sh = ei_frame_slot(p->base, &p->layout, s);
    uint64_t seq = p->next_seq++;
    sh->capture_mono_ns = capture_mono_ns;
    sh->capture_real_ns = capture_real_ns;
    sh->frame_id = frame_id;
    sh->payload_len = payload_len < p->layout.payload_capacity ? payload_len : p->layout.payload_capacity;
    atomic_store(&sh->word, seq << 8 | EI_SLOT_READY);
    atomic_store(&p->hdr->latest, seq << 8 | s);
    atomic_fetch_add_explicit(&p->hdr->published, 1, memory_order_relaxed);
    /* Dekker with the sleeping consumer: bump the bell, then look for waiters. */
    atomic_fetch_add(&p->hdr->doorbell, 1);
    if (atomic_load(&p->hdr->waiters)) ei_futex_wake(&p->hdr->doorbell);
    p->latest_slot = s;
    p->writing = EI_NO_SLOT;
    return seq;
}

/* Marks the ring closed (readers see it at once) and unlinks its name; keeps the mapping. */
static inline void ei_frame_producer_retire(ei_frame_producer *p, int unlink_name) {
    if (p->base) ei__segment_retire(p->fd, p->path, &p->hdr->flags, &p->hdr->doorbell, unlink_name);
}

/* retire() and then unmap and close. */
static inline void ei_frame_producer_close(ei_frame_producer *p, int unlink_name) {
    if (!p->base) return;
    ei_frame_producer_retire(p, unlink_name);
    munmap(p->base, p->layout.total_size);
    close(p->fd);
    p->base = NULL;
    p->hdr = NULL;
    p->fd = -1;
}

/* ------------------------------------------------------------------ */
/* Frame ring: consumer (exactly one per ring)                         */
/* ------------------------------------------------------------------ */

typedef struct ei_frame_consumer {
    uint8_t *base;             /* borrowed: mapping owned by the caller (header RW, slots read-only) */
    ei_frame_ring_header *hdr; /* borrowed: == base */
    ei_frame_layout layout;    /* private validated copy */
    uint64_t last_seq;         /* seq of the last frame acquired; only newer ones are returned */
    uint32_t held;             /* slot we hold, EI_NO_SLOT if none */
    uint32_t seen_flags;       /* ring flags already reported to the caller */
} ei_frame_consumer;

/* Metadata of an acquired frame (copied out of the slot header). */
typedef struct ei_frame_info {
    uint64_t seq;
    uint64_t capture_mono_ns;
    uint64_t capture_real_ns;
    uint64_t frame_id;
    uint64_t payload_len;
    uint32_t slot;
    uint32_t generation;
} ei_frame_info;

typedef struct ei_mapped {
    int fd;        /* the segment fd (holds the consumer lock for frame rings) */
    uint8_t *base; /* mapping of the whole segment */
    size_t size;
    dev_t dev;     /* identity of the file, to notice a replaced name */
    ino_t ino;
} ei_mapped;

typedef int (*ei__check_fn)(const void *base, uint64_t file_size, const char *name, void *layout, ei_error *err);

/* Opens an existing segment for a reader: checks ownership, maps it, validates
 * it with `check` (filling *layout) and makes everything after the header page
 * read-only. On success the caller owns m->fd and m->base (munmap/close). */
static inline int ei__map_existing(ei_mapped *m, const char *dir, const char *name, const uint32_t *allowed_uids,
                                   size_t n_allowed, ei__check_fn check, void *layout, ei_error *err) {
    char path[PATH_MAX];
    m->fd = -1;
    m->base = NULL;
    int rc = ei_segment_path(path, sizeof path, dir, name, err);
    if (rc) return rc;
    int fd = ei__open_existing(path, dir, name, err);
    if (fd < 0) return fd;
    struct stat st;
    uint8_t *base = NULL;
    rc = ei_check_owner(fd, name, allowed_uids, n_allowed, &st, err);
    if (rc) goto fail;
    if ((uint64_t)st.st_size < EI_HEADER_SIZE) {
        rc = check(NULL, (uint64_t)st.st_size, name, layout, err); /* reports the truncation */
        goto fail;
    }
    /* Map only what the file holds now; the validated header says how much we will use. */
    base = (uint8_t *)mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        base = NULL;
        rc = ei_fail(err, EI_ERR_SYS, errno, "%s: mmap: %s", name, strerror(errno));
        goto fail;
    }
    rc = check(base, (uint64_t)st.st_size, name, layout, err);
    if (rc) goto fail;
    /* Frames and records are read-only to readers: a stray write faults instead of corrupting them. */
    if (mprotect(base + EI_HEADER_SIZE, (size_t)st.st_size - EI_HEADER_SIZE, PROT_READ) != 0) {
        rc = ei_fail(err, EI_ERR_SYS, errno, "%s: mprotect: %s", name, strerror(errno));
        goto fail;
    }
    m->fd = fd;
    m->base = base;
    m->size = (size_t)st.st_size;
    m->dev = st.st_dev;
    m->ino = st.st_ino;
    return EI_OK;
fail:
    if (base) munmap(base, (size_t)st.st_size);
    close(fd);
    return rc;
}

static inline int ei__frame_check_cb(const void *base, uint64_t size, const char *name, void *l, ei_error *err) {
    return ei_frame_ring_check(base, size, name, (ei_frame_layout *)l, err);
}

/* Opens, checks ownership, maps and validates a frame ring, and takes the
 * consumer lock. On success the caller owns m->fd and m->base (munmap/close). */
static inline int ei_frame_consumer_open(ei_frame_consumer *c, ei_mapped *m, const char *dir, const char *name,
                                         const uint32_t *allowed_uids, size_t n_allowed, ei_error *err) {
    memset(c, 0, sizeof *c);
    int rc = ei__map_existing(m, dir, name, allowed_uids, n_allowed, ei__frame_check_cb, &c->layout, err);
    if (rc) return rc;
    if (ei_lock_byte(m->fd, EI_LOCK_CONSUMER) != 0) {
        rc = (errno == EAGAIN || errno == EACCES)
                 ? ei_fail(err, EI_ERR_CONSUMER_BUSY, 0, "%s: another consumer is attached", name)
                 : ei_fail(err, EI_ERR_SYS, errno, "%s: lock: %s", name, strerror(errno));
        munmap(m->base, m->size);
        close(m->fd);
        m->base = NULL;
        m->fd = -1;
        return rc;
    }
    c->base = m->base;
    c->hdr = (ei_frame_ring_header *)m->base;
    c->held = EI_NO_SLOT;
    /* A dead consumer's claim is ours to drop. */
    atomic_store(&c->hdr->claimed, EI_NO_SLOT);
    atomic_store(&c->hdr->consumer_pid, (uint32_t)getpid());
    return EI_OK;
}

/* Something new for the caller: a frame newer than the last acquired, or a flag change. */
static inline int ei_frame_consumer_ready(const ei_frame_consumer *c) {
    return (atomic_load_explicit(&c->hdr->latest, memory_order_acquire) >> 8) > c->last_seq ||
           atomic_load_explicit(&c->hdr->flags, memory_order_acquire) != c->seen_flags;
}

/* Claims the newest complete frame if it is newer than the last one acquired.
 * Returns 1 (claimed, *out filled), 0 (nothing new), EI_ERR_STATE (already
 * holding one) or EI_ERR_CORRUPT (the producer wrote an out-of-bounds value). */
static inline int ei_frame_consumer_acquire(ei_frame_consumer *c, ei_frame_info *out) {
    if (c->held != EI_NO_SLOT) return EI_ERR_STATE;
    ei_frame_ring_header *h = c->hdr;
    for (int tries = 0;; tries++) {
        uint64_t latest = atomic_load(&h->latest);
        uint64_t seq = latest >> 8;
        uint32_t slot = (uint32_t)(latest & 0xff);
        if (seq <= c->last_seq) return 0;
        if (slot >= c->layout.slot_count) {
            c->last_seq = seq; /* skip it: retrying would spin on the same bad word */
            return EI_ERR_CORRUPT;
        }
        /* Dekker: announce the claim, then check the slot still holds `seq` (both seq_cst). */
        atomic_store(&h->claimed, slot);
        ei_frame_slot_header *sh = ei_frame_slot(c->base, &c->layout, slot);
        if (atomic_load(&sh->word) == (seq << 8 | EI_SLOT_READY)) {
            uint64_t len = sh->payload_len;
            if (len > c->layout.payload_capacity) {
                atomic_store(&h->claimed, EI_NO_SLOT);
                c->last_seq = seq;
                return EI_ERR_CORRUPT;
            }
            out->seq = seq;
            out->capture_mono_ns = sh->capture_mono_ns;
            out->capture_real_ns = sh->capture_real_ns;
            out->frame_id = sh->frame_id;
            out->payload_len = len;
            out->slot = slot;
            out->generation = atomic_load_explicit(&h->generation, memory_order_relaxed);
            c->held = slot;
            c->last_seq = seq;
            atomic_fetch_add_explicit(&h->claims, 1, memory_order_relaxed);
            return 1;
        }
        /* The producer overwrote it between our two loads: a newer frame is in `latest`.
         * An honest producer cannot win this race a thousand times in a row (it
         * would have to publish a thousand frames during our few loads); a
         * `latest` pointing at a slot that never matches is corrupt: skip it. */
        atomic_fetch_add_explicit(&h->claim_retries, 1, memory_order_relaxed);
        if (tries >= 1000) {
            atomic_store(&h->claimed, EI_NO_SLOT);
            c->last_seq = seq;
            return EI_ERR_CORRUPT;
        }
    }
}

static inline void ei_frame_consumer_release(ei_frame_consumer *c) {
    if (c->held == EI_NO_SLOT) return;
    atomic_store(&c->hdr->claimed, EI_NO_SLOT);
    c->held = EI_NO_SLOT;
}

/* Releases any held frame and the consumer lock (fd: the segment's fd), so
 * another consumer can attach while this mapping still exists. */
static inline void ei_frame_consumer_detach(ei_frame_consumer *c, int fd) {
    ei_frame_consumer_release(c);
    if (fd >= 0) ei_unlock_byte(fd, EI_LOCK_CONSUMER);
}

/* ------------------------------------------------------------------ */
/* Waiting on many rings at once                                       */
/* ------------------------------------------------------------------ */

struct ei_futex_waitv { /* the kernel's struct futex_waitv (Linux >= 5.16) */
    uint64_t val;
    uint64_t uaddr;
    uint32_t flags;
    uint32_t reserved;
};

/* Anything whose readiness can be waited for: a doorbell, a waiter counter and a predicate. */
typedef struct ei_waitable {
    _Atomic uint32_t *doorbell; /* borrowed: futex word in a shared header */
    _Atomic uint32_t *waiters;  /* borrowed: waiter counter in the same header */
    int (*ready)(const void *); /* true when the caller has something to do */
    const void *obj;            /* borrowed: argument of ready() */
} ei_waitable;

static inline int ei__frame_ready_cb(const void *c) { return ei_frame_consumer_ready((const ei_frame_consumer *)c); }

static inline ei_waitable ei_frame_waitable(ei_frame_consumer *c) {
    ei_waitable w = {&c->hdr->doorbell, &c->hdr->waiters, ei__frame_ready_cb, c};
    return w;
}

static inline uint64_t ei__ready_mask(const ei_waitable *w, uint32_t n) {
    uint64_t mask = 0;
    for (uint32_t i = 0; i < n; i++)
        if (w[i].ready(w[i].obj)) mask |= 1ull << i;
    return mask;
}

/* Waits until at least one of w[0..n) is ready, at most timeout_ns, first
 * spinning up to spin_ns. Returns a bitmask of the ready ones (0 = timed out).
 * use_waitv = 0 forces the fallback (per-ring timed waits in 1 ms slices),
 * which is also used automatically when the kernel lacks futex_waitv. */
static inline uint64_t ei_wait_any(const ei_waitable *w, uint32_t n, uint64_t timeout_ns, uint64_t spin_ns,
                                   int use_waitv) {
    static _Atomic int waitv_missing = 0;
    if (n == 0 || n > EI_MAX_WAIT) return 0;
    uint64_t mask = ei__ready_mask(w, n);
    if (mask) return mask;
    uint64_t now = ei_now_ns(CLOCK_MONOTONIC);
    const uint64_t deadline = now + timeout_ns;
    if (spin_ns) {
        const uint64_t spin_end = now + (spin_ns < timeout_ns ? spin_ns : timeout_ns);
        while (!(mask = ei__ready_mask(w, n))) {
            ei_cpu_relax();
            if (ei_now_ns(CLOCK_MONOTONIC) >= spin_end) break;
        }
        if (mask) return mask;
    }
    struct ei_futex_waitv fw[EI_MAX_WAIT];
    uint32_t bell[EI_MAX_WAIT];
    for (;;) {
        /* Dekker with the producer: count ourselves as waiting, read the bells, re-check. */
        for (uint32_t i = 0; i < n; i++) atomic_fetch_add(w[i].waiters, 1);
        for (uint32_t i = 0; i < n; i++) bell[i] = atomic_load(w[i].doorbell);
        mask = ei__ready_mask(w, n);
        now = ei_now_ns(CLOCK_MONOTONIC);
        if (!mask && now < deadline) {
            if (n == 1) {
                ei_futex_wait(w[0].doorbell, bell[0], deadline - now);
            } else if (use_waitv && !atomic_load_explicit(&waitv_missing, memory_order_relaxed)) {
                for (uint32_t i = 0; i < n; i++) {
                    fw[i].val = bell[i];
                    fw[i].uaddr = (uint64_t)(uintptr_t)w[i].doorbell;
                    fw[i].flags = FUTEX2_SIZE_U32; /* shared: no FUTEX2_PRIVATE */
                    fw[i].reserved = 0;
                }
                struct timespec ts = {(time_t)(deadline / 1000000000ull), (long)(deadline % 1000000000ull)};
                if (syscall(SYS_futex_waitv, fw, n, 0, &ts, CLOCK_MONOTONIC) < 0 && errno == ENOSYS)
                    atomic_store_explicit(&waitv_missing, 1, memory_order_relaxed);
            } else {
                /* Fallback: sleep on each ring in turn for a short slice. */
                uint64_t slice = 1000000ull / n + 1;
                for (uint32_t i = 0; i < n && !ei__ready_mask(w, n); i++)
                    ei_futex_wait(w[i].doorbell, bell[i], slice);
            }
        }
        for (uint32_t i = 0; i < n; i++) atomic_fetch_sub(w[i].waiters, 1);
        if (mask) return mask;
        mask = ei__ready_mask(w, n);
        if (mask || ei_now_ns(CLOCK_MONOTONIC) >= deadline) return mask;
    }
}

/* ------------------------------------------------------------------ */
/* Result ring: one writer, any number of readers (seqlock per record) */
/* ------------------------------------------------------------------ */

typedef struct ei_result_layout {
    uint64_t total_size;
    uint64_t record_stride;
    uint64_t payload_capacity;
    uint32_t record_count;
} ei_result_layout;

static inline int ei_result_layout_make(uint32_t record_count, uint64_t payload_capacity, ei_result_layout *out,
                                        const char *name, ei_error *err) {
    if (record_count < EI_MIN_RECORDS || record_count > EI_MAX_RECORDS)
        return ei_fail(err, EI_ERR_ARG, 0, "%s: %u records; need %u..%u", name, record_count, EI_MIN_RECORDS,
                       EI_MAX_RECORDS);
    if (payload_capacity > EI_MAX_PAYLOAD)
        return ei_fail(err, EI_ERR_ARG, 0, "%s: payload capacity %llu too large", name,
                       (unsigned long long)payload_capacity);
    out->record_count = record_count;
    out->payload_capacity = ei_align_up(payload_capacity);
    out->record_stride = EI_RECORD_HEADER_SIZE + out->payload_capacity;
    out->total_size = EI_HEADER_SIZE + (uint64_t)record_count * out->record_stride;
    return EI_OK;
}

static inline int ei_result_ring_check(const void *base, uint64_t file_size, const char *name,
                                       ei_result_layout *out, ei_error *err) {
    if (file_size < EI_HEADER_SIZE)
        return ei_fail(err, EI_ERR_TRUNCATED, 0, "%s: %llu bytes, smaller than the %u-byte header", name,
                       (unsigned long long)file_size, EI_HEADER_SIZE);
    ei_result_ring_header h;
    memcpy(&h, base, offsetof(ei_result_ring_header, head));
    if (memcmp(h.magic, EI_RESULT_MAGIC, 8) != 0) {
        if (memcmp(h.magic, EI_FRAME_MAGIC, 8) == 0)
            return ei_fail(err, EI_ERR_MAGIC, 0, "%s: is a frame ring, not a result ring", name);
        return ei_fail(err, EI_ERR_MAGIC, 0, "%s: not an edgeinfer result ring (bad magic)", name);
    }
    if (h.abi_version != EI_ABI_VERSION)
        return ei_fail(err, EI_ERR_ABI, 0, "%s: ABI version %u, this build understands %u", name, h.abi_version,
                       EI_ABI_VERSION);
    ei_error sub;
    if (h.header_size != EI_HEADER_SIZE || h.record_header_size != EI_RECORD_HEADER_SIZE ||
        ei_result_layout_make(h.record_count, h.payload_capacity, out, name, &sub) != EI_OK ||
        out->payload_capacity != h.payload_capacity || out->record_stride != h.record_stride ||
        out->total_size != h.total_size)
        return ei_fail(err, EI_ERR_GEOMETRY, 0, "%s: inconsistent result ring geometry (%u records of %llu bytes)",
                       name, h.record_count, (unsigned long long)h.record_stride);
    if (file_size < out->total_size)
        return ei_fail(err, EI_ERR_TRUNCATED, 0, "%s: file is %llu bytes, its geometry needs %llu", name,
                       (unsigned long long)file_size, (unsigned long long)out->total_size);
    return EI_OK;
}

static inline ei_result_record_header *ei_result_record(uint8_t *base, const ei_result_layout *l, uint64_t n) {
    return (ei_result_record_header *)(base + EI_HEADER_SIZE + ((n - 1) % l->record_count) * l->record_stride);
}

typedef struct ei_result_writer {
    int fd;                     /* owns: segment fd, holding the writer lock */
    uint8_t *base;              /* owns: read-write mapping */
    ei_result_ring_header *hdr; /* borrowed: == base */
    ei_result_layout layout;    /* what we created */
    uint64_t head;              /* number of our last record; private, never read back */
    char path[PATH_MAX];
} ei_result_writer;

static inline int ei_result_writer_open(ei_result_writer *wr, const char *dir, const char *name,
                                        uint32_t record_count, uint64_t payload_capacity, unsigned mode, long gid,
                                        ei_error *err) {
    memset(wr, 0, sizeof *wr);
    wr->fd = -1;
    ei_result_layout l;
    int rc = ei_result_layout_make(record_count, payload_capacity, &l, name, err);
    if (rc) return rc;
    if (mode & S_IWOTH) return ei_fail(err, EI_ERR_ARG, 0, "%s: refusing a world-writable mode %04o", name, mode);
    ei_new_segment s;
    rc = ei__segment_begin(&s, dir, name, l.total_size, mode, gid, offsetof(ei_result_ring_header, generation), err);
    if (rc) return rc;
    ei_result_ring_header *h = (ei_result_ring_header *)s.base;
    memcpy(h->magic, EI_RESULT_MAGIC, 8);
    h->abi_version = EI_ABI_VERSION;
    h->header_size = EI_HEADER_SIZE;
    h->total_size = l.total_size;
    h->record_count = l.record_count;
    h->record_header_size = EI_RECORD_HEADER_SIZE;
    h->record_stride = l.record_stride;
    h->payload_capacity = l.payload_capacity;
    atomic_store(&h->writer_pid, (uint32_t)getpid());
    atomic_store(&h->generation, s.generation);
    rc = ei__segment_commit(&s, name, offsetof(ei_result_ring_header, flags), offsetof(ei_result_ring_header, doorbell),
                            err);
    if (rc) return rc;
    wr->fd = s.fd;
    wr->base = s.base;
    wr->hdr = h;
    wr->layout = l;
    memcpy(wr->path, s.path, sizeof wr->path);
    return EI_OK;
}

/* Opens the next record for writing: marks it busy (odd seqlock) and returns
 * its header; the caller fills header fields and payload, then commits. */
static inline ei_result_record_header *ei_result_writer_begin(ei_result_writer *wr) {
    uint64_t n = wr->head + 1;
    ei_result_record_header *r = ei_result_record(wr->base, &wr->layout, n);
    atomic_store_explicit(&r->seqlock, n << 1 | 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release); /* the odd mark is visible before any body store */
    return r;
}

static inline uint8_t *ei_result_payload(ei_result_record_header *r) { return (uint8_t *)r + EI_RECORD_HEADER_SIZE; }

static inline uint64_t ei_result_writer_commit(ei_result_writer *wr, ei_result_record_header *r) {
    uint64_t n = ++wr->head;
    if (r->payload_len > wr->layout.payload_capacity) r->payload_len = (uint32_t)wr->layout.payload_capacity;
    atomic_store_explicit(&r->seqlock, n << 1, memory_order_release);
    atomic_store(&wr->hdr->head, n);
    atomic_fetch_add(&wr->hdr->doorbell, 1);
    if (atomic_load(&wr->hdr->waiters)) ei_futex_wake(&wr->hdr->doorbell);
    return n;
}

static inline void ei_result_writer_retire(ei_result_writer *wr, int unlink_name) {
    if (wr->base) ei__segment_retire(wr->fd, wr->path, &wr->hdr->flags, &wr->hdr->doorbell, unlink_name);
}

static inline void ei_result_writer_close(ei_result_writer *wr, int unlink_name) {
    if (!wr->base) return;
    ei_result_writer_retire(wr, unlink_name);
    munmap(wr->base, wr->layout.total_size);
    close(wr->fd);
    wr->base = NULL;
    wr->hdr = NULL;
    wr->fd = -1;
}

typedef struct ei_result_reader {
    uint8_t *base;              /* borrowed: mapping owned by the caller (header RW, records read-only) */
    ei_result_ring_header *hdr; /* borrowed: == base */
    ei_result_layout layout;    /* private validated copy */
    uint64_t next;              /* number of the next record to read */
    uint64_t missed;            /* records overwritten before we read them, in total */
    uint32_t seen_flags;        /* ring flags already reported */
} ei_result_reader;

static inline int ei__result_check_cb(const void *base, uint64_t size, const char *name, void *l, ei_error *err) {
    return ei_result_ring_check(base, size, name, (ei_result_layout *)l, err);
}

/* Opens, checks ownership, maps and validates a result ring. from_oldest: start
 * at the oldest record still held, else at the next one written. On success
 * the caller owns m->fd and m->base (munmap/close). */
static inline int ei_result_reader_open(ei_result_reader *rd, ei_mapped *m, const char *dir, const char *name,
                                        const uint32_t *allowed_uids, size_t n_allowed, int from_oldest,
                                        ei_error *err) {
    memset(rd, 0, sizeof *rd);
    int rc = ei__map_existing(m, dir, name, allowed_uids, n_allowed, ei__result_check_cb, &rd->layout, err);
    if (rc) return rc;
    rd->base = m->base;
    rd->hdr = (ei_result_ring_header *)m->base;
    uint64_t head = atomic_load(&rd->hdr->head);
    uint64_t oldest = head > rd->layout.record_count ? head - rd->layout.record_count + 1 : 1;
    rd->next = from_oldest ? oldest : head + 1;
    return EI_OK;
}

static inline int ei_result_reader_ready(const ei_result_reader *rd) {
    return atomic_load_explicit(&rd->hdr->head, memory_order_acquire) >= rd->next ||
           atomic_load_explicit(&rd->hdr->flags, memory_order_acquire) != rd->seen_flags;
}

static inline int ei__result_ready_cb(const void *r) { return ei_result_reader_ready((const ei_result_reader *)r); }

static inline ei_waitable ei_result_waitable(ei_result_reader *rd) {
    ei_waitable w = {&rd->hdr->doorbell, &rd->hdr->waiters, ei__result_ready_cb, rd};
    return w;
}

/* Record numbers above this cannot be honest: the seqlock word holds n << 1. */
#define EI_MAX_RECORD_NUMBER (UINT64_C(1) << 62)

/* Copies the next record (header + payload_len bytes of payload) into hdr_out
 * and payload_out (payload_cap bytes). Returns 1 when a record was copied, 0
 * when none is available yet (or the writer overwrote every candidate while we
 * looked: call again), -1 when `head` is corrupt. *missed_out gets how many
 * records were overwritten before this one could be read (also added to
 * rd->missed). Bounded: a writer can make it return 0, never spin forever. */
static inline int ei_result_reader_next(ei_result_reader *rd, ei_result_record_header *hdr_out, uint8_t *payload_out,
                                        uint64_t payload_cap, uint64_t *missed_out) {
    *missed_out = 0;
    for (uint64_t tries = 0; tries <= (uint64_t)rd->layout.record_count + 2; tries++) {
        uint64_t head = atomic_load_explicit(&rd->hdr->head, memory_order_acquire);
        if (head > EI_MAX_RECORD_NUMBER) return -1;
        if (head < rd->next) return 0;
        /* Records older than head - count + 2 may be mid-overwrite: skip ahead. */
        if (head - rd->next + 1 >= rd->layout.record_count) {
            uint64_t skip_to = head - rd->layout.record_count + 2;
            *missed_out += skip_to - rd->next;
            rd->missed += skip_to - rd->next;
            rd->next = skip_to;
        }
        uint64_t n = rd->next;
        ei_result_record_header *r = ei_result_record(rd->base, &rd->layout, n);
        uint64_t s1 = atomic_load_explicit(&r->seqlock, memory_order_acquire);
        if (s1 != n << 1) {
            /* Head says n is complete, so a different word means a newer lap overwrote it. */
            *missed_out += 1;
            rd->missed += 1;
            rd->next = n + 1;
            continue;
        }
        memcpy(hdr_out, r, sizeof *hdr_out);
        uint64_t len = hdr_out->payload_len;
        if (len > rd->layout.payload_capacity) len = rd->layout.payload_capacity;
        if (len > payload_cap) len = payload_cap;
        memcpy(payload_out, ei_result_payload(r), len);
        atomic_thread_fence(memory_order_acquire); /* copies complete before the re-check */
        uint64_t s2 = atomic_load_explicit(&r->seqlock, memory_order_relaxed);
        if (s2 != s1) continue; /* overwritten while copying: retry, the lap check counts it */
        hdr_out->payload_len = (uint32_t)len;
        rd->next = n + 1;
        return 1;
    }
    return 0;
}

#endif /* EDGEINFER_RING_H */
