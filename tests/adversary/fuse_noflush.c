/* A FUSE file system whose server never answers FLUSH (issue 35, item 12): every close() of a file on it blocks
 * until the server answers or dies (the kernel waits uninterruptibly once the server has read the request).
 *
 * It speaks the kernel's protocol on /dev/fuse itself (no libfuse): one regular file, "f", mode 0666, empty;
 * INIT, LOOKUP, GETATTR, OPEN, READ, RELEASE answered; FLUSH read and never answered (printed as FLUSH=<n>);
 * anything else ENOSYS. Mounted with allow_other, so another user can open the file. Mounting needs
 * CAP_SYS_ADMIN here (on Debian fusermount3 does it for any user, /dev/fuse being 0666 there). Its death aborts
 * the connection: every close waiting on a FLUSH returns.
 *
 * usage: fuse_noflush MOUNTPOINT   (prints READY once mounted; runs until killed) */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/fuse.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

static int dev;

static void reply(uint64_t unique, int error, const void *body, size_t len) {
    struct fuse_out_header h = {.len = sizeof h + (error ? 0 : len), .error = error, .unique = unique};
    char buf[sizeof h + 4096];
    memcpy(buf, &h, sizeof h);
    if (!error && len) memcpy(buf + sizeof h, body, len);
    if (write(dev, buf, h.len) < 0 && errno != ENOENT) perror("write /dev/fuse");
}

static void attr_of(uint64_t node, struct fuse_attr *a) {
    memset(a, 0, sizeof *a);
    a->ino = node;
    a->mode = node == FUSE_ROOT_ID ? (S_IFDIR | 0755) : (S_IFREG | 0666);
    a->nlink = node == FUSE_ROOT_ID ? 2 : 1;
    a->blksize = 4096;
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: fuse_noflush MOUNTPOINT\n"); return 2; }
    dev = open("/dev/fuse", O_RDWR | O_CLOEXEC);
    if (dev < 0) { perror("/dev/fuse"); return 2; }
    char opts[256];
    snprintf(opts, sizeof opts, "fd=%d,rootmode=40000,user_id=0,group_id=0,allow_other", dev);
    if (mount("fuse-noflush", argv[1], "fuse", MS_NOSUID | MS_NODEV, opts)) { perror("mount"); return 2; }
    static char buf[FUSE_MIN_READ_BUFFER + 65536];
    int flushes = 0, ready = 0;
    for (;;) {
        ssize_t n = read(dev, buf, sizeof buf);
        if (n < 0) {
            if (errno == EINTR || errno == ENOENT) continue;
            if (errno == ENODEV) return 0; /* unmounted */
            perror("read /dev/fuse");
            return 2;
        }
        struct fuse_in_header *in = (struct fuse_in_header *)buf;
        void *arg = buf + sizeof *in;
        switch (in->opcode) {
        case FUSE_INIT: {
            struct fuse_init_in *ii = arg;
            struct fuse_init_out o = {.major = FUSE_KERNEL_VERSION, .minor = FUSE_KERNEL_MINOR_VERSION,
                                      .max_readahead = ii->max_readahead, .max_write = 4096};
            if (ii->minor < o.minor) o.minor = ii->minor;
            reply(in->unique, 0, &o, sizeof o);
            if (!ready++) { printf("READY\n"); fflush(stdout); }
            break;
        }
        case FUSE_LOOKUP: {
            if (in->nodeid != FUSE_ROOT_ID || strcmp((char *)arg, "f")) { reply(in->unique, -ENOENT, NULL, 0); break; }
            struct fuse_entry_out e = {.nodeid = 2, .generation = 1};
            attr_of(2, &e.attr);
            reply(in->unique, 0, &e, sizeof e);
            break;
        }
        case FUSE_GETATTR: {
            struct fuse_attr_out a = {0};
            attr_of(in->nodeid, &a.attr);
            reply(in->unique, 0, &a, sizeof a);
            break;
        }
        case FUSE_OPEN: case FUSE_OPENDIR: {
            struct fuse_open_out o = {.fh = 1};
            reply(in->unique, 0, &o, sizeof o);
            break;
        }
        case FUSE_READ:
            reply(in->unique, 0, NULL, 0);
            break;
        case FUSE_RELEASE: case FUSE_RELEASEDIR:
            reply(in->unique, 0, NULL, 0);
            break;
        case FUSE_FLUSH: /* read, never answered */
            printf("FLUSH=%d\n", ++flushes);
            fflush(stdout);
            break;
        case FUSE_FORGET: case FUSE_BATCH_FORGET: case FUSE_INTERRUPT:
            break; /* no answer expected (an interrupted FLUSH stays unanswered too) */
        case FUSE_DESTROY:
            reply(in->unique, 0, NULL, 0);
            return 0;
        default:
            reply(in->unique, -ENOSYS, NULL, 0);
        }
    }
}
