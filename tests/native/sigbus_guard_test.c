/* The SIGBUS guard's mechanism on its own (native/sigbus_guard.h): a guarded mapping of a
 * file that shrinks under it reads zeros instead of killing the process, and is marked hit.
 * Usage: sigbus_guard_test SCRATCH_FILE. Prints "absorbed hit=1 hits=1 byte=0". */
#include "sigbus_guard.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ftruncate(fd, 16384) != 0) return 3;
    volatile unsigned char *m = mmap(NULL, 16384, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) return 4;
    m[8192] = 7;
    int idx = ei_guard_add((void *)m, 16384);
    if (idx < 0) return 5;
    if (ftruncate(fd, 4096) != 0) return 6; /* pages 1..3 are gone: a read of them would SIGBUS */
    unsigned char byte = m[8192];           /* absorbed: the handler mapped zeros over the rest */
    printf("absorbed hit=%d hits=%llu byte=%u\n", ei_guard_hit(idx), (unsigned long long)ei_guard_hits(), byte);
    ei_guard_remove(idx);
    unlink(argv[1]);
    return 0;
}
